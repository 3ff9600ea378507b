"""A run's turn of its task's ``total_limit`` (round robin across keys): its message kept in
the waiting room while it waits, the calls whose turn came sent, the total's slot handed
on as the run ends."""

from __future__ import annotations

import logging
from functools import partial
from typing import NoReturn

from celery.exceptions import Ignore

from .. import signals as singleton_signals
from ..broker.turn_sweep import send_turns
from ..context import Delivery, TaskContext
from ..exceptions import LockStoreUnavailableError
from ..lease import Lease
from ..lease.limits.turns import Handed, Kept, Waiter, stamps_kept
from ..modes import Mode, Start
from ..modes.stages import Call
from ..policies import fail, skip
from ..tokens import (
    BACKLOG_HEADER,
    BYPASS_OPTION,
    CALL_HEADERS,
    HOLD_HEADER,
    NAME_HEADER,
    RATE_SLOT_HEADER,
    TOKEN_HEADER,
    TURN_HEADER,
    carried_headers,
    header,
    header_count,
)
from .places import keep_place

logger = logging.getLogger(__name__)


def waiter_of(delivery: Delivery, mode: Mode, start: Start, call: Call) -> Waiter | None:
    """This run as a call that may wait for its turn in the waiting room (its message kept
    as a requeue would send it again); None where it does not: its mode takes no turns,
    it runs eagerly, its ``on_contention`` gives up (``fail``, ``skip``), or its message
    cannot be kept (it then contends as first come, first served)."""
    request = delivery.request
    policy = delivery.context.options.on_contention
    if not mode.takes_turns or request.is_eager or isinstance(policy, fail | skip):
        return None
    headers = {**carried_headers(request.headers), NAME_HEADER: start.name}
    for own in (TOKEN_HEADER, HOLD_HEADER, RATE_SLOT_HEADER, *CALL_HEADERS):
        headers.pop(own, None)
    backlog = header(request, BACKLOG_HEADER) is not None
    place = {BACKLOG_HEADER: "1"} if backlog and delivery.context.options.max_pending else {}
    record = delivery.keep(headers, {BYPASS_OPTION: place or True})
    if record is None:
        return None
    retries = getattr(request, "retries", 0) or 0
    weight = mode.weight(call, start.override)
    # The stamp of the hand-out this message was sent on (0: as first sent).
    stamp = header_count(request, TURN_HEADER)
    kept = stamps_kept(delivery.context.unacked_for)
    return Waiter(Waiter.ident_of(request.id, retries), record, weight, stamp, kept)


def send_handed(delivery: Delivery, handed: list[Handed]) -> None:
    """Send the calls whose turn came while this run asked for its own."""
    if handed:
        context = delivery.context
        forget = partial(context.options.mode.forget_turn, context.store)
        send_turns(context.app, list(handed), forget)
        handed.clear()


def wait_for_turn(delivery: Delivery, kept: Kept) -> NoReturn:
    """End this delivery: its message is kept in its key's line (or it is a copy of a
    call another message of which has its turn: ``copy_dropped``), acked now, so it
    holds no pool process and no prefetch while it waits.
    Its place among its key's waiting calls (``max_pending``) is kept."""
    request = delivery.request
    if kept.started:
        # (the call's other message started, or waits to: "turn", as no holder's state)
        singleton_signals.send(
            singleton_signals.copy_dropped,
            delivery.sender,
            kept.name,
            task_id=request.id,
            holder_state="turn",
        )
        logger.info(
            "%s[%s] dropped: a copy of a call whose turn of %s another message of it has",
            delivery.name,
            request.id,
            kept.name,
        )
        # Its place (max_pending) is its call's, which waits or runs: left as it is.
        setattr(request, "singleton_place_kept", True)  # noqa: B010  (Celery's Context)
        raise Ignore(f"a copy of {request.id}, whose turn another message of it has")
    keep_place(delivery, kept.name, 0.0)
    singleton_signals.send(
        singleton_signals.waiting_turn, delivery.sender, kept.name, task_id=request.id
    )
    logger.info(
        "%s[%s] waits for its turn of the total: kept in %s's line",
        delivery.name,
        request.id,
        kept.name,
    )
    raise Ignore(f"waits for its turn: kept in {kept.name!r}'s line")


def release_also_held(
    delivery: Delivery, context: TaskContext, leases: list[Lease], *, eager: bool
) -> None:
    """What a run held besides its lease (a ``total_limit``'s slot), released as the run
    ends, however it ends (a retry takes another when it runs): handed on to the next
    call in turn where its mode takes turns, that call sent. Never raises for the store."""
    mode, store = context.options.mode, context.store
    for lease in leases:
        try:
            handed = mode.release_held(store, lease, eager=eager)
        except LockStoreUnavailableError as error:
            logger.warning(
                "release of %s failed (%s); it frees itself by its ttl", lease.key, error
            )
            continue
        send_handed(delivery, handed)


__all__ = ["release_also_held", "send_handed", "wait_for_turn", "waiter_of"]
