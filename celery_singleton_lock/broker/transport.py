"""kombu's Redis transport with a singleton dispatch's hold taken in its message's push.

A unique dispatch costs what plain Celery's does: one round trip, a script that takes the hold
and pushes the message together (``broker.pushes``), or pushes nothing for a duplicate.
There is no moment with a hold and no message, nor a message and no hold.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, cast
from urllib.parse import urlsplit

from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

from ..config.settings import broker_write_url
from ..lease import Server, server_of
from ..lease.errors import is_refusal
from ..lease.redis.pipelining import Pipelining
from ..lease.redis.servers import server_named
from . import versions
from .bookkeeping import load_record
from .layout import message_task_id
from .pushes import Push
from .state import AppRide, Outgoing
from .transit import NOTED_PROPERTY, PUSH, PUSH_SHA, Transit, keys_of
from .unacked import QoS

if TYPE_CHECKING:
    from celery import Celery

    from ..lease.redis.clients import SyncClient

logger = logging.getLogger(__name__)


class PublishBatch(Protocol):
    """kombu's publish batch (kombu >= 5.7, ``Producer.batch()``): the commands of the
    message being put, added to its pipeline."""

    def add(self, name: str, /, *args: object) -> None: ...


class Client(Protocol):
    """What a channel reads of the redis-py client it keeps (``Channel.conn_or_acquire``)."""

    connection_pool: object


TRANSPORT = "celery_singleton_lock.broker:RedisTransport"
SENTINEL_TRANSPORT = "celery_singleton_lock.broker:SentinelTransport"


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; a message with a hold to take is pushed by the hold's script,
    and a received one's take rides its unacked bookkeeping (``QoS``).

    ``_put``, ``_put_fanout`` and ``_purge`` are overridden. Taking the hold in the push
    means a producer killed between the two cannot leave a hold with no message for
    ``queue_ttl``. Every singleton call's message is noted in transit as it is pushed
    (``broker.transit``): by the hold's script, or, with no hold riding (a lock store
    on another server, a mode without a dispatch hold), by a script that replaces kombu's
    LPUSH in the same one round trip (in kombu's publish batch, in its pipeline). Every
    other message (other tasks, canvas, fanout) is put as kombu puts it. Received
    messages are recorded by ``unacked.QoS``."""

    QoS = QoS
    _singleton_server: Server | None = None
    _singleton_client: Client | None = None
    _singleton_pipelining: Pipelining | None = None
    _singleton_records = False  # the record's script loaded for the kept pipelining
    # A kombu batch's noted pushes (``_batch_noted``): whether this channel's user may
    # write the notes (None: not asked yet), and the batch the push's script was loaded in.
    _singleton_batch_notes: bool | None = None
    _singleton_loaded_in: weakref.ref[PublishBatch] | None = None

    @contextmanager
    def conn_or_acquire(self, client: Client | None = None) -> Iterator[Client]:
        """kombu's, with one client per channel and pool: kombu builds a ``redis.Redis``
        for every call, and building one (its table of reply callbacks) costs more CPU
        than the LPUSH it sends. A client takes a connection from the pool per command,
        so one serves every call as well as many would."""
        if client:
            yield client
            return
        pool = self.pool
        kept = self._singleton_client
        if kept is None or kept.connection_pool is not pool:
            kept = self._singleton_client = self._create_client()
        yield kept

    def pipelining(self, *, records: bool = False) -> Pipelining | None:
        """Our own commands on the kept client's connections (a noted push; kombu's
        unacked bookkeeping as one script a step: ``bookkeeping``); None where the client
        is not one redis-py lets us drive (every command then goes kombu's way).
        ``records``: for the bookkeeping, whose script is cached on the server before the
        first record (``load_record``); a producer's push needs none of it."""
        with self.conn_or_acquire() as acquired:
            client = cast("SyncClient", acquired)  # kombu's: a redis.Redis
            kept = self._singleton_pipelining
            if kept is None or kept.client is not client:
                kept = self._singleton_pipelining = Pipelining(client)
                self._singleton_records = False
            if records and kept.direct and not self._singleton_records:
                load_record(client)
                self._singleton_records = True
        return kept if kept.direct else None

    def ride(self) -> AppRide | None:
        """The ride of the app whose transport opened this channel (None: none, or
        turned off by the worker's self-check): what it may ride beyond kombu's own."""
        transport = self.connection
        ride = transport.ride if isinstance(transport, Riding) else None
        return None if ride is None or ride.turned_off is not None else ride

    def _put(self, queue: str, message: dict[str, object], **kwargs: object) -> None:
        ride = self.ride()  # not None: the transport is ``Riding``, with ``outgoing``
        # kombu's Producer.batch(): the message's commands go in its pipeline.
        batch = cast("PublishBatch | None", kwargs.get("_publish_batch"))
        outgoing: Outgoing | None = None if ride is None else self.connection.outgoing
        if ride is None or outgoing is None or not outgoing.rides():
            super()._put(queue, message, **kwargs)  # any other task's, or canvas's
            return
        task_id = message_task_id(message)
        # No hold rides a message in kombu's batch: its dispatch takes it apart.
        hold = None if batch is not None else outgoing.take_hold(task_id)
        notes = outgoing.take_note_source(task_id)
        if hold is None and notes is None:
            super()._put(queue, message, **kwargs)
            return
        prefix = self.global_keyprefix or ""
        priority = self._get_message_priority(message, reverse=False)
        expire = None
        # Queues declared with x-expires (kombu >= 5.5 keeps them here): pushed and
        # expired in one step, as kombu's own put does in its pipeline.
        expires: Mapping[str, int] = getattr(self, "_expires", None) or {}
        if queue in expires:
            steps = tuple(prefix + self._q_for_pri(queue, step) for step in self.priority_steps)
            expire = (steps, int(expires[queue]))
        server = self.server()
        properties = message.get("properties")
        tag = properties.get("delivery_tag") if isinstance(properties, Mapping) else None
        note = None
        if tag and notes is not None and ride.notes_allowed:
            note = notes.note(str(tag))
        if note is not None and isinstance(properties, dict):
            properties[NOTED_PROPERTY] = note.prefix  # its receipt clears the note there
        push = Push(
            prefix + self._q_for_pri(queue, priority),
            dumps(message),
            db=None if server is None else server.db,
            expire=expire,
            note=note,  # noted in transit until received (broker.transit)
        )
        if hold is not None and hold.put(server, push):
            return
        if push.note is not None:
            if batch is not None:
                if self._batch_noted(push, ride, batch):
                    return
            elif self._push_noted(push, ride):
                return
        super()._put(queue, message, **kwargs)

    def _push_noted(self, push: Push, ride: AppRide) -> bool:
        """Push with its note in one round trip, as kombu's push is one (False: the
        broker refused the note; kombu pushes, and nothing is noted from now on)."""
        assert push.note is not None  # noqa: S101  (the caller checked)
        with self.conn_or_acquire() as client:
            try:
                Transit(client, push.note.prefix).push(
                    push.key, push.payload, push.note, push.expire, via=self.pipelining()
                )
            except Exception as error:
                if not is_refusal(error, "NOPERM"):
                    raise
                ride.notes_allowed = False
                logger.warning(
                    "the broker's user may not write the lock prefix's notes (%s): messages "
                    "lost in transit are not pushed again",
                    error,
                )
                return False
        return True

    def _batch_noted(self, push: Push, ride: AppRide, batch: PublishBatch) -> bool:
        """Add the push with its note to kombu's publish batch, the noted push's script in
        place of kombu's LPUSH in the same pipeline (False: not noted, kombu adds its own:
        a key prefix kombu's pipeline would add again, or a user that may not write notes).
        """
        note = push.note
        assert note is not None  # noqa: S101  (the caller checked)
        if self.global_keyprefix or not self._notes_writable(ride, note.prefix):
            return False
        loaded = self._singleton_loaded_in
        if loaded is None or loaded() is not batch:
            # Loaded first in the same pipeline: a server that lost its scripts (a restart)
            # still runs every push, where NOSCRIPT would leave the batch's delivery uncertain.
            batch.add("script_load", PUSH)
            self._singleton_loaded_in = weakref.ref(batch)
        lists, ms = push.expire if push.expire is not None else ((), "")
        keys = [push.key, *keys_of(note.prefix), *lists]
        batch.add("evalsha", PUSH_SHA, len(keys), *keys, push.payload, ms, note.spec())
        return True

    def _notes_writable(self, ride: AppRide, prefix: str) -> bool:
        """Whether this channel's user may write the notes, asked once a channel before
        its first noted push in a batch: a command the server refuses in kombu's pipeline
        would leave the whole batch's delivery uncertain, not push that one apart."""
        if self._singleton_batch_notes is None and ride.notes_allowed:
            with self.conn_or_acquire() as acquired:
                try:
                    cast("SyncClient", acquired).exists(*keys_of(prefix))
                except Exception as error:
                    if not is_refusal(error, "NOPERM"):
                        raise
                    ride.notes_allowed = False
                    logger.warning(
                        "the broker's user may not write the lock prefix's notes (%s): "
                        "messages lost in transit are not pushed again",
                        error,
                    )
            self._singleton_batch_notes = ride.notes_allowed
        return bool(self._singleton_batch_notes) and ride.notes_allowed

    def _put_fanout(
        self, exchange: str, message: dict[str, object], routing_key: str, **kwargs: object
    ) -> None:
        outgoing: Outgoing | None = self.connection.outgoing if self.ride() is not None else None
        hold = None if outgoing is None else outgoing.take_hold(message_task_id(message))
        if hold is not None:
            hold.put(None, None)  # published to subscribers, not pushed: the hold alone
        super()._put_fanout(exchange, message, routing_key, **kwargs)

    def _purge(self, queue: str) -> int:
        size: int = super()._purge(queue)
        ride = self.ride()
        purges = None if ride is None else ride.purges
        if purges is not None:
            prefix = self.global_keyprefix or ""
            lists = [prefix + self._q_for_pri(queue, step) for step in self.priority_steps]
            with self.conn_or_acquire() as client:
                try:
                    purges(client, lists)
                except Exception:
                    logger.exception("celery-singleton-lock: purged holds not given up")
        return size

    def server(self) -> Server | None:
        """Where this channel pushes (None: not one standalone server)."""
        if self._singleton_server is None:
            self._singleton_server = server_of(self.client)
        return self._singleton_server


