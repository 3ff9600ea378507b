"""A message sent again with its task id: requeued after a contention or an outage,
deferred to the slot its key's rate reserved for it, or sent round while its key is paused."""

from __future__ import annotations

import logging
from typing import NoReturn

from celery.exceptions import Ignore

from ..context import Delivery, Request
from ..lease import Slot
from ..lease.limits.overrides import RECHECK
from ..tokens import (
    ATTEMPT_HEADER,
    BYPASS_OPTION,
    CALL_HEADERS,
    HOLD_HEADER,
    NAME_HEADER,
    OUTAGE_HEADER,
    PAUSED_SINCE_HEADER,
    RATE_SLOT_HEADER,
    TOKEN_HEADER,
    TURN_HEADER,
    carried_headers,
    header,
    slot_header,
)
from .holds import PendingHold
from .places import keep_place

logger = logging.getLogger(__name__)


def send_again(
    delivery: Delivery,
    lock_name: str,
    attempt: int,
    countdown: float,
    *,
    outages: int | None = None,
    hold: PendingHold | None = None,
) -> NoReturn:
    """Send the current message again in ``countdown`` seconds, and end this execution."""
    request = delivery.request
    logger.info(
        "%s[%s] requeued in %.2fs for %s (attempt %d)",
        delivery.name,
        request.id,
        countdown,
        lock_name,
        attempt,
    )
    headers = _again(request, lock_name, ATTEMPT_HEADER, attempt)
    # The requeued message stays the pending call: its hold goes with it.
    passed = (
        hold.pass_on(delivery.context.queue_ttl + countdown, attempt) if hold is not None else {}
    )
    newer = hold.offered() if hold is not None else None
    if newer is not None:  # a later call's arguments, left while this one held the hold
        request.args, request.kwargs = newer
    if outages is not None:
        headers[OUTAGE_HEADER] = outages
    # Same id, links, chain and options as this message (what Celery's retry re-sends),
    # without counting as a retry of the task's own max_retries.
    kept = keep_place(delivery, lock_name, countdown)
    own = {**(passed or {}), **kept, **_turn(request)}
    delivery.resend(countdown, headers, {BYPASS_OPTION: own or True})
    raise Ignore(f"requeued: {lock_name!r} is held by another execution")


# A deferred message is sent to arrive this much before its slot: the broker's and the
# worker's delays eat into it, and the run waits out what is left where it is (a rate's
# ``NEAR``, modes/rate.py, is more), so it starts on its slot rather than late for it.
ARRIVE_EARLY = 0.025


def defer(delivery: Delivery, lock_name: str, slot: Slot) -> NoReturn:
    """Send the current message again to arrive on ``slot`` of its key's rate (reserved
    for it), keeping its task id, and end this execution."""
    request = delivery.request
    countdown = max(0.0, slot.wait - ARRIVE_EARLY)
    hop = delivery.context.one_hop(countdown)
    logger.info(
        "%s[%s] deferred %.3fs to its slot of %s's rate%s",
        delivery.name,
        request.id,
        slot.wait,
        lock_name,
        _hop_text(hop, countdown),
    )
    at = slot_header(slot.at, slot.clock)
    # Passed as the library's own header: a copy of a request's headers (a retry's)
    # drops any slot, which only the deferral that reserved it may send. A hop that
    # arrives early is deferred again to the same slot (it counts nothing).
    headers = _again(request, lock_name, RATE_SLOT_HEADER, at)
    kept = keep_place(delivery, lock_name, hop)
    own = {RATE_SLOT_HEADER: at, **kept, **_turn(request)}
    delivery.resend(hop, headers, {BYPASS_OPTION: own})
    raise Ignore(f"deferred {slot.wait:.3f}s by the rate of {lock_name!r}")


# How often a run of a paused key looks again (a resume lets it go within this).
PAUSE_RECHECK = RECHECK


def send_round_paused(
    delivery: Delivery,
    lock_name: str,
    target: str,
    held_at: float,
    countdown: float,
    *,
    slot: str | None = None,
) -> NoReturn:
    """Send the current message again in ``countdown`` seconds with when it was first
    paused and the rate slot it carries (none: it asks for one once its key is
    resumed), and end this execution."""
    request = delivery.request
    hop = delivery.context.one_hop(countdown)
    logger.info(
        "%s[%s] held back %.2fs: %s is paused (%r)%s",
        delivery.name,
        request.id,
        countdown,
        lock_name,
        target,
        _hop_text(hop, countdown),
    )
    own = {PAUSED_SINCE_HEADER: f"{held_at:.6f}"}
    if slot is not None:
        own[RATE_SLOT_HEADER] = slot
    headers = {**_again(request, lock_name, PAUSED_SINCE_HEADER, own[PAUSED_SINCE_HEADER]), **own}
    own.update(keep_place(delivery, lock_name, hop))
    own.update(_turn(request))
    # A hop that arrives early waits out the rest (``admission.wait_out_pause``).
    delivery.resend(hop, headers, {BYPASS_OPTION: own})
    raise Ignore(f"held back: {lock_name!r} is paused")


def _hop_text(hop: float, countdown: float) -> str:
    if hop >= countdown:
        return ""
    # visibility_timeout on Redis and SQS, consumer_timeout on RabbitMQ
    return f" (sent {hop:.1f}s on: the broker's unacked timeout)"


def _again(request: Request, lock_name: str, name: str, value: object) -> dict[str, object]:
    """The headers of this message sent again: its key, ``name``, and no hold or slot of
    its own (a slot it could not start on is spent)."""
    headers = {**carried_headers(request.headers), NAME_HEADER: lock_name}
    for own in (TOKEN_HEADER, HOLD_HEADER, RATE_SLOT_HEADER, *CALL_HEADERS):
        headers.pop(own, None)
    headers[name] = value
    return headers


def _turn(request: Request) -> dict[str, str]:
    """The stamp of a call's turn its message carries, passed on (the library's own
    header): the message sent again is still the call's one (``run.in_turn``)."""
    stamp = header(request, TURN_HEADER)
    return {} if stamp is None else {TURN_HEADER: stamp}
