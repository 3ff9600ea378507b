"""The worker's reservations: a received message's hold, made this worker's and renewed.

A received message's queued hold (``queue_ttl`` long, taken at dispatch) becomes a
*reservation* of this worker (``ttl`` long, renewed by its main process) in one step: a worker
killed with prefetched or ETA messages frees their keys within ``ttl``, not ``queue_ttl``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from celery.worker import state as worker_state

from ..broker.pushes import RidingTake
from ..broker.ride import lock_ride
from ..config.options import is_singleton
from ..context import TaskContext
from ..exceptions import SingletonLockError
from ..lease import Lease, PendingAcquire, RedisLock, Redlock, Server, TakeOver, companion
from ..lease.history import Record
from ..tokens import (
    ETA_HEADER,
    HOLD_HEADER,
    NAME_HEADER,
    TOKEN_HEADER,
    HandedLease,
    header,
    reserved_token,
    running_token,
)

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

# A delivery due this far or more before its call's own ETA is a hop its run only sends
# on: reserved, not started (no running lease, no start in a kept history, per hop).
EARLY = 1.0


@dataclass
class Reservation:
    """One received message's hold, as this worker holds it until its run starts."""

    context: TaskContext
    lease: Lease  # as sent (renewed from here); its fence is 0 until the answer is read
    queued: str  # the hold's token at dispatch, to give the key back to at shutdown
    running: bool  # taken as the running lease, to hand to the run
    fence: int | None = None  # the running lease's, once its answer is read


