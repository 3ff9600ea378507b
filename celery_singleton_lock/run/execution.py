"""One execution's way to its running lease: the message's own hold, a slot, contention, requeue.

The message names its key and its own hold (``tokens.py``; which holds: ``Execution``).
Without one, or when it is gone, the execution contends: ``on_contention`` waits (push
wake-up), requeues with backoff, skips or fails; a redelivered copy of the holder is dropped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NoReturn

from celery import states
from celery.exceptions import Ignore, Reject
from celery.utils.dispatch import Signal

from .. import outages
from .. import signals as singleton_signals
from ..context import Delivery, TaskContext
from ..exceptions import (
    ConfigurationError,
    DuplicateTaskError,
    LockNotAcquiredError,
    LockStoreUnavailableError,
)
from ..holders import is_running_copy
from ..lease import Contended, Lease, LockStore, append_history
from ..lease.history import Record
from ..lease.limits.turns import Kept
from ..modes import Mode, Start
from ..outages import release_or_warn
from ..policies import (
    ContentionState,
    Decision,
    Fail,
    Requeue,
    Skip,
    Wait,
    decided_ahead,
    described,
)
from ..tokens import (
    ATTEMPT_HEADER,
    HOLD_HEADER,
    NAME_HEADER,
    REDRIVE_HEADER,
    RETRY_OF_HEADER,
    TOKEN_HEADER,
    HandedLease,
    header,
    header_count,
    holder_state,
    holder_task_id,
    redrive_shape,
    reserved_exact,
    running_token,
)
from .admission import admit
from .contended import contended
from .holds import PendingHold
from .in_turn import send_handed, wait_for_turn, waiter_of
from .places import leave_place
from .resend import send_again

logger = logging.getLogger(__name__)


class Execution:
    """The running lease of one delivery of a task's message, taken once by ``take()``.

    The message's own hold is a queued hold or the worker's reservation of it on the key
    (taken over in one step), a pending call's hold beside the key (``holds.py``: let go
    once the run has the key), or a retry's slot of a counting lease (taken back).
    """

    def __init__(
        self, delivery: Delivery, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> None:
        request = delivery.request
        self.delivery = delivery
        self.context = context = delivery.context
        opts = context.options
        self.lock_name: str = header(request, NAME_HEADER) or opts.key.derive(args, kwargs)
        self.call: tuple[Sequence[object], Mapping[str, object]] = (args, kwargs)
        self.mode: Mode = opts.mode
        self.store: LockStore = context.store
        # The running lease the worker took for this message as it arrived, if it did.
        self.handed = None if request.is_eager else HandedLease.take(request, request.id)

    def take(self) -> Lease:
        """The running lease, handed or taken now; a kept history records the start, a
        contention (a built-in policy's decision) and a rate's deferral in their round trips."""
        try:
            lease = self._handed() or self._take()
        except BaseException:
            # Not run (skipped, dropped, refused), unless it was sent round again: its
            # place among the key's waiting calls (max_pending) is free.
            leave_place(self.delivery, self.lock_name)
            raise
        leave_place(self.delivery, self.lock_name)  # it runs: the next call may queue
        return lease

    @property
    def also_held(self) -> list[Lease]:
        """What the run holds besides its lease (a ``total_limit``'s slot), once taken."""
        start = getattr(self, "start", None)
        return list(start.held) if start is not None else []

    def _handed(self) -> Lease | None:
        handed = self.handed
        if handed is not None and handed.fence is not None and handed.name == self.lock_name:
            # No round trip: the worker's main process took it, fenced, for this message
            # (and wrote its start in a kept history). Nothing else is read of it.
            lease = Lease.handed(
                handed.name,
                handed.key,
                handed.token,
                fence=handed.fence,
                ttl=handed.ttl,
                expires_at=handed.expires_at,
            )
            self.store.renew(lease)
            return lease
        self._plan()
        return None

    def _plan(self) -> None:
        """What taking the running lease needs when it was not handed, fenced, for this
        message: read from the message's headers."""
        request, context = self.delivery.request, self.context
        self.queued: str | None = header(request, TOKEN_HEADER)
        self.role: str | None = header(request, HOLD_HEADER)
        self.attempt = header_count(request, ATTEMPT_HEADER)
        # A built-in policy's decision, known before the holder is: the take meeting the
        # contention writes it in a kept history, in its own round trip (asked only then).
        state = ContentionState(self.delivery.name, self.lock_name, self.attempt)
        self.ahead: Decision | None = (
            decided_ahead(context.options.on_contention, state) if context.keeps_history else None
        )
        hostname = request.hostname
        self.token = running_token(request.id, hostname or "eager", os.getpid())
        # The message's own hold: as queued at dispatch, or as reserved by the worker's
        # main process when it received the message.
        self.shape: tuple[str, str] | None
        if header_count(request, REDRIVE_HEADER):
            self.shape = redrive_shape()  # a re-drive has no hold or reservation of its own
        else:
            # Exactly this message's reservation: a replacement of its arguments (same
            # task id, sent later) reserved on this host must never pass for it.
            self.shape = reserved_exact(request.id, self.queued) if self.queued else None
        if self.handed is not None and self.handed.fence is None:
            # Taken, but its answer is unknown: take the key over from it, as from a hold.
            self.shape = (self.handed.token, "")
        self.ttl: float = context.ttl
        # What the mode needs to take the running lease: the key, and the message's own
        # hold on it (taken over) or beside it (role; the lease is then taken afresh).
        # A kept history records the start, a contention (a built-in policy's decision)
        # and a rate's deferral in their round trips.
        self.start = Start(
            name=self.lock_name,
            token=self.token,
            ttl=self.ttl,
            queued=self.queued,
            shape=self.shape,
            role=self.role,
            store=self.store,
            entry=self._record(contended=self.ahead is not None),
            override=self.context.override(self.lock_name),
        )
        # A call that may wait for its turn of a total (round robin): its message, kept.
        waiter = waiter_of(self.delivery, self.mode, self.start, self.call)
        if waiter is not None:
            self.start = replace(self.start, waiter=waiter)

    def _record(self, *, contended: bool) -> Record | None:
        said = {"take": {"decision": described(self.ahead)}} if self.ahead else {}
        return self.context.record(
            self.lock_name,
            self.delivery.request.id,
            refused=said,
            rate=("", "rate-limited", ""),
            take=("started", "contended" if contended else "", ""),
        )

    def _take(self) -> Lease:
        try:
            return self._take_turn()
        finally:  # the calls whose turn came meanwhile (handed out, or given back by a pause)
            send_handed(self.delivery, self.start.handed)

    def _take_turn(self) -> Lease:
        hold = None
        try:
            self.start = admit(self.delivery, self.mode, self.start, self.call)
            waiting = self.mode.waiting_hold(self.role)
            if waiting is not None:
                hold = PendingHold(
                    self.context,
                    self.delivery.request.id,
                    self.lock_name,
                    waiting.role,
                    self.queued,
                    self.shape,
                    self.token,
                    offered=waiting.offered,
                )
                if waiting.offered:
                    # Claimed before the key, in one step: a later call can no longer
                    # replace this message once it has passed this point.
                    # (the call's own hold, recorded nowhere: the run's start is the key's)
                    self._unless_replaced(hold.claim())
            outcome = self.mode.take(self.start)
        except LockStoreUnavailableError as error:
            return self._unreachable(error)
        if isinstance(outcome, Kept):
            wait_for_turn(self.delivery, outcome)
        if isinstance(outcome, Contended):
            if hold is None:
                self._unless_replaced(outcome)
            try:
                outcome = self._contend(outcome, hold)
            finally:
                if hold is not None:
                    hold.let_go()
        elif hold is not None:
            # The run has the key: the next call may queue (and will see this run's data).
            hold.let_go()
        newer = hold.offered() if hold is not None else None
        if newer is not None:  # the newest call's arguments: this run is for it too
            self.delivery.request.args, self.delivery.request.kwargs = self.call = newer
        self.mode.running(outcome, self.start)
        self.store.renew(outcome)
        for also in self.start.held:  # a total_limit's slot: renewed with the run
            self.store.renew(also)
        return outcome

    def _unreachable(self, error: LockStoreUnavailableError) -> Lease:
        """The lock store did not answer: run unlocked (fail_open) or go again later."""
        outage = outages.at_execution(self.context, self.delivery.request, self.lock_name, error)
        if not isinstance(outage, Lease):
            send_again(
                self.delivery,
                self.lock_name,
                self.attempt,
                outage.countdown,
                outages=outage.outages,
            )
        return outage

    def _unless_replaced(self, held: Contended | None) -> None:
        """Drop this message quietly if a later one of the same task id took its place.

        ``on_duplicate="replace"`` sends the new arguments under the queued call's task
        id; the replaced message must neither run nor touch its replacement's hold, nor
        end REVOKED or with a result: its callers' AsyncResult is the replacement's.
        Its mode tells (``Mode.replaced``).
        """
        request = self.delivery.request
        if held is None or not self.mode.replaced(held, self.start, request.id):
            return
        logger.info(
            "%s[%s] dropped: a later call replaced its arguments for %r",
            self.delivery.name,
            request.id,
            self.lock_name,
        )
        self._dropped("replaced by a later call under the same task id", held.holder)
        raise Ignore("replaced by a later call under the same task id")

    def _is_copy(self, held: Contended) -> bool:
        """Whether the holder is this very message, running under another delivery."""
        request = self.delivery.request
        return not request.is_eager and is_running_copy(
            self.context.app, request, held.holder, retry_of=header(request, RETRY_OF_HEADER)
        )

    def _signal(self, signal: Signal, **fields: object) -> None:
        singleton_signals.send(signal, self.delivery.sender, self.lock_name, **fields)

    def _drop_copy(self, held: Contended) -> NoReturn:
        """End this delivery without a trace under its id: Ignore stores no state, fires
        no errback, and acks (Celery's tracer); the original's result stays its own.

        A copy of the holder's own message (same task id: a redelivery) is dropped whatever
        the policy: it must not write a state or result under the id its original is
        running as."""
        delivery, request = self.delivery, self.delivery.request
        state = holder_state(held)
        self._signal(singleton_signals.copy_dropped, task_id=request.id, holder_state=state)
        logger.info(
            "copy of %s task dropped: task=%s id=%s lock=%s",
            state,
            delivery.name,
            request.id,
            self.lock_name,
        )
        self._dropped("a copy of the holder, its own message delivered again", held.holder)
        raise Ignore(f"a copy of {request.id}, which holds {self.lock_name!r} ({state})")

    def _dropped(self, why: str, holder: str) -> None:
        """A kept history's entry for a message dropped after its take met the holder
        (that take's entry said what a contention does: this one did not contend)."""
        record = self.context.record(self.lock_name, self.delivery.request.id)
        append_history(self.store, record, "dropped", holder=holder, detail=why)

    def _skip(self, decision: Skip, holder: str | None) -> NoReturn:
        """End quietly in IGNORED, which callers can tell from SUCCESS and FAILURE."""
        delivery = self.delivery
        if delivery.keeps_results:
            delivery.store_state({"skipped": decision.reason}, states.IGNORED)
        self._signal(
            singleton_signals.execution_skipped, task_id=delivery.request.id, holder_id=holder
        )
        raise Ignore(decision.reason)

    def _contend(self, held: Contended, hold: PendingHold | None) -> Lease:
        delivery = self.delivery
        if self._is_copy(held):
            self._drop_copy(held)
        policy = self.context.options.on_contention
        state = ContentionState(
            task_name=delivery.name,
            name=self.lock_name,
            attempt=self.attempt,
            holder=holder_task_id(held.holder) or held.holder or None,
            retry_after=held.retry_after,
        )
        decision = policy(state)
        if isinstance(self.ahead, Requeue):
            decision = self.ahead  # the countdown the take's history entry says
        contended(self.delivery, self.lock_name, state, holder_state(held), decision)
        if self.ahead is None:  # a policy of the user's own: its decision, a round trip of its own
            record = self.context.record(self.lock_name, delivery.request.id)
            append_history(
                self.store,
                record,
                "contended",
                holder=state.holder or "-",
                decision=described(decision),
            )
        if isinstance(decision, Wait):
            if hold is not None:
                hold.keep()  # still the pending call while it waits
            try:
                # The history records the start, no further contention.
                start = replace(self.start, entry=self._record(contended=False))
                return self.mode.take_waiting(start, self.context.waiting, decision.timeout)
            except LockStoreUnavailableError as error:
                # Cut off mid-wait (the wait ends by its timeout plus a grace): the
                # outage policy, as for the first try.
                return self._unreachable(error)
            except LockNotAcquiredError as error:
                state = ContentionState(
                    task_name=delivery.name,
                    name=self.lock_name,
                    attempt=self.attempt,
                    holder=holder_task_id(error.holder) or error.holder,
                    retry_after=error.retry_after,
                    waited=True,
                )
                decision = policy(state)
                # Told again: what it does once its wait ran out.
                contended(delivery, self.lock_name, state, "", decision)
        if isinstance(decision, Requeue):
            send_again(delivery, self.lock_name, self.attempt + 1, decision.countdown, hold=hold)
        if isinstance(decision, Skip):
            self._skip(decision, state.holder)
        if isinstance(decision, Fail):
            raise DuplicateTaskError(
                f"{delivery.name}[{delivery.request.id}] did not run: {decision.reason}",
                name=self.lock_name,
                key=held.key,
                task_id=state.holder,
            )
        raise ConfigurationError(f"{delivery.name}: contention policy returned {decision!r}")


def failed_run(context: TaskContext, request: object, error: Exception, lease: Lease) -> None:
    """A run that raised (a retry's attempt included): a mode that reopens after a
    failure (``reopen_on``) lets the next call in now. ``Ignore`` and ``Reject`` are
    ends the task chose, not failures."""
    if not isinstance(error, Ignore | Reject):
        store = context.store
        release_or_warn(lambda _: context.options.mode.ended("failure", store, request), lease)
