"""The worker's part in finding lost messages: clear a received one's note, sweep on a timer.

A singleton message pushed with its hold is noted in transit (``lease.transit``) until a
worker records it as unacked; the note is cleared in that very pipeline (``riders``).
Every worker sweeps the notes on its timer (``sweeper``): a message popped by a worker
killed before it recorded it is pushed again, ``singleton_lock_transit_timeout`` to
twice that after it went missing, instead of never (kombu's Redis transport loses it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..backend import Backend
from ..broker import Rider
from ..exceptions import SingletonLockError
from ..options import is_singleton
from .reservations import reservations

if TYPE_CHECKING:
    from celery import Celery

    from ..lease import Server

logger = logging.getLogger(__name__)

# kombu's default name of the Redis broker's unacked hash (its ``unacked_key`` option).
UNACKED_KEY = "unacked"


def riders(
    app: Celery, hostname: str, headers: Mapping[str, object], server: Server, tag: str
) -> list[Rider]:
    """What rides the pipeline recording a received message as unacked: its take
    (``Reservations.ride``) and the clearing of its note, for a singleton task whose
    lock store is the broker's server."""
    task_name = headers.get("task")
    task = app.tasks.get(task_name) if isinstance(task_name, str) else None
    if task is None or not is_singleton(task):
        return []
    found: list[Rider] = []
    take = reservations.ride(app, hostname, headers, server)
    if take is not None:
        found.append(take)
    pushes = task.singleton_context.store.pushes
    if pushes is not None and pushes.server.same_user(server):
        clear = pushes.transit.clear(tag)
        if clear is not None:
            found.append(clear)
    return found


def sweeper(app: Celery) -> tuple[float, Callable[[], None]] | None:
    """(interval, sweep) for a worker whose messages may be noted in transit; None when
    notes are off (``singleton_lock_transit_timeout = 0``, or no ride on the broker)."""
    config = Backend.for_app(app).config
    wait = config.transit_timeout
    if wait <= 0 or not config.ride_broker:
        return None
    with app.connection_for_write() as connection:  # no I/O: the transport it would use
        if connection.transport.driver_type != "redis":
            return None  # RabbitMQ, SQS: nothing is ever noted
    options = app.conf.broker_transport_options or {}
    # As the server names it: kombu prefixes every key with global_keyprefix.
    unacked = str(options.get("global_keyprefix") or "") + str(
        options.get("unacked_key") or UNACKED_KEY
    )

    def sweep() -> None:
        try:
            pushes = Backend.for_app(app).lock.pushes
            if pushes is None:
                return
            pushes.transit.wait = wait
            again = pushes.transit.sweep(unacked)
        except SingletonLockError as error:
            logger.debug("sweep of messages in transit skipped: %s", error)
            return
        for tag in again:
            logger.warning(
                "celery-singleton-lock: message %s was lost between the broker and a worker "
                "(popped, never recorded as unacked): pushed again", tag,
            )  # fmt: skip

    return max(0.5, wait / 2), sweep
