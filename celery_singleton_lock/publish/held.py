"""A call that holds its lock before it is sent: the hold planned, taken (in the push's
own script, ``LockRide.publish_held``, or overlapped with Celery building the message), a
duplicate answered.

``publish.route`` sends here every call its mode checks at dispatch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exceptions import LockStoreUnavailableError
from ..lease import HOLD, Contended
from .dispatch import Gate, GatedProducer, can_overlap, long_wait, send_gated
from .duplicates import answer_duplicate
from .refusals import refusals
from .replacement import Replacement

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from .call import Dispatch


def send_held(call: Dispatch) -> AsyncResult:
    """Publish a call that holds its lock first; a duplicate is answered, not sent."""
    facts = call.facts
    mode = facts.mode
    # What the hold's take, swap or read writes in a kept history (given as ``entry``),
    # which names the call's task id; without one, the id is made once no read answered
    # the call (``plan_hold``).
    call.record = facts.record(
        call.lock_name,
        call.new_task_id() if facts.keeps_history else None,
        take=("accepted", "refused", ""),
        swap=("replaced", "", ""),
        read=("", "refused", ""),
    )
    # The lock whose holder answers a duplicate with one read (None: a swap answers it).
    asked = mode.answered_by(call.lock_name)
    # A storm of one call's duplicates: one read answers it before anything is built.
    early = None if asked is None else call.answered_early(asked)
    if early is not None:
        return answer_duplicate(call, early)
    options = call.options
    mode.prepare(call.task.name, options)
    # A debounce's own window, past the broker's: hops.
    call.plan_hold(long_wait(facts, options))
    # The hold in the push's script, where the app rides; else a round trip of its own.
    sent = facts.ride.publish_held(call, swaps=asked is None)
    if sent is not None:
        return answered(call, sent)
    through_producer = call.through_producer()
    try:
        sent = facts.store.begin_try_acquire(
            call.hold, call.ttl, token=call.token, take=HOLD, entry=call.record
        )
    except LockStoreUnavailableError as error:
        call.outage(error)  # fail_closed raises
        return call.publish_unheld()
    gate = Gate(call, sent)
    if refusals.expects(call.lock_name) or not (through_producer and can_overlap()):
        return answered(call, send_gated(gate, call))
    # The acquire is on its way; Celery builds the message meanwhile and the gated
    # producer waits for the answer just before anything is published.
    with call.facts.app.producer_or_acquire(call.producer) as real:
        return answered(call, send_gated(gate, call, via=GatedProducer(real, gate)))


def answered(call: Dispatch, sent: AsyncResult | Contended) -> AsyncResult:
    """The call's result, or its answer when it was refused: the holder's result (or
    ``DuplicateTaskError``), or with replace, the queued call's with this call's
    arguments (``Replacement``, built only for a mode that replaces)."""
    if not isinstance(sent, Contended):
        return sent
    answer = call.facts.mode.answer_refused(
        lambda held: answer_duplicate(call, held), lambda: Replacement(call)
    )
    return answer(sent)
