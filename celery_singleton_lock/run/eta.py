"""A call's own countdown longer than its broker lets a message wait: waited out in hops.

Celery keeps an ETA message unacked until then, and a Redis or SQS broker hands it out
again after ``visibility_timeout``: each copy would run. Dispatch sends it to arrive early
(``publish/dispatch.long_wait``); each early arrival is sent on with its hold.
"""

from __future__ import annotations

import logging
import time
from typing import NoReturn

from celery.exceptions import Ignore

from ..context import Delivery
from ..exceptions import SingletonLockError
from ..lease import Contended, Lease, TakeOver, companion
from ..outages import release_or_warn
from ..tokens import (
    BYPASS_OPTION,
    ETA_HEADER,
    HOLD_HEADER,
    NAME_HEADER,
    TOKEN_HEADER,
    HandedLease,
    carried_headers,
    header,
    reserved_exact,
)
from .places import keep_place

logger = logging.getLogger(__name__)

# A call this close to its ETA runs now: Celery held it until the ETA its last hop gave.
NEAR = 0.05


def ahead(delivery: Delivery) -> float:
    """Seconds until the call's own ETA, when it was sent to arrive early (0: none, or due)."""
    raw = header(delivery.request, ETA_HEADER)
    try:
        left = float(raw) - time.time() if raw is not None else 0.0
    except (TypeError, ValueError):
        return 0.0
    return left if left > NEAR else 0.0


def send_on(delivery: Delivery, lock_name: str, handed: HandedLease | None) -> NoReturn:
    """Send the message on towards its ETA (one more hop), its hold handed back to it as
    it was sent (the queued hold's token: the next worker takes it over as it receives
    it), and end this execution. A message a later call replaced is dropped instead."""
    request, context = delivery.request, delivery.context
    left = ahead(delivery)
    countdown = context.one_hop(left)
    queued, role = header(request, TOKEN_HEADER), header(request, HOLD_HEADER)
    own: dict[str, object] = {ETA_HEADER: header(request, ETA_HEADER)}
    kept = None
    if queued is not None:
        kept = _hand_back(delivery, lock_name, handed, queued=queued, role=role, ttl=countdown)
        if isinstance(kept, Contended) and kept.replaced:
            logger.info(
                "%s[%s] dropped: a later call replaced its arguments for %r",
                delivery.name,
                request.id,
                lock_name,
            )
            raise Ignore("replaced by a later call under the same task id")
        own[TOKEN_HEADER] = queued
        if role is not None:
            own[HOLD_HEADER] = role
    logger.info(
        "%s[%s] waits %.1fs more for its eta: sent %.1fs on (the broker's unacked timeout)",
        delivery.name,
        request.id,
        left,
        countdown,
    )
    own.update(keep_place(delivery, lock_name, countdown))
    headers = {**carried_headers(request.headers), NAME_HEADER: lock_name, **own}
    try:
        delivery.resend(countdown, headers, {BYPASS_OPTION: own})
    except BaseException:
        if isinstance(kept, Lease):  # no message will come for it
            release_or_warn(context.store.release, kept)
        raise
    raise Ignore(f"sent on towards its eta, in {left:.1f}s")


def _hand_back(
    delivery: Delivery,
    lock_name: str,
    handed: HandedLease | None,
    *,
    queued: str,
    role: str | None,
    ttl: float,
) -> Lease | Contended | None:
    """The key (or its companion) back to the message's queued hold for the hop and the
    queue: from the running lease the worker took as the message arrived, or from its
    reservation (by shape: a worker's tasks may spell its host otherwise), as a worker
    shutting down hands its messages' holds back (``Reservations.hand_back``). Never
    taken from a later call that replaced this one (``Contended.replaced``)."""
    request, context = delivery.request, delivery.context
    name = companion(lock_name, role) if role else lock_name
    take = TakeOver(
        replace=handed.token if handed is not None and role is None else None,
        shape=reserved_exact(request.id, queued),
        fenced=False,
        unless_replaced=context.options.mode.unless_replaced(queued),
    )
    try:
        return context.store.try_acquire(name, context.queue_ttl + ttl, token=queued, take=take)
    except SingletonLockError as error:
        # The next arrival finds no hold and contends, as any message whose hold was lost.
        logger.warning("%s: the hold of %s not handed back (%s)", lock_name, request.id, error)
        return None
