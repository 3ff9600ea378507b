"""The worker's main process: reserve received messages' keys, free what dead children held.

Reservation: a received message's queued hold (``queue_ttl`` long, taken at dispatch)
becomes a *reservation* of this worker (``ttl`` long, renewed by this process) in one
step. A worker killed with prefetched or ETA messages then frees their keys within
``ttl`` instead of ``queue_ttl``; the messages come back from the broker in time and
run. The pool child takes the reservation over when it starts the task.

A child killed by SIGKILL, by the hard time limit or by ``revoke(terminate=True)`` runs
no ``finally``; without help its lease would block the key until its TTL. Celery
reports each of these deaths to the main process through the task's ``Request``
class, and ``SingletonTask`` names this one. The main process knows the child's pid
and the task id, which together with the worker's hostname are the fixed part of the
child's lease token (see ``task.running_token``), so it can release exactly that
lease — never a redelivered copy's, which runs under another pid or host.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from celery import signals
from celery.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from .childwatch import child_watch, kill_and_wait
from .exceptions import KeyDerivationError, SingletonLockError
from .lease import Lease, PendingAcquire, RedisLock, ReleaseResult
from .signals import dead_child_released
from .task import SingletonTask
from .tokens import (
    KEY_HEADER,
    TOKEN_HEADER,
    header,
    reserved_shape,
    reserved_token,
    running_prefix,
)

logger = logging.getLogger(__name__)

# Exceptions that mean "the child is gone (or about to be) without running its finally".
CHILD_GONE = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)


class _Reservations:
    """This worker's reservations: task id -> (reserved lease, the message's queued token)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[str, tuple[SingletonTask, Lease, str]] = {}
        # Reservations sent whose answers are not read yet, oldest first.
        self._unread: list[tuple[str, PendingAcquire]] = []

    def take(self, request: Request) -> None:
        """Reserve without waiting: the consumer loop is the worker's bottleneck.

        The reservation is renewed from the start as the lease it would grant; its
        answer is read with the next message or when the child starts, and a refusal
        only stops that renewal (an extend would have found it not ours anyway).
        """
        task: SingletonTask = request.task
        context = request._context
        key, queued = header(context, KEY_HEADER), header(context, TOKEN_HEADER)
        if not key or not queued:
            return  # sent without a hold (send_task, canvas): nothing to reserve
        self.settle()
        store = task._singleton_store.lock
        token = reserved_token(request.id, request.hostname)
        try:
            pending = store.begin_try_acquire(
                key, task._ttl(), token=token, replace=queued, fenced=False
            )
        except SingletonLockError as error:
            logger.warning("could not reserve %s for %s: %s", key, request.id, error)
            return
        lease = pending.presumed()
        if lease is None:
            return  # the hold is gone or taken (a redelivery): the child will contend
        store.renew(lease)
        with self._guard:
            self._held[request.id] = (task, lease, queued)
            self._unread.append((request.id, pending))

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

    def _forget(self, task_id: str) -> tuple[SingletonTask, Lease, str] | None:
        with self._guard:
            entry = self._held.pop(task_id, None)
        if entry is not None:
            store = entry[0]._singleton_store.lock
            if isinstance(store, RedisLock):
                store.renewer.discard(entry[1])
        return entry

    def drop(self, task_id: str, *, release: bool) -> None:
        """Stop renewing (the child took over), and with ``release`` give the key up."""
        self.settle(task_id)
        entry = self._forget(task_id)
        if entry is None:
            return
        task, lease, _ = entry
        store = task._singleton_store.lock
        if release:
            try:
                store.release(lease)
            except SingletonLockError as error:
                logger.warning("release of reservation %s failed: %s", lease.key, error)

    def hand_back(self) -> None:
        """At shutdown: unacked messages go back to the broker, so their holds do too."""
        self.settle()
        with self._guard:
            held, self._held = self._held, {}
        for task, lease, queued in held.values():
            try:
                task._singleton_store.lock.hand_over(lease, task._queue_ttl(), token=queued)
            except SingletonLockError as error:
                logger.warning("could not hand %s back at shutdown: %s", lease.key, error)


_reservations = _Reservations()


