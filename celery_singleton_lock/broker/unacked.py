"""kombu's Redis unacked bookkeeping, with a received singleton message's lock commands riding it.

kombu records each delivered message as unacked in one pipeline (``QoS.append``); a received
singleton message's take and its in-transit note's clearing go first in it: no round trip of
their own, and the note is cleared in the very step that makes the message kombu's to restore.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kombu.transport import redis as kombu_redis

from .bookkeeping import Bookkeeping, Keys
from .state import RidingCall
from .transit import NOTED_PROPERTY, ClearNote

if TYPE_CHECKING:
    from kombu.message import Message

logger = logging.getLogger(__name__)


class QoS(kombu_redis.QoS):
    """kombu's Redis acknowledgement emulation; a received singleton message's take, and
    the clearing of its in-transit note, are sent in the same pipeline as the unacked
    bookkeeping kombu sends for it anyway.

    The take is a ``pushes.RidingTake``, the clearing a ``transit.ClearNote``; both are sent
    first in the pipeline ``append`` gets from ``pipe_or_acquire``. The worker says what
    rides (``broker.on_receipt``)."""

    # What rides the pipeline of the message being appended, per thread: kombu asks for
    # that pipeline from inside ``append``, on the consumer's thread, while a thread
    # pool's threads ack other messages on the same channel (nothing rides their pipelines).
    _appending: threading.local | None = None

    def _appending_now(self) -> threading.local:
        appending = self._appending
        if appending is None:
            # setdefault: two threads' first calls end up with the same one
            appending = self.__dict__.setdefault("_appending", threading.local())
        return appending

    def append(self, message: Message, delivery_tag: object) -> None:
        riding: Sequence[RidingCall] = ()
        channel = self.channel
        ride = channel.ride()
        receipts = None if ride is None else ride.receipts
        server = None if receipts is None else channel.server()
        headers = getattr(message, "headers", None)
        properties = getattr(message, "properties", None)
        if receipts is not None and server is not None and isinstance(headers, Mapping):
            if not isinstance(properties, Mapping):
                properties = {}
            try:
                riding = receipts((headers, properties), server, str(delivery_tag))
            except Exception:
                # Never in the way of kombu's bookkeeping: the take goes alone.
                logger.exception("celery-singleton-lock: a received message's take cannot ride")
            # Its note, under the prefix its producer noted it in, cleared in the same step.
            noted = properties.get(NOTED_PROPERTY)
            if isinstance(noted, str):
                riding = [*riding, ClearNote(noted, str(delivery_tag))]
        if not riding:
            super().append(message, delivery_tag)
            return
        appending = self._appending_now()
        appending.riding = riding
        try:
            super().append(message, delivery_tag)
        finally:
            appending.riding = ()

    # Why the bookkeeping is kombu's own transaction again (None: it is our commands'):
    # the server refused the record's script (an ACL user that may not run scripts).
    _scripts_refused: str | None = None

    @contextmanager
    def pipe_or_acquire(self, pipe: object = None, client: object = None) -> Iterator[object]:
        channel = self.channel
        server = channel.server()
        riding: Sequence[RidingCall] = ()
        if pipe is None:
            appending = self._appending_now()
            riding = getattr(appending, "riding", ())
            appending.riding = ()  # once: the unacked bookkeeping's own pipeline
        pipelining = None
        if pipe is None and client is None and server is not None and not self._scripts_refused:
            pipelining = channel.pipelining(records=True)
        if pipelining is not None and server is not None:
            # Our commands in place of kombu's transaction (``bookkeeping``): kombu's
            # pipeline is made only if they go there after all.
            keys = Keys(self.unacked_index_key, self.unacked_key, channel.global_keyprefix or "")
            yield Bookkeeping(
                pipelining,
                keys,
                riding,
                lambda riding: self._kombus_pipeline(riding, server.db),
                refused=self._refuse_scripts,
                db=server.db,
            )
            return
        with super().pipe_or_acquire(pipe, client) as acquired:
            if not riding or server is None:
                yield acquired
                return
            yield _RidingPipeline(acquired, riding, server.db)

    def _kombus_pipeline(self, riding: Sequence[RidingCall], db: int) -> object:
        """kombu's own pipeline, the riding calls first; the channel keeps its client past the
        ``with`` (``Channel.conn_or_acquire``), so the pipeline outlives it."""
        with super().pipe_or_acquire() as acquired:
            return _RidingPipeline(acquired, riding, db) if riding else acquired

    def _refuse_scripts(self, error: Exception) -> None:
        self._scripts_refused = str(error)
        logger.warning(
            "celery-singleton-lock: the broker refused the script that records a received "
            "message as unacked (%s): kombu's own transaction records them from now on",
            error,
        )


class _RidingPipeline:
    """kombu's pipeline with the riding calls sent first: kombu's own commands, replies and
    errors are as they would be without them."""

    def __init__(self, pipe: Any, riding: Sequence[RidingCall], db: int) -> None:
        self._pipe = pipe
        self._riding = riding
        self._calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = []
        for call in riding:
            call.add(pipe, db)

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._pipe, name)
        if not callable(attr):
            return attr

        def call(*args: object, **kwargs: object) -> object:
            self._calls.append((name, args, kwargs))
            result = attr(*args, **kwargs)
            return self if result is self._pipe else result  # chained as kombu chains

        return call

    def execute(self, raise_on_error: bool = True) -> list[object]:
        try:
            replies: list[object] = self._pipe.execute(raise_on_error=False)
        except Exception as error:
            refused = [call.refused(error) for call in self._riding]
            if not any(refused):
                raise
            # The server refused a riding call as it was queued (an ACL user without the
            # lock's keys), which aborts the transaction: kombu's commands alone.
            for name, args, kwargs in self._calls:
                getattr(self._pipe, name)(*args, **kwargs)
            return list(self._pipe.execute(raise_on_error=raise_on_error))
        count = len(self._riding)
        for call, reply in zip(self._riding, replies[:count], strict=True):
            call.read(reply)
        own = replies[count:]
        if raise_on_error:
            for reply in own:
                if isinstance(reply, Exception):
                    raise reply
        return own


__all__ = ["QoS", "RidingCall"]
