"""A call's place in its key's line (``max_pending``): kept as it goes round, freed as it runs."""

from __future__ import annotations

import logging

from ..context import Delivery
from ..exceptions import SingletonLockError
from ..lease.limits.backlog import backlog_of
from ..tokens import BACKLOG_HEADER, header

logger = logging.getLogger(__name__)


def keep_place(delivery: Delivery, lock_name: str, countdown: float) -> dict[str, str]:
    """A message sent round again in ``countdown`` seconds (deferred, requeued,
    paused, sent on towards its ETA) keeps its place, renewed for as long as it may then
    wait: the header that says so, for the message sent. Never an error: the message
    goes round regardless."""
    request = delivery.request
    context = delivery.context
    if header(request, BACKLOG_HEADER) is None or context.options.max_pending is None:
        return {}
    setattr(request, "singleton_place_kept", True)  # noqa: B010  (Celery's Context)
    try:
        backlog_of(context.store).renew(lock_name, request.id, context.queue_ttl + countdown)
    except SingletonLockError as error:
        logger.warning("%s: the place of %s not renewed (%s)", lock_name, request.id, error)
    return {BACKLOG_HEADER: "1"}


def leave_place(delivery: Delivery, lock_name: str) -> None:
    """The run starts, or ends without running and without being sent round again
    (skipped, dropped, refused): its place is free for the next call. Never an error: a
    place not freed runs out by itself (the queue ttl)."""
    request = delivery.request
    if header(request, BACKLOG_HEADER) is None or getattr(request, "singleton_place_kept", False):
        return
    try:
        backlog_of(delivery.context.store).leave(lock_name, request.id)
    except SingletonLockError as error:
        logger.warning("%s: the place of %s not freed (%s)", lock_name, request.id, error)
