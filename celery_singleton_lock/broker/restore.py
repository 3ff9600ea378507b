"""Dead workers' unacked messages restored on a timer in workers without an event loop.

A worker without one (gevent, eventlet, threads, solo) restores only when a poll of its
queues comes back empty, so under steady load a killed worker's messages, and their queued
holds, stay past their timeout. Such a worker calls kombu's ``QoS.restore_visible`` on a timer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

# kombu's own default for unacked_restore_interval (kombu.transport.redis.Channel).
DEFAULT_INTERVAL = 10.0


def stale_restorer(app: Celery) -> tuple[float, Callable[[], None], Callable[[], None]] | None:
    """(interval, restore, close) for a Redis broker's worker without an event loop, or
    None when the broker keeps no unacked set of this kind (RabbitMQ, SQS, memory).

    On a Redis broker kombu keeps each delivered message in the ``unacked`` set until it
    is acked, and puts back the ones older than ``visibility_timeout`` (their worker
    died). A prefork worker does that on its event loop's timer, every
    ``unacked_restore_interval`` seconds. A worker without one only does it when a poll
    of its queues comes back empty, so under steady load a killed worker's messages stay
    unacked past their timeout, and their queued holds keep their keys, until the load
    eases (the mode soak's stale unacked count grew all through it). ``restore`` calls
    kombu's own ``QoS.restore_visible`` on the timer as prefork does; kombu's mutex in
    Redis keeps it to one restore at a time across all workers."""
    connection = app.connection_for_write()
    if connection.transport.driver_type != "redis":
        connection.release()
        return None
    options = app.conf.broker_transport_options or {}
    interval = float(options.get("unacked_restore_interval") or DEFAULT_INTERVAL)

    def restore() -> None:
        try:
            channel = connection.default_channel
            # interval=1: scan at every call (kombu's throttle counts calls, and this is
            # already the timer's cadence).
            channel.qos.restore_visible(num=channel.unacked_restore_limit, interval=1)
        except connection.connection_errors as error:
            logger.debug("restore of unacked messages skipped: %s", error)
            with contextlib.suppress(Exception):
                connection.collect()  # a fresh channel at the next tick

    return interval, restore, connection.release
