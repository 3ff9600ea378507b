"""``on_duplicate="replace"``: a later call's arguments swapped into the queued call.

The queued call keeps its task id, so every caller holds the ``AsyncResult`` of the run
that will cover its call (how: ``Replacement``). ``Replaces`` is what a refused call gets,
composed with either scope that queues a call; its docstring says each stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from celery.utils import uuid

from ..exceptions import LockStoreUnavailableError
from ..lease import HOLD, Contended, Lease, LockStore, append_history
from ..tokens import TOKEN_HEADER, holder_task_id, is_reservation_of, queued_form, read_token
from .base import Mode, Publish, Replacing
from .choosing import Choice
from .refusal import Answer, HolderRow, Refusal
from .until_executed import UntilExecuted
from .until_executing import UntilExecuting

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from ..lease.history import Record
    from ..lease.offers import Offered

logger = logging.getLogger(__name__)

# Holders whose message has not started: a queued hold or a worker's reservation of it.
REPLACEABLE = ("q|", "r|")
# Tries against a hold that keeps changing under a storm of replacing calls, after
# which the call is answered as a duplicate of the latest holder.
ATTEMPTS = 5


class RidingReplace(Protocol):
    """Send a replacing call's message with the swap in its push's round trip: the
    ``Lease`` of the new hold, ``Contended`` (the queued call changed; nothing sent), or
    None when it cannot ride (the swap is then a round trip of its own)."""

    def __call__(self, replacing: Replacing, publish: Publish) -> Lease | Contended | None: ...


class Replaces(Refusal):
    """A refused call's arguments swapped into the queued call (``on_duplicate="replace"``;
    debounce and cancel compose it too), whatever scope holds it (on the key, or pending
    beside it with ``lock="until_executing"``).

    - publish: a call refused by a queued or reserved holder replaces it (``Replacement``);
      one refused by a running holder gets that run's result.
    - receipt: the worker reserves the hold, as every holding mode does.
    - start: a replaced message finds its hold swapped and is dropped quietly; a pending
      call's waiting run takes the arguments later calls leave for it.
    - end: as the scope.
    """

    name = "replace"
    looked_at_start = True  # a replaced message must be looked at when its run starts
    offered = True

    def answered_by(self, hold: str | None) -> str | None:
        # The answer to a duplicate is a swap: asked as the message is sent.
        return None

    def answer(self, duplicate: Answer, replacement: Callable[[], Answer]) -> Answer:
        return replacement()

    def unless_replaced(self, queued: str | None) -> str | None:
        return queued

    def replaced(self, held: Contended, queued: str | None, token: str, task_id: str) -> bool:
        """The store says so (``replaced``, recorded by the swap), or the hold is held by
        another message of this task id that is not running (not a copy of this one)."""
        if held.replaced:
            return True
        holder = read_token(held.holder)
        if holder.task_id != task_id or holder.state == "running":
            return False  # another call's, or this message's original running: a copy
        if held.holder in (queued, token):
            return False
        return not (queued and is_reservation_of(held.holder, task_id, queued))

    def new_call(self, hold: HolderRow | None) -> str | None:
        if hold is not None and hold.state in ("queued", "reserved"):
            return f"accepted: replaces the arguments of {hold.task_id} ({hold.state})"
        return None


REPLACES = Replaces()


# With either scope that queues a call: on the key, or pending beside it.
CHOICE = Choice(
    "replace",
    {"on_duplicate": "replace", "lock": ("until_executed", "until_executing")},
    lambda chosen: (UntilExecuting if chosen.lock == "until_executing" else UntilExecuted)(
        REPLACES
    ),
)


class Replacement:
    """What a dispatch needs to replace the queued call it was refused by.

    The later call publishes a new message under the queued call's task id and moves the
    queued hold to it in one compare-and-swap (``RedisLock.swap``): only while the holder
    is a queued or reserved message, never a running one (replace never cancels a run).
    The replaced message finds the hold taken by another message of its own id when it
    arrives, and the worker drops it quietly (``run/execution.py``): acked, no result, not
    REVOKED, which Celery's revoke by id would also do to its replacement.
    """

    def __init__(
        self,
        *,
        mode: Mode,
        task_name: str,
        store: LockStore,
        queue_ttl: float,
        result: Callable[[str], AsyncResult],
        name: str,
        hold: str,
        ttl: float,
        own_headers: dict[str, object],
        options: dict[str, object],
        publish: Publish,
        refused: Callable[[Contended], AsyncResult],
        outage: Callable[[LockStoreUnavailableError], None],
        ride: RidingReplace | None = None,
        entry: Record | None = None,
        offer: Callable[[str, str], Offered] | None = None,
        long_wait: Callable[[dict[str, object]], None] | None = None,
    ) -> None:
        # A successor's countdown past the broker's visibility_timeout: sent in hops
        # (``publish.dispatch.long_wait``), as the first call's was.
        self._long_wait = long_wait
        self._offer = offer  # this call's arguments left for a started execution
        self._ride = ride  # the swap in the push's round trip, where the broker allows
        self._entry = entry  # what the take or the swap writes in a kept history
        self._refused = refused  # answer the call as a duplicate of ``held``
        self._outage = outage  # the task's singleton_lock_on_redis_error, at dispatch
        self._mode = mode
        self._task_name = task_name
        self._store = store
        self._queue_ttl = queue_ttl
        self._result = result  # the task's AsyncResult for a task id
        self._name = name  # the lock's
        self._hold = hold
        self._ttl = ttl
        self._ours = own_headers
        self._options = options  # as the caller gave them: the first publish consumed its copy
        self._publish = publish

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
        """The swap and the new message's push in one round trip (None: cannot ride)."""
        if self._ride is None or not holder:
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
        return self._ride(replacing, self._publish)

    def _successor(self, queued_id: str, holder: str) -> tuple[str, float, dict[str, object]]:
        """(token, hold ttl, publish options) of the message replacing ``holder``'s."""
        token, ttl, options = self._mode.successor(
            queued_id, holder, self._options, self._ttl, self._queue_ttl
        )
        if self._long_wait is not None:
            self._long_wait(options)
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
            self._publish(queued_id, options, {**self._ours, TOKEN_HEADER: token})
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
