"""The queue-level hold around publish: the gate a message passes only once its key is held."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery.signals import before_task_publish

from .. import outages
from .. import signals as singleton_signals
from ..broker.state import Refused
from ..exceptions import (
    BackpressureError,
    LockStoreUnavailableError,
    RateLimitedError,
    SingletonLockError,
)
from ..lease import Contended, Lease, PendingAcquire
from ..lease.limits.backlog import backlog_of
from ..tokens import BACKLOG_HEADER, ETA_HEADER, RATE_SLOT_HEADER, slot_header
from .timing import delay_of

if TYPE_CHECKING:
    from celery.result import AsyncResult
    from kombu.messaging import Producer

    from ..context import TaskContext
    from ..lease.limits.rates import Slot
    from .call import Dispatch

logger = logging.getLogger(__name__)


def long_wait(context: TaskContext, options: dict[str, object]) -> float:
    """A call's own ``countdown`` / ``eta`` longer than the broker lets a message wait
    unacked in a worker (``config.visibility``): sent to arrive early instead, its ETA in
    a header, and sent on in hops until it (``run/eta.py``). Waited out whole, kombu
    would hand it out again meanwhile, and each copy would run, one after the other.
    Returns the call's delay as it is then sent (``delay_of`` its options)."""
    delay = delay_of(options)
    eta = options.get("eta")
    if isinstance(eta, datetime) and eta.tzinfo is None and options.get("countdown") is None:
        return delay  # read in the worker's timezone: no ETA of ours could say when it is
    hop = context.one_hop(delay) if delay else delay
    if hop >= delay:
        return delay
    given = options.get("headers")
    headers = dict(given) if isinstance(given, Mapping) else {}
    headers[ETA_HEADER] = f"{time.time() + delay:.6f}"
    options.pop("eta", None)
    options.update(countdown=hop, headers=headers)
    return hop


def slot_at_publish(call: Dispatch, task_id: str) -> tuple[dict[str, object], Slot | None]:
    """A rate's slot for the call ``task_id`` about to be sent (``on_limited="delay"``
    or ``"raise"``), as the header it rides in; none without one, or when the store is
    unreachable and fail_open sends the call anyway (its execution then asks). A call
    refused by its rate is told (``dispatch_rate_limited``): its execution never says
    so; so is one deferred to a later slot, returned here to be told once it is sent."""
    context, lock_name, options = call.facts, call.lock_name, call.options
    override = None
    try:
        mode = context.options.mode
        override = context.override(lock_name) if mode.asks_at_publish else None
        slot = mode.slot_at_publish(context.store, lock_name, call.call, options, override)
    except LockStoreUnavailableError as error:
        outages.at_dispatch(context, lock_name, error)  # fail_closed raises
        return {}, None
    except RateLimitedError as error:
        singleton_signals.send(
            singleton_signals.dispatch_rate_limited,
            call.task,
            lock_name,
            task_id=task_id,
            retry_after=error.retry_after,
            paused=override is not None and override.paused,
        )
        raise
    if slot is None:
        return {}, None
    countdown = options.get("countdown")  # "delay"'s, to the slot
    if isinstance(countdown, int | float):
        # No longer than the broker lets it wait unacked: it arrives early and is sent
        # on to its slot (``run/resend.defer``).
        options["countdown"] = context.one_hop(countdown)
    return {RATE_SLOT_HEADER: slot_header(slot.at, slot.clock)}, None if slot.now else slot


def deferred(call: Dispatch, task_id: str, slot: Slot) -> None:
    """The call ``task_id``, sent deferred to its rate's ``slot``: told
    (``dispatch_deferred``), as its execution, starting on it, says nothing."""
    singleton_signals.send(
        singleton_signals.dispatch_deferred,
        call.task,
        call.lock_name,
        task_id=task_id,
        slot=slot.at,
        delay=slot.wait,
        remaining=slot.remaining,
    )


def place_at_publish(call: Dispatch, task_id: str) -> dict[str, object]:
    """A place among the calls waiting for the key (``max_pending``), taken before the
    call ``task_id`` is published, as the header it rides in; ``BackpressureError`` when
    the key has as many waiting as it may (nothing sent, told: ``dispatch_backpressured``).
    Nothing without ``max_pending``, or when the store is unreachable and fail_open sends
    the call anyway."""
    context, lock_name = call.facts, call.lock_name
    cap = context.options.max_pending
    if cap is None:
        return {}
    try:
        # Kept for as long as the call may wait, its own countdown included (a hop).
        ttl = context.queue_ttl + delay_of(call.options)
        place = backlog_of(context.store).enter(lock_name, task_id, cap, ttl)
    except LockStoreUnavailableError as error:
        outages.at_dispatch(context, lock_name, error)  # fail_closed raises
        return {}
    if not place.taken:
        # One waiting call starts per interval of a rate: a place is likely free by then
        # (at the latest when the oldest place runs out by itself).
        spec = context.options.rate
        limits = spec.for_call(lock_name, *call.call) if spec is not None else None
        likely = max((rate.interval for rate, _ in limits), default=1.0) if limits else 1.0
        retry_after = min(likely, place.retry_after) if place.retry_after > 0 else likely
        singleton_signals.send(
            singleton_signals.dispatch_backpressured,
            call.task,
            lock_name,
            task_id=task_id,
            waiting=place.waiting,
            cap=cap,
            retry_after=retry_after,
        )
        raise BackpressureError(
            f"{lock_name!r} has {place.waiting} calls waiting, as many as max_pending="
            f"{cap} allows: try again in {retry_after:.3f}s (or raise max_pending)",
            name=lock_name,
            retry_after=retry_after,
            waiting=place.waiting,
            cap=cap,
        )
    return {BACKLOG_HEADER: "1"}


