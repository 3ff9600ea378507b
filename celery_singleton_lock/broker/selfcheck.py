"""A worker's check, as it starts, that kombu still reads what the ride writes: one probe.

The contract tests pin kombu's layout on the releases CI runs; this checks the release the
worker actually runs on, with its own settings (``global_keyprefix``, priorities). Any
difference turns the ride off for the process (``broker.turn_off``), with an ERROR.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from ..lease import Lease, LockStore
from . import layout
from .connection import publishing
from .pushes import Push, PushRefused, pushes_of
from .transit import Note, Transit
from .transport import Channel

if TYPE_CHECKING:
    from celery import Celery

# The lock name of the hold the push probe takes (and gives back at once), and how long
# its list may stay if it is not deleted.
PUSH_PROBE = "celery-singleton-lock-push-probe"
PROBE_MS = 60_000

# How long a probe's note may stay: the sweep forgets it (its hold never existed).
NOTE_SECONDS = 60.0


class _Probe:
    """One probe message, noted in transit as its channel pushes it (``NoteSource``)."""

    def __init__(self, prefix: str) -> None:
        self.task_id = f"celery-singleton-lock-probe-{uuid.uuid4().hex}"
        self.prefix = prefix

    def note(self, member: str) -> Note:
        return Note(member, "probe", self.task_id, 1.0, NOTE_SECONDS, self.prefix)


def differences(app: Celery, prefix: str) -> str | None:
    """What differs between the ride and kombu on ``app``'s broker (None: nothing, or
    the broker is not ridden here). ``prefix``: the lock prefix the probe is noted under.

    Three probe messages (two on one priority's list, one on another) go out through the
    riding channel's push (``basic_publish`` to a queue of their own under the lock
    prefix, noted in transit as a singleton call's message is) and come back through
    kombu's own consumer path (``basic_get``, which records each as unacked in the riding
    bookkeeping, ``bookkeeping``). The check wants: each message back, in the order pushed;
    kombu's unacked hash holding it under its delivery tag as ``[message, exchange, routing
    key]`` (what the transit sweep and the orphan check read) and its index the tag (what
    kombu's restore reads); and gone from both once acked. With the
    ride turned off on a difference, every lock operation takes its own round trip. The
    probe leaves nothing behind: its lists, its notes and its unacked entries go with it."""
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1)
        channel = connection.default_channel
        if not isinstance(channel, Channel) or channel.ride() is None:
            return None
        return _probe(connection, channel, prefix)


def push_refused(app: Celery, store: LockStore, prefix: str) -> str | None:
    """Why the lock store's user may not take a dispatch's hold in the push of its message
    into the broker's database (an ACL without the queue's keys, or without that database:
    Valkey 9.1's per-database ACL); None when it may, or nothing rides the push here.

    One probe hold pushed with a probe message to a list of its own, both removed after;
    a refusal leaves the store's pushes off (``PushRefused``), so the holds go alone."""
    pushes = pushes_of(store)
    if pushes is None:
        return None
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1)
        channel = connection.default_channel
        server = channel.server() if isinstance(channel, Channel) else None
        if server is None or channel.ride() is None or not server.same_server(pushes.server):
            return None
        probe = uuid.uuid4().hex  # a name of its own: workers starting together each ask
        key = f"{layout.prefix_of(channel)}{prefix}:probe.{probe}"
        # The probe list expires by itself: nothing is left whoever may delete it.
        push = Push(key, "probe", db=server.db, expire=((key,), PROBE_MS))
        try:
            held = pushes.hold_and_push(f"{PUSH_PROBE}.{probe}", 1.0, push, token=probe)
        except PushRefused as refused:
            return str(refused)
        layout.plain_client(channel).delete(key)
        if isinstance(held, Lease):
            store.release(held)
        return None


def _probe(connection: object, channel: Channel, prefix: str) -> str | None:
    # Under the lock prefix: an ACL user allowed the lock's keys may write it.
    queue = f"{prefix}:probe.{uuid.uuid4().hex}"
    client = layout.plain_client(channel)
    sent: list[str] = []
    tags: list[str] = []  # the probes' delivery tags: their notes' members
    delivered: list[object] = []  # acked in the end whatever happens: kombu restores none
    try:
        for priority in (0, 0, 9):  # two on one list (their order), one on another list
            probe = _Probe(prefix)
            message = channel.prepare_message(
                "probe", priority=priority, headers={"id": probe.task_id}
            )
            with publishing(connection, notes=probe):
                channel.basic_publish(message, exchange="", routing_key=queue)
            sent.append(probe.task_id)
            tags.append(str(message["properties"]["delivery_tag"]))
        return _received(channel, client, queue, sent, delivered)
    finally:
        _ack(channel, delivered)
        lists = layout.queue_lists(channel, queue)
        client.delete(*lists)
        Transit(client, prefix).forget(tags, lists)


def _received(
    channel: Channel, client: Any, queue: str, sent: list[str], delivered: list[object]
) -> str | None:
    unacked = layout.prefix_of(channel) + channel.unacked_key
    index = layout.prefix_of(channel) + channel.unacked_index_key
    received: list[str | None] = []
    for _ in sent:
        got = channel.basic_get(queue)
        if got is None:
            return (
                f"kombu found {len(received)} of {len(sent)} probe messages in the lists "
                f"the ride pushed to ({', '.join(layout.queue_lists(channel, queue))})"
            )
        delivered.append(got.delivery_tag)
        received.append((got.headers or {}).get("id"))
        value = client.hget(unacked, got.delivery_tag)
        if value is None or layout.task_id(value, unacked=True) != received[-1]:
            return (
                f"kombu's unacked bookkeeping is not a hash {unacked!r} of delivery tag -> "
                f"[message, exchange, routing key]: found {_shown(value)}"
            )
        if client.zscore(index, got.delivery_tag) is None:
            # What kombu's restore reads to find messages unacked too long.
            return f"a received message is not in kombu's unacked index {index!r}"
    left = _left_once_acked(client, _ack(channel, delivered), unacked, index)
    if left is not None:
        return left
    if received[:2] != sent[:2]:
        return "kombu does not pop a queue's messages in the order the ride pushes them"
    return None


def _left_once_acked(client: Any, acked: list[object], unacked: str, index: str) -> str | None:
    if any(client.hexists(unacked, tag) for tag in acked):
        return f"an acked message stays in kombu's unacked hash {unacked!r}"
    if any(client.zscore(index, tag) is not None for tag in acked):
        return f"an acked message stays in kombu's unacked index {index!r}"
    return None


def _ack(channel: Channel, delivered: list[object]) -> list[object]:
    """Ack every delivered probe, once; the tags acked."""
    acked = list(delivered)
    delivered.clear()
    for tag in acked:
        channel.basic_ack(tag)
    return acked


def _shown(value: object) -> str:
    if value is None:
        return "nothing under the delivery tag"
    try:
        return json.dumps(json.loads(value))[:200]  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return repr(value)[:200]
