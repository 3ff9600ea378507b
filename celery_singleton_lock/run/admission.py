"""Before a run's lease: kept waiting while an operator has its key paused, then its rate's slot."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from .. import signals as singleton_signals
from ..context import Delivery
from ..exceptions import RateLimitedError
from ..lease import append_history
from ..lease.limits.overrides import Override
from ..modes import Mode, Start
from ..modes.stages import Call
from ..tokens import PAUSED_SINCE_HEADER, RATE_SLOT_HEADER, TURN_HEADER, header, read_slot
from .resend import PAUSE_RECHECK, defer, send_round_paused

logger = logging.getLogger(__name__)


def admit(delivery: Delivery, mode: Mode, start: Start, call: Call) -> Start:
    """A paused key's run kept waiting (an operator's override), then a rate's slot
    (``modes/rate.py``): a run with no slot free now is sent again to arrive on the one
    reserved for it. Returns what the run decides with from here: the override read
    last (a resume read again moves the rate's schedule, ``Override.pause``)."""
    request = delivery.request
    after = unless_paused(delivery, mode, start)
    start = replace(start, override=after.override)
    # Sent on its turn of a waiting room: its start was given back as it was kept.
    turned = header(request, TURN_HEADER) is not None
    slot = mode.admit(
        start, call, after.slot, held=after.held, eager=request.is_eager, turned=turned
    )
    if slot is None:
        return start
    # Early, on the slot it carries: one hop of a wait longer than the broker lets a
    # message wait unacked (``config.visibility``), no new decision to report.
    hop = not slot.now and after.slot is not None and slot.at <= after.slot + 1e-6
    if not hop:
        singleton_signals.send(
            singleton_signals.rate_asked,
            delivery.sender,
            start.name,
            task_id=request.id,
            slot=slot.at,
            delay=slot.wait,
            deferred=not slot.now,
            remaining=slot.remaining,
            next_slot=slot.free,
        )
    if slot.now and after.slot is not None and slot.clock > after.slot and slot.at > after.slot:
        # Late: it starts when the rate's gate has room, not on its slot.
        logger.info(
            "%s[%s] late for its slot of %s's rate by %.3fs: starts in %.3fs",
            delivery.name,
            request.id,
            start.name,
            slot.clock - after.slot,
            slot.wait,
        )
    if not slot.now and not request.is_eager:  # recorded by the rate's script
        mode.sent_round(start)
        defer(delivery, start.name, slot)
    # A slot near enough is waited for here (eagerly, the caller waits for every one).
    start.store.clock.sleep(slot.wait)
    # The slot this run started on, in the lock store's clock (seconds since the epoch).
    setattr(request, "singleton_rate_slot", slot.at)  # noqa: B010  (Celery's Context)
    # (given back if the run is kept waiting for its turn: ``Turns.take``)
    return replace(start, charge=slot.charge)


@dataclass(frozen=True)
class AfterPause:
    """What a run that may go decides with: the override in force, the rate slot its
    message carries (moved by the last pause), and whether a pause kept it waiting."""

    override: Override | None
    slot: float | None
    held: bool


def unless_paused(delivery: Delivery, mode: Mode, start: Start) -> AfterPause:
    """The run's ``AfterPause``, once ``wait_out_pause`` lets it go (it raises Ignore, or
    RateLimitedError eagerly, while the key is paused)."""
    request = delivery.request
    message_slot = read_slot(header(request, RATE_SLOT_HEADER))
    override = start.override
    if override is not None:
        override = wait_out_pause(delivery, mode, start, override, message_slot)
    slot = None
    if message_slot is not None:
        slot = message_slot[0] if override is None else override.moved(*message_slot)
    # Late for its slot by the pause, as every run it kept waiting: only while that pause
    # is known (after a reset the slot is as it was, and a late run is given a new one).
    held = header(request, PAUSED_SINCE_HEADER) is not None
    return AfterPause(override, slot, held and override is not None and override.pause is not None)


def wait_out_pause(
    delivery: Delivery,
    mode: Mode,
    start: Start,
    override: Override,
    message_slot: tuple[float, float] | None,
) -> Override | None:
    """Keep this run waiting while an operator has its key paused (sent round again every
    ``PAUSE_RECHECK`` seconds, never dropped). After the resume, each paused run
    waits as long after it as it came after the pause began (``Override.moved``), so
    they go in the order they came; a rate slot moves as much. ``message_slot``: the
    message's slot. Returns the override in force."""
    request = delivery.request
    raw = header(request, PAUSED_SINCE_HEADER)
    held_at = float(raw) if raw is not None else None
    if override.paused and not request.is_eager:
        # Read again before sending it round once more: a resume this process has not
        # read yet would cost the run a round of PAUSE_RECHECK, and its place.
        fresh = delivery.context.override(start.name, fresh=True)
        if fresh is None:
            return None
        override = fresh
    if override.paused:
        if held_at is None:  # its first round: once in the history, not every second
            append_history(start.store, start.entry, "paused", target=override.target)
            singleton_signals.send(
                singleton_signals.call_paused,
                delivery.sender,
                start.name,
                task_id=request.id,
                target=override.target,
                paused_at=override.paused_at,
                by=override.changed_by,
                recheck=PAUSE_RECHECK,
            )
        if request.is_eager:  # nothing to send again: the caller is told
            raise RateLimitedError(
                f"{start.name!r} is paused by an operator ({override.target!r})",
                name=start.name,
                retry_after=PAUSE_RECHECK,
            )
        first = held_at if held_at is not None else place(override, message_slot)
        slot = header(request, RATE_SLOT_HEADER)
        mode.waits_out_pause(start, PAUSE_RECHECK)
        mode.sent_round(start)
        send_round_paused(
            delivery,
            start.name,
            override.target,
            first,
            PAUSE_RECHECK,
            slot=None if slot is None else str(slot),
        )
    if held_at is not None:
        # Every run it kept waiting goes as long after the pause as it came after it
        # began: in the order they came, as far apart (its slot moves as much).
        wait = override.moved(held_at, held_at) - time.time()
        if wait > 0.001:
            mode.waits_out_pause(start, wait)
            mode.sent_round(start)
            send_round_paused(
                delivery,
                start.name,
                override.target,
                held_at,
                wait,
                slot=None if message_slot is None else str(header(request, RATE_SLOT_HEADER)),
            )
    return override


# Where the runs due before a pause stand: in the first moment after it began.
EARLY_LINE = 0.01


def place(override: Override, message_slot: tuple[float, float] | None) -> float:
    """Where a run first paused by ``override``'s pause stands in line: the rate slot
    its message carries (the order its calls were given slots: a message sent to arrive
    on its slot may come late, on a busy worker after calls given later slots), else
    when it came. Never before the pause began (whatever this machine's clock says
    against the operator's): the runs whose slots fell before it stand first, in their
    slots' order, within ``EARLY_LINE`` of its start, so the resume moves them as it
    moves every other (``Override.moved`` leaves a time before the pause as it is)."""
    now, began = time.time(), override.paused_at or 0.0
    came = now if message_slot is None else min(now, message_slot[0])
    if came > began:
        return came
    return began + EARLY_LINE / (1.0 + began - came)