def stretch_place(context: TaskContext, lock_name: str, task_id: str, added: float) -> None:
    """The place of a call whose slot (``on_limited="delay"``) put off its run by ``added``
    seconds after the place was taken: renewed for the wait, when the place would have
    less than half its ``queue_ttl`` left as the run comes due. A shorter wait costs no
    round trip; a longer one (a backlog, a short ``queue_ttl``) one, so the place is not
    gone while its call still waits, letting in more than ``max_pending``."""
    if added <= context.queue_ttl / 2:
        return
    try:
        backlog_of(context.store).renew(lock_name, task_id, context.queue_ttl + added)
    except SingletonLockError as error:  # it is sent regardless, as a renewal at a hop is
        logger.warning("%s: the place of %s not renewed (%s)", lock_name, task_id, error)


def free_place(context: TaskContext, lock_name: str, task_id: str) -> None:
    """A call that took a place (``place_at_publish``) and then was not sent (refused
    by its rate, the broker or the store): the place is free again. Never an error: a
    place not freed runs out by itself."""
    with contextlib.suppress(SingletonLockError):
        backlog_of(context.store).leave(lock_name, task_id)


def send_in_line(call: Dispatch, own_headers: dict[str, object]) -> AsyncResult:
    """A call its mode sends without a hold (a rate, a limit): its place among the key's
    waiting calls (``max_pending``) and its rate's slot (``"delay"``, ``"raise"``) taken
    first; a call then not sent gives its place back."""
    context, lock_name, options = call.facts, call.lock_name, call.options
    task_id = call.new_task_id()
    own_headers.update(place_at_publish(call, task_id))
    placed = BACKLOG_HEADER in own_headers
    entered = delay_of(options) if placed else 0.0  # (no work for a call without a place)
    try:
        slot_headers, later = slot_at_publish(call, task_id)
        own_headers.update(slot_headers)
        if placed:
            stretch_place(context, lock_name, task_id, delay_of(options) - entered)
        sent = call.publish(task_id, options, own_headers)
    except BaseException:
        if BACKLOG_HEADER in own_headers:  # not sent: its place is free
            free_place(context, lock_name, task_id)
        raise
    if later is not None:
        deferred(call, task_id, later)  # once sent: no monitor sees a call never sent
    return sent


def can_overlap() -> bool:
    """Whether a held call Celery publishes through the app's producer (not eagerly, no
    ``connection=``: ``Dispatch.through_producer``) may take its hold while Celery builds
    the message."""
    # Only while nothing can observe the message before our gate: a before_task_publish
    # receiver (tracing, audit) would be told of a duplicate that is then never published.
    return not before_task_publish.receivers


class Gate:
    """The answer to a held call's acquire, checked once before its message leaves."""

    __slots__ = ("_call", "_sent", "checked")

    def __init__(self, call: Dispatch, sent: PendingAcquire) -> None:
        self._call = call
        self._sent = sent
        self.checked = False

    def check(self) -> None:
        """Return to publish; raise ``Refused`` for a duplicate, or the store error."""
        self.checked = True
        try:
            outcome = self._sent.outcome()
        except LockStoreUnavailableError as error:
            # fail_closed raises; fail_open publishes. The message's token then claims a
            # hold that may not exist, which only means it meets on_contention if taken.
            self._call.outage(error)
            return
        if isinstance(outcome, Contended):
            raise Refused(outcome)

    def give_back(self) -> None:
        """The message was not published: release the hold if one was granted."""
        store = self._call.facts.store
        try:
            outcome = self._sent.outcome()
        except LockStoreUnavailableError:
            return  # nothing known to give back; a hold would expire by its queue_ttl
        except SingletonLockError:
            # The server refused part of the exchange (an ACL without PTTL, say), maybe
            # after the hold was written: give it back by its token, owner-checked.
            try:
                store.release_token(self._sent.name, self._sent.token)
            except SingletonLockError as error:
                logger.warning(
                    "hold on %s not given back (%s): it expires by its queue_ttl",
                    self._call.lock_name,
                    error,
                )
            return
        if isinstance(outcome, Lease):
            outages.release_or_warn(store.release, outcome)


def send_gated(gate: Gate, call: Dispatch, *, via: object = None) -> AsyncResult | Contended:
    """Publish once the gate says the hold was taken (at once, or ``via`` the gated
    producer, which asks just before the message leaves); ``Contended``: refused,
    nothing sent (the caller answers it)."""
    try:
        if via is None:
            gate.check()
        result = call.publish_held(via)
    except Refused as refused:
        call.refused(refused.held)
        return refused.held
    except BaseException:
        # Whatever stopped the message (Celery's own validation, the broker), the
        # caller may try again: a hold granted to a message never sent is given back.
        gate.give_back()
        raise
    if not gate.checked:  # Celery returned without publishing through the gate
        gate.give_back()
    call.accepted()
    return result


class GatedProducer:
    """Celery's producer, made to wait for the gate before a message leaves."""

    __slots__ = ("_gate", "_producer")

    def __init__(self, producer: Producer, gate: Gate) -> None:
        self._producer = producer
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        # Everything else is Celery's producer's own (a proxy: typed as kombu types it).
        return getattr(self._producer, name)

    def publish(self, *args: object, **kwargs: object) -> object:
        if not self._gate.checked:  # Celery may call again to retry a failed publish
            self._gate.check()
        # kombu leaves Producer.publish untyped.
        return self._producer.publish(*args, **kwargs)  # type: ignore[no-untyped-call]