class Riding:
    """What a transport of an app that rides keeps: the app's ride, and what rides the
    message being published on its connection (``connection.publishing``)."""

    # The app's ride: set on the app's own subclass (``connection.for_app``); None on
    # the classes here, which then put every message as kombu puts it.
    ride: AppRide | None = None

    @functools.cached_property
    def outgoing(self) -> Outgoing:
        return Outgoing()


class RedisTransport(Riding, kombu_redis.Transport):
    """kombu's Redis transport with ``Channel``: ``broker_transport`` names it.

    An app that rides (``broker.install``) resolves kombu's Redis and Sentinel transports
    to ``RedisTransport`` and ``SentinelTransport``, which behave exactly as kombu's own
    for any message without a hold to take; a transport the app names
    (``broker_transport``) is kept."""

    # Named by hand (``broker_transport``) outside the tested releases: kombu's own.
    Channel = Channel if versions.TESTED_HERE else kombu_redis.Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (its master looked up through the sentinels), with the
    hold and the take riding as on ``Channel``: a lock store on the same master (same
    service, same sentinels) shares its round trips."""


class SentinelTransport(Riding, kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with ``SentinelChannel``."""

    Channel = SentinelChannel if versions.TESTED_HERE else kombu_redis.SentinelChannel


def rides(channel: object, server: Server) -> bool:
    """Whether a message published on ``channel`` can take its hold, on ``server``, in
    the script that pushes it: the channel is this transport's, on that very server."""
    if not isinstance(channel, Channel) or channel.ride() is None:
        return False
    own = channel.server()
    return own is not None and own.same_server(server)