class Reservations:
    """This worker's reservations by task id.

    Entries live from the message's receipt until its run starts, it is revoked
    or expires, or the worker shuts down: nothing outlives the message. A killed worker's
    prefetched or ETA messages come back from the broker in time and run: their keys are
    free by then (within ``ttl``).

    Where the mode allows (``Mode.starts_at_receipt``), the one step that reserves takes
    the running lease itself, fenced: the main process hands it to the run with the
    request (``handed``), and the run starts without a round trip of its own. Otherwise
    the run takes the reservation over as it starts.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[str, Reservation] = {}
        # Reservations sent whose answers are not read yet, oldest first.
        self._unread: list[tuple[str, PendingAcquire]] = []
        # The take that rode the last received message's unacked bookkeeping.
        self._ridden: tuple[str, _Plan, RidingTake] | None = None

    def __len__(self) -> int:
        return len(self._held)

    def take(self, context: TaskContext, task_id: str, hostname: str, headers: object) -> None:
        """Reserve a received message's hold without waiting: the consumer loop is the
        worker's bottleneck.

        ``headers``: the message's (a request, or the headers themselves): its lock,
        its hold's token, and where the hold lives (``Received``).
        The reservation is renewed from the start as the lease it would grant; its
        answer is read with the next message or when the run starts, and a refusal
        only stops that renewal (an extend would have found it not ours anyway). It is
        sent whole (the script's body), so a server that lost its scripts applies it at
        once rather than when the answer is read.
        """
        # Planned already when its take rode the unacked bookkeeping, right before.
        planned = self._claim_ridden(task_id)
        plan, ridden = planned or (_plan(context, task_id, hostname, Received.of(headers)), None)
        if plan is None:
            return  # sent without a hold (send_task, canvas): nothing to reserve
        self.read_answers()
        store = context.store
        if ridden is not None and ridden.outcome is not None:
            # Taken already, in the pipeline that recorded the message as unacked.
            outcome = ridden.outcome
            if isinstance(outcome, Lease):
                store.renew(outcome)
                with self._guard:
                    self._held[task_id] = Reservation(
                        context, outcome, plan.queued, plan.running, fence=outcome.fence
                    )
            return
        try:
            sent = store.begin_try_acquire(
                plan.name,
                context.ttl,
                # A take that rode but whose answer was lost may have been applied:
                # the same token counts as free, so this one gets the same answer.
                token=plan.token,
                take=plan.take_over,
                read_late=True,
                entry=_started(context, plan, task_id),
            )
        except SingletonLockError as error:
            logger.warning("could not reserve %s for %s: %s", plan.name, task_id, error)
            return
        lease = sent.lease_if_granted()
        if lease is None:
            return  # the hold is gone or taken (a redelivery): the run will contend
        store.renew(lease)
        with self._guard:
            self._held[task_id] = Reservation(context, lease, plan.queued, plan.running)
            self._unread.append((task_id, sent))

    def ride(
        self, app: Celery, hostname: str, headers: Mapping[str, object], server: Server
    ) -> RidingTake | None:
        """The take of a message being received, to ride the pipeline the broker (on
        ``server``) sends to record it as unacked; None when it cannot ride (another
        task, no hold, a lock store elsewhere or as another user). ``take`` finds its
        answer when the message's request is made, right after, on this thread."""
        task_name, task_id = headers.get("task"), headers.get("id")
        task = app.tasks.get(task_name) if isinstance(task_name, str) else None
        if task is None or not is_singleton(task) or not isinstance(task_id, str):
            return None
        context: TaskContext = task.singleton_context
        plan = _plan(context, task_id, hostname, Received.of(headers))
        if plan is None:
            return None
        try:
            take = lock_ride(app).take_on_receipt(
                context,
                server,
                plan.name,
                token=plan.token,
                take=plan.take_over,
                entry=_started(context, plan, task_id),  # written by the riding take
            )
        except SingletonLockError:
            return None  # the take on its own round trip will say what is wrong
        with self._guard:
            self._ridden = (task_id, plan, take) if take is not None else None
        return take

    def _claim_ridden(self, task_id: str) -> tuple[_Plan, RidingTake] | None:
        with self._guard:
            ridden, self._ridden = self._ridden, None
        return ridden[1:] if ridden is not None and ridden[0] == task_id else None

    def read_answers(self, task_id: str | None = None) -> None:
        """Read the answers of reservations sent so far (or of ``task_id``'s alone)."""
        with self._guard:
            if task_id is None:
                mine, self._unread = self._unread, []
            else:
                mine = [entry for entry in self._unread if entry[0] == task_id]
                self._unread = [entry for entry in self._unread if entry[0] != task_id]
        for reserved_id, sent in mine:
            try:
                outcome = sent.outcome()
            except SingletonLockError as error:
                logger.warning("could not reserve %s for %s: %s", sent.name, reserved_id, error)
                outcome = None
            with self._guard:
                entry = self._held.get(reserved_id)
            if entry is None:
                continue
            if isinstance(outcome, Lease):
                entry.fence = outcome.fence
            elif outcome is None and entry.running:
                # Its answer was lost, so it may be held: kept (no longer renewed) for the
                # run to take the key over from its token, not meet it as a stranger's.
                _stop_renewing(entry)
            else:
                # The hold was gone or taken (a redelivery): the run will contend.
                self._forget(reserved_id)

    def handed(self, task_id: str) -> HandedLease | None:
        """The running lease taken for ``task_id`` as its run is handed to the pool: the
        run starts under it, or (answer unknown) takes the key over from its token."""
        self.read_answers(task_id)
        with self._guard:
            entry = self._held.get(task_id)
        if entry is None or not entry.running:
            return None
        lease = entry.lease
        fence = entry.fence if not lease.lost else None
        return HandedLease(
            name=lease.name,
            key=lease.key,
            token=lease.token,
            fence=fence,
            ttl=lease.ttl,
            expires_at=lease.expires_at,
        )

    def _forget(self, task_id: str) -> Reservation | None:
        with self._guard:
            entry = self._held.pop(task_id, None)
        if entry is not None:
            _stop_renewing(entry)
        return entry

    def drop(self, task_id: str, *, release: bool) -> bool:
        """Stop renewing (the child took over), and with ``release`` give the key up.

        False when this worker held no reservation for ``task_id``.
        """
        self.read_answers(task_id)
        entry = self._forget(task_id)
        if entry is None:
            return False
        context, lease = entry.context, entry.lease
        if release:
            try:
                context.store.release(lease)
            except SingletonLockError as error:
                logger.warning("release of reservation %s failed: %s", lease.key, error)
        return True

    def drop_revoked(self) -> None:
        """Give back the keys of reserved messages revoked since (called every ~0.5 s).

        Celery discards a revoked ETA message only when its ETA comes; until then a new
        dispatch would be refused in favour of work that will never run.
        """
        if not self._held:
            return
        revoked = worker_state.revoked
        for task_id in [t for t in list(self._held) if t in revoked]:
            self.drop(task_id, release=True)
            logger.info("revoked %s: its key is free again", task_id)

    def hand_back(self) -> None:
        """At shutdown: unacked messages go back to the broker, so their holds do too."""
        self.read_answers()
        with self._guard:
            held, self._held = self._held, {}
        for entry in held.values():
            context, lease = entry.context, entry.lease
            try:
                context.store.hand_over(lease, context.queue_ttl, token=entry.queued)
            except SingletonLockError as error:
                logger.warning("could not hand %s back at shutdown: %s", lease.key, error)


@dataclass(frozen=True)
class _Plan:
    """What a received message's take is: which lock, under which token, as what."""

    name: str
    token: str
    queued: str
    running: bool  # the running lease, fenced (else a reservation the run takes over)
    # A mode whose later calls replace a queued message (replace, debounce): a message
    # replaced meanwhile takes nothing, even once its hold has lapsed (a worker died
    # with it): taken, it would pass for the newer message's, which would be dropped.
    unless_replaced: str | None = None

    @property
    def take_over(self) -> TakeOver:
        """The message's hold taken over; fenced as the running lease."""
        return TakeOver(self.queued, fenced=self.running, unless_replaced=self.unless_replaced)


@dataclass(frozen=True)
class Received:
    """What a received message says of its hold: its lock's name, the hold's token, and
    where the hold lives (None: on the key; a role: beside it)."""

    lock_name: str | None
    queued: str | None
    role: str | None
    # Sent to arrive before its own ETA (``run/eta.py``): its run only sends it on.
    early: bool = False

    @classmethod
    def of(cls, headers: object) -> Received:
        """From a request, or from a message's headers themselves."""
        eta = header(headers, ETA_HEADER)
        return cls(
            header(headers, NAME_HEADER),
            header(headers, TOKEN_HEADER),
            header(headers, HOLD_HEADER),
            early=eta is not None and _a_hop(eta, header(headers, "eta")),
        )


def _plan(context: TaskContext, task_id: str, hostname: str, received: Received) -> _Plan | None:
    lock_name, queued, role = received.lock_name, received.queued, received.role
    if not lock_name or not queued:
        return None  # sent without a hold (send_task, canvas): nothing to take
    name = companion(lock_name, role) if role else lock_name
    # The running lease (under this process's pid: it renews it until the run starts,
    # and releases it if the run's child dies), or a reservation the run takes over.
    # The running lease's token is new to this delivery: a redelivered copy of the
    # message received meanwhile cannot take it for its own.
    mode = context.options.mode
    replaced = mode.unless_replaced(queued)
    if role is None and mode.starts_at_receipt and not received.early:
        token = running_token(task_id, hostname, os.getpid())
        return _Plan(name, token, queued, True, replaced)
    return _Plan(name, reserved_token(task_id, hostname, queued), queued, False, replaced)


def _a_hop(eta: object, celery_eta: object) -> bool:
    """Whether the call's own ETA is later than this delivery's (Celery's ``eta``): a hop."""
    try:
        due = datetime.fromisoformat(str(celery_eta)).timestamp() if celery_eta else time.time()
        return float(str(eta)) > due + EARLY
    except ValueError:
        return False


def _started(context: TaskContext, plan: _Plan, task_id: str) -> Record | None:
    """The history entry of a running lease taken as its message arrives (the run then
    starts under it without a round trip); a reservation is no event of its own."""
    return context.record(plan.name, task_id, take=("started", "", "")) if plan.running else None


def _stop_renewing(entry: Reservation) -> None:
    store = entry.context.store
    if isinstance(store, RedisLock | Redlock):
        store.renewer.discard(entry.lease)


reservations = Reservations()
