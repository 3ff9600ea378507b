"""How a singleton call's message is noted in transit as it is pushed, and the holds of
the messages a purge threw away, given up.

A message popped by a worker killed before it recorded it is pushed again by the
workers' sweep (``broker.sweeper``); its note is what that sweep reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.stores import LockStores
from ..lease import ReleaseResult, companion
from ..tokens import HOLD_HEADER, NAME_HEADER, TOKEN_HEADER
from .connection import publishing
from .transit import Note, Transit

if TYPE_CHECKING:
    from celery import Celery
    from celery.result import AsyncResult

    from ..context import TaskContext

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InTransit:
    """How a singleton call's message is noted in transit as a Redis broker's channel
    pushes it (``broker.state.NoteSource``, ``broker.transit``): its hold (the lock's name and
    token; '' when the message has none of its own, as with ``limit``, ``rate`` or a
    throttle's window), for how long it is owed a run, and the wait before it is pushed
    again (0: not noted)."""

    task_id: str
    name: str
    token: str
    ttl: float
    wait: float
    prefix: str

    @classmethod
    def of(
        cls,
        context: TaskContext,
        task_id: str,
        own_headers: Mapping[str, object],
        delay: float,
    ) -> InTransit:
        """For a message of ``task_id`` with the library's headers ``own_headers``, due
        ``delay`` seconds from now (its countdown or ETA: its hold outlives the wait)."""
        return cls.sent(context.stores, context.queue_ttl, task_id, own_headers, delay)

    @classmethod
    def sent(
        cls,
        stores: LockStores,
        queue_ttl: float,
        task_id: str,
        own_headers: Mapping[str, object],
        delay: float = 0.0,
    ) -> InTransit:
        """``of``, for a message sent again by a worker (an attached call's), with the
        app's ``stores`` and the queued hold's ``queue_ttl``."""
        name, token, role = (
            own_headers.get(NAME_HEADER),
            own_headers.get(TOKEN_HEADER),
            own_headers.get(HOLD_HEADER),
        )
        hold = held = ""
        if isinstance(name, str) and isinstance(token, str) and token:
            hold = companion(name, role) if isinstance(role, str) and role else name
            held = token
        config = stores.config
        # 0 when received messages are not cleared (``singleton_lock_ride_broker = False``).
        wait = config.transit_timeout if config.ride_broker else 0.0
        return cls(task_id, hold, held, queue_ttl + delay, wait, stores.lock.prefix)

    def note(self, member: str) -> Note | None:
        """How its message, of delivery tag ``member``, is noted (None: wait is 0)."""
        if self.wait <= 0:
            return None
        return Note(member, self.name, self.token, self.ttl, self.wait, self.prefix)

    def publish(
        self,
        app: Celery,
        via: object,
        options: Mapping[str, object],
        send: Callable[..., AsyncResult],
    ) -> AsyncResult:
        """``send(producer=...)`` with ``via`` or a producer of the app's: the channel
        that pushes the message notes it (the one Celery would take: eagerly nothing is
        published, and ``connection=`` makes Celery use its own producer). A ``via``
        given is a producer the dispatch took, having asked both already."""
        if self.wait <= 0:
            return send(producer=via)
        if via is not None:
            with publishing(via, notes=self):
                return send(producer=via)
        if app.conf.task_always_eager or options.get("connection") is not None:
            return send(producer=via)
        with app.producer_or_acquire(via) as real, publishing(real, notes=self):
            return send(producer=real)


def give_up_purged(app: Celery, client: object, lists: list[str]) -> None:
    """A purge of ``lists`` on the broker (``broker.on_purge``; ``client`` the purging
    channel's): the holds of the singleton messages it threw away are given up,
    owner-checked, not kept for ``queue_ttl``."""
    stores = LockStores.for_app(app)
    store, notes = stores.lock, Transit(client, stores.config.prefix)
    freed = 0
    for name, token in notes.purged(lists):
        freed += store.release_token(name, token) == ReleaseResult.RELEASED
    if freed:
        logger.info("purged %d singleton call(s): their keys are free", freed)
