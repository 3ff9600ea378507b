"""A refused call that replaces the queued call's arguments (``on_duplicate="replace"``,
``debounce``, ``cancel``): ``Replacement``, reading the refused call (``Dispatch``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from celery.utils import uuid

from ..exceptions import LockStoreUnavailableError
from ..lease import HOLD, Contended, Lease, append_history
from ..lease.offers import Offered, offers_of
from ..modes import arguments
from ..modes.stages import Replacing
from ..tokens import TOKEN_HEADER, holder_task_id, queued_form, read_token
from .dispatch import long_wait
from .duplicates import answer_duplicate

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from .call import Dispatch

logger = logging.getLogger(__name__)

# Holders whose message has not started: a queued hold or a worker's reservation of it.
REPLACEABLE = ("q|", "r|")
# Tries against a hold that keeps changing under a storm of replacing calls, after
# which the call is answered as a duplicate of the latest holder.
ATTEMPTS = 5


def offer_of(call: Dispatch) -> Callable[[str, str], Offered] | None:
    """How a call leaves its arguments for a started execution of the pending call,
    serialized as its message would be; None where the store cannot keep them (a
    Redlock)."""
    offers = offers_of(call.facts.store)
    if offers is None:
        return None
    serializer = str(call.options.get("serializer") or call.task.serializer)

    def offer(hold: str, holder: str) -> Offered:
        value = arguments.dump(serializer, *call.call)
        return offers.offer(hold, holder, value)

    return offer


class Replacement:
    """What a dispatch needs to replace the queued call it was refused by.

    The later call publishes a new message under the queued call's task id and moves the
    queued hold to it in one compare-and-swap (``RedisLock.swap``): only while the holder
    is a queued or reserved message, never a running one (replace never cancels a run).
    The replaced message finds the hold taken by another message of its own id when it
    arrives, and the worker drops it quietly (``run/execution.py``): acked, no result, not
    REVOKED, which Celery's revoke by id would also do to its replacement.
    """

    def __init__(self, call: Dispatch) -> None:
        self._call = call
        facts = call.facts
        self._mode, self._store, self._queue_ttl = facts.mode, facts.store, facts.queue_ttl
        self._task_name = call.task.name
        self._result = call.task.AsyncResult  # the task's AsyncResult for a task id
        self._name, self._hold, self._ttl = call.lock_name, call.hold, call.ttl
        self._ours = call.own_headers
        # As the caller gave them: the first publish consumed its copy.
        self._options = dict(call.options)
        self._entry = call.record  # what the take or the swap writes in a kept history
        self._offer = offer_of(call)  # this call's arguments left for a started execution

    def _refused(self, held: Contended) -> AsyncResult:
        """Answer the call as a duplicate of ``held``."""
        return answer_duplicate(self._call, held)

    def _outage(self, error: LockStoreUnavailableError) -> None:
        self._call.outage(error)

    def __call__(self, held: Contended) -> AsyncResult:
        for _ in range(ATTEMPTS):
            holder = held.holder
            queued_id = holder_task_id(holder)
            if holder and (queued_id is None or not holder.startswith(REPLACEABLE)):
                answer = self._started(held, queued_id)
                if not isinstance(answer, Contended):
                    return answer
                held = answer  # it let go of the hold: try again against who has it now
                continue
            try:
                ridden = self._ridden(holder, queued_id) if queued_id is not None else None
                if ridden is not None and queued_id is not None:
                    if isinstance(ridden, Lease):
                        self._log(holder, queued_id)
                        return self._result(queued_id)
                    held = ridden
                    continue
                outcome, queued_id, token, ttl, options = self._take_place(holder, queued_id)
            except LockStoreUnavailableError as error:
                self._outage(error)  # fail_open: as a duplicate
                return self._refused(held)
            if isinstance(outcome, Lease):
                self._send(outcome, holder, queued_id, token, ttl, options)
                return self._result(queued_id)
            # It changed meanwhile (a worker reserved it, another call replaced it, it
            # started): try again against whoever holds it now.
            held = outcome
        return self._refused(held)

    def _started(self, held: Contended, queued_id: str | None) -> AsyncResult | Contended:
        """Held by an execution: a run in progress covers this call (its result); a
        started pending call that waits for the key takes this call's arguments and runs
        with them (``lease.offers``), unless it has let go of its hold meanwhile."""
        holder = held.holder
        waiting = self._mode.hold_role is not None and read_token(holder).state == "running"
        if self._offer is None or not waiting or queued_id is None:
            return self._refused(held)
        try:
            offered = self._offer(self._hold, holder)
        except LockStoreUnavailableError as error:
            self._outage(error)  # fail_open: as a duplicate
            return self._refused(held)
        if not offered.kept:
            return replace(held, holder=offered.holder)
        # Where a history is kept: this call's arguments went to the waiting execution.
        append_history(self._store, self._entry, "replaced", holder=holder)
        self._log(holder, queued_id)
        return self._result(queued_id)

    def _ridden(self, holder: str, queued_id: str) -> Lease | Contended | None:
        """The swap and the new message's push in one round trip (None: cannot ride,
        ``LockRide.replace_held``)."""
        # A call whose own publish did not ride has no successor built for nothing.
        if not self._call.rides or not holder:
            return None
        token, ttl, options = self._successor(queued_id, holder)
        replacing = Replacing(
            holder=holder,
            record=queued_form(holder),
            task_id=queued_id,
            token=token,
            ttl=ttl,
            options=dict(options),
            headers={**self._ours, TOKEN_HEADER: token},
        )
        return self._call.facts.ride.replace_held(self._call, replacing)

    def _successor(self, queued_id: str, holder: str) -> tuple[str, float, dict[str, object]]:
        """(token, hold ttl, publish options) of the message replacing ``holder``'s."""
        token, ttl, options = self._mode.successor(
            queued_id, holder, self._options, self._ttl, self._queue_ttl
        )
        # A successor's countdown past the broker's visibility_timeout: sent in hops, as
        # the first call's was.
        long_wait(self._call.facts, options)
        return token, ttl, options

    def _log(self, holder: str, queued_id: str) -> None:
        if holder:
            logger.info(
                "%s: queued call %s takes a later call's arguments for %r",
                self._task_name,
                queued_id,
                self._name,
            )

    def _take_place(
        self, holder: str, queued_id: str | None
    ) -> tuple[Lease | Contended, str, str, float, dict[str, object]]:
        """Swap the queued call's hold to a new message of its id; or, if the hold is free
        now (the queued call started), take it for a new call like a fresh dispatch."""
        store = self._store
        if not holder or queued_id is None:
            queued_id = uuid()
            token = self._mode.token(queued_id)
            outcome = store.try_acquire(
                self._hold, self._ttl, token=token, take=HOLD, entry=self._entry
            )
            return outcome, queued_id, token, self._ttl, self._options
        token, ttl, options = self._successor(queued_id, holder)
        # Recorded as the queued hold it was made from: the replaced message asks by that.
        outcome = store.swap(
            self._hold, holder, ttl, token=token, record=queued_form(holder), entry=self._entry
        )
        return outcome, queued_id, token, ttl, options

    def _send(  # noqa: PLR0917  (one replacement's whole state)
        self,
        place: Lease,
        holder: str,
        queued_id: str,
        token: str,
        ttl: float,
        options: dict[str, object],
    ) -> None:
        try:
            self._call.publish(queued_id, options, {**self._ours, TOKEN_HEADER: token})
        except BaseException:
            # A replaced message is still queued: give its hold back, or it would be
            # dropped as replaced by a message that was never sent.
            self._give_back(place, holder, ttl)
            raise
        self._log(holder, queued_id)

    def _give_back(self, place: Lease, holder: str, ttl: float) -> None:
        store = self._store
        try:
            if holder:
                store.swap(self._hold, place.token, ttl, token=holder)
            else:
                store.release(place)
        except LockStoreUnavailableError as error:
            logger.warning(
                "%s: the replaced call's hold could not be restored (%s)", self._name, error
            )