# kombu's own Redis transports, and what replaces them for an app that rides.
REPLACED: dict[type, type[Riding]] = {
    kombu_redis.Transport: RedisTransport,
    kombu_redis.SentinelTransport: SentinelTransport,
}


@functools.lru_cache(maxsize=64)  # asked on every dispatch, of one URL and server
def may_ride(url: str, server: Server) -> bool:
    """Whether the broker ``url`` names ``server`` (the lock store's): a look that costs
    no producer, before the channel that would push is asked (``rides``). True when the
    URL cannot say (the channel decides)."""
    scheme = urlsplit(url).scheme
    if scheme == "sentinel":
        return True  # a master found through its sentinels: the channel compares
    if scheme not in ("redis", "rediss", "redis+socket"):
        return False  # not kombu's Redis transport
    named = server_named(url)
    return named is None or named.same_server(server)


def missed_ride(app: Celery, store: Server, *, enabled: bool) -> str | None:
    """Why a dispatch of ``app`` takes its hold apart from its message's push although
    the lock store (at ``store``) is the broker's server; None when it rides or cannot
    be compared (``enabled``: ``singleton_lock_ride_broker``)."""
    if not may_ride(broker_write_url(app.conf), store):
        return None
    with app.connection_for_write() as connection:  # no I/O: the class it would use
        transport = connection.get_transport_cls()
    if enabled and issubclass(transport, RedisTransport | SentinelTransport):
        return None
    how = (
        "singleton_lock_ride_broker is False"
        if not enabled
        else f"its broker transport is {transport.__module__}.{transport.__qualname__}"
    )
    return (
        f"the lock store is the broker's Redis but {how}: each dispatch takes its hold in a "
        "round trip of its own, and a producer killed between hold and push leaves a hold "
        f"with no message for queue_ttl. Use broker_transport = {TRANSPORT!r} "
        f"({SENTINEL_TRANSPORT!r} for a Sentinel broker), or a subclass of it, and leave "
        "singleton_lock_ride_broker at True"
    )


__all__ = [
    "REPLACED",
    "TRANSPORT",
    "Channel",
    "RedisTransport",
    "Riding",
    "SentinelChannel",
    "SentinelTransport",
    "may_ride",
    "rides",
]
