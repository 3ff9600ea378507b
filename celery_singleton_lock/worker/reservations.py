"""The worker's reservations: a received message's hold, made this worker's and renewed.

A received message's queued hold (``queue_ttl`` long, taken at dispatch) becomes a
*reservation* of this worker (``ttl`` long, renewed by its main process) in one step.
A worker killed with prefetched or ETA messages then frees their keys within ``ttl``
instead of ``queue_ttl``; the messages come back from the broker in time and run. The
pool child takes the reservation over when it starts the task; a revoked message gives
it back at once (``drop_revoked``), not when its ETA comes.
"""

from __future__ import annotations

import logging
import threading

from celery.worker import state as worker_state

from ..context import TaskContext
from ..exceptions import SingletonLockError
from ..lease import Lease, PendingAcquire, RedisLock, companion
from ..tokens import reserved_token

logger = logging.getLogger(__name__)


class Reservations:
    """This worker's reservations: task id -> (task context, reserved lease, queued token).

    Entries live from the message's receipt until its child takes over, it is revoked
    or expires, or the worker shuts down: nothing outlives the message.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[str, tuple[TaskContext, Lease, str]] = {}
        # Reservations sent whose answers are not read yet, oldest first.
        self._unread: list[tuple[str, PendingAcquire]] = []

    def __len__(self) -> int:
        return len(self._held)

    def take(
        self,
        context: TaskContext,
        task_id: str,
        hostname: str,
        *,
        lock_name: str | None,
        queued: str | None,
        role: str | None,
    ) -> None:
        """Reserve a received message's hold without waiting: the consumer loop is the
        worker's bottleneck.

        ``key``, ``queued`` (the hold's token) and ``role`` are the message's headers.
        The reservation is renewed from the start as the lease it would grant; its
        answer is read with the next message or when the child starts, and a refusal
        only stops that renewal (an extend would have found it not ours anyway). It is
        sent whole (the script's body), so a server that lost its scripts applies it at
        once rather than when the answer is read.
        """
        if not lock_name or not queued:
            return  # sent without a hold (send_task, canvas): nothing to reserve
        name = companion(lock_name, role) if role else lock_name
        self.settle()
        store = context.store
        token = reserved_token(task_id, hostname, queued)
        try:
            pending = store.begin_try_acquire(
                name, context.ttl, token=token, replace=queued, fenced=False, read_late=True
            )
        except SingletonLockError as error:
            logger.warning("could not reserve %s for %s: %s", lock_name, task_id, error)
            return
        lease = pending.presumed()
        if lease is None:
            return  # the hold is gone or taken (a redelivery): the child will contend
        store.renew(lease)
        with self._guard:
            self._held[task_id] = (context, lease, queued)
            self._unread.append((task_id, pending))

    def settle(self, task_id: str | None = None) -> None:
        """Read the answers of reservations sent so far (or of ``task_id``'s alone)."""
        with self._guard:
            if task_id is None:
                mine, self._unread = self._unread, []
            else:
                mine = [entry for entry in self._unread if entry[0] == task_id]
                self._unread = [entry for entry in self._unread if entry[0] != task_id]
        for reserved_id, pending in mine:
            try:
                outcome = pending.outcome()
            except SingletonLockError as error:
                logger.warning("could not reserve %s for %s: %s", pending.name, reserved_id, error)
                outcome = None
            if not isinstance(outcome, Lease):
                # The hold was gone or taken (a redelivery): the child will contend.
                self._forget(reserved_id)

    def _forget(self, task_id: str) -> tuple[TaskContext, Lease, str] | None:
        with self._guard:
            entry = self._held.pop(task_id, None)
        if entry is not None:
            store = entry[0].store
            if isinstance(store, RedisLock):
                store.renewer.discard(entry[1])
        return entry

    def drop(self, task_id: str, *, release: bool) -> bool:
        """Stop renewing (the child took over), and with ``release`` give the key up.

        False when this worker held no reservation for ``task_id``.
        """
        self.settle(task_id)
        entry = self._forget(task_id)
        if entry is None:
            return False
        context, lease, _ = entry
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
        self.settle()
        with self._guard:
            held, self._held = self._held, {}
        for context, lease, queued in held.values():
            try:
                context.store.hand_over(lease, context.queue_ttl, token=queued)
            except SingletonLockError as error:
                logger.warning("could not hand %s back at shutdown: %s", lease.key, error)


reservations = Reservations()