class SingletonRequest(Request):  # type: ignore[misc]
    """Celery's Request, plus reservations and the release of a dead child's lease."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self.task, SingletonTask):
            _reservations.take(self)

    def on_accepted(self, pid: int, time_accepted: float) -> Any:
        result = super().on_accepted(pid, time_accepted)
        if isinstance(self.task, SingletonTask):
            # The child takes the reservation over as it starts; renewing it from here
            # would only find it gone.
            _reservations.drop(self.id, release=False)
            child_watch.watch(self)
        return result

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        child_watch.forget(self)
        return super().on_success(failed__retval__runtime, **kwargs)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        child_watch.forget(self)
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, CHILD_GONE) and isinstance(self.task, SingletonTask):
            # Before Celery requeues the message (acks_late + reject_on_worker_lost), so
            # the redelivered copy finds the key free.
            self._release_for_dead_child(kill=isinstance(exc, TimeLimitExceeded))
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )

    def _release_for_dead_child(self, *, kill: bool) -> None:
        task: SingletonTask = self.task
        key = header(self._context, KEY_HEADER)
        if key is None:
            try:
                key = task.singleton_options().key.derive(self.args, self.kwargs)
            except KeyDerivationError:
                return
        store = task._singleton_store.lock
        pid = self.worker_pid
        try:
            if pid:
                if kill:
                    kill_and_wait(pid)
                result = store.release_matching(
                    key, running_prefix(self.hostname, pid), f"|{self.id}"
                )
                if result is ReleaseResult.RELEASED:
                    dead_child_released.send(sender=task, key=key, task_id=self.id, pid=pid)
                logger.info(
                    "released %s for %s[%s] after its pool child %d died: %s",
                    key,
                    task.name,
                    self.id,
                    pid,
                    result.name,
                )
            # A child that died before taking over leaves the reservation or the hold.
            _reservations.drop(self.id, release=False)
            store.release_matching(key, *reserved_shape(self.hostname, self.id))
            queued = header(self._context, TOKEN_HEADER)
            if queued:
                store.release_token(key, queued)
        except SingletonLockError as error:
            logger.warning("release of %s after its child died failed (%s)", key, error)


def check_worker_setup(app: Any) -> list[str]:
    """Settings that can defeat the lock, as warnings (logged once at worker start)."""
    tasks = [t for t in app.tasks.values() if isinstance(t, SingletonTask)]
    if not tasks:
        return []
    warnings: list[str] = []
    store = tasks[0]._singleton_store
    try:
        lock = store.lock
        value = lock.eviction_policy() if isinstance(lock, RedisLock) else None
    except SingletonLockError as error:
        warnings.append(f"could not check the lock store at start ({error})")
        value = None
    if value and value != "noeviction":
        warnings.append(
            f"the lock store at {store.describe()} has maxmemory-policy={value}: under memory "
            "pressure Redis may evict lock keys and let a duplicate run. Set maxmemory-policy "
            "noeviction there, or give the locks a Redis of their own (singleton_lock_url)"
        )
    transport = app.conf.broker_transport_options or {}
    visibility = transport.get("visibility_timeout")
    for task in tasks:
        limit = task.time_limit or app.conf.task_time_limit
        if visibility and limit and limit >= visibility:
            warnings.append(
                f"{task.name}: time_limit={limit}s is not below the broker's "
                f"visibility_timeout={visibility}s, so a running task can be redelivered; the "
                "lock keeps the copy from running alongside (it is requeued) but it runs again "
                "afterwards. Raise visibility_timeout above the time limit"
            )
    return warnings


def _release_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    """A revoked (or expired) message gives its hold back when the worker drops it.

    A terminated running task is handled by ``SingletonRequest.on_failure`` once its
    child is gone.
    """
    if not isinstance(sender, SingletonTask) or request is None or terminated:
        return
    _reservations.drop(request.id, release=True)
    key, token = header(request, KEY_HEADER), header(request, TOKEN_HEADER)
    if key and token:
        try:
            sender._singleton_store.lock.release_token(key, token)
        except SingletonLockError as error:
            logger.warning("revoked %s: release of %s failed (%s)", sender.name, key, error)


def _hand_back_at_shutdown(**_: Any) -> None:
    _reservations.hand_back()


def _warn_at_worker_start(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None:
        return
    for message in check_worker_setup(app):
        logger.warning("celery-singleton-lock: %s", message)


signals.worker_ready.connect(_warn_at_worker_start, weak=False)
signals.task_revoked.connect(_release_revoked, weak=False)
signals.worker_shutdown.connect(_hand_back_at_shutdown, weak=False)
