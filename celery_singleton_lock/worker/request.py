"""``SingletonRequest``: Celery's Request in the worker's main process, for singleton tasks.

It reserves a received message's key (``reservations.py``), hands the reservation to the
pool child that starts the task, and releases what a dead child held: a killed child runs no
``finally``, and without help its lease would block the key until its TTL.
"""

from __future__ import annotations

import logging

from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from celery.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker import state as worker_state
from celery.worker.request import Request

from ..config.options import is_singleton
from ..exceptions import KeyDerivationError, SingletonLockError
from ..lease import LockStore, ReleaseResult, companion
from ..signals import dead_child_released
from ..signals import send as send_signal
from ..tokens import (
    ATTEMPT_HEADER,
    HOLD_HEADER,
    LEASE_HEADER,
    NAME_HEADER,
    TOKEN_HEADER,
    header,
    header_count,
    requeue_token,
    reserved_shape,
    retry_shape,
    running_prefix,
)
from .childwatch import child_watch, kill_and_wait
from .reservations import reservations
from .revokes import carries_window, revoked_windows

logger = logging.getLogger(__name__)

# Exceptions that mean "the child is gone (or about to be) without running its finally".
CHILD_GONE = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)


class Handoff:
    """The running lease the main process took for a request, read as the run starts.

    It rides in the request Celery hands to its pool (``request_dict``, which Celery's
    generated request class passes as it is): a pool in this process reads it when the
    run starts; a prefork child gets what it was when the request was pickled for it,
    which is as the request leaves for the child. Either way after the answer of the
    take was read, never before the message was received.
    """

    __slots__ = ("task_id", "token", "wire")

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.token: str | None = None  # once handed: what a dead run leaves held
        self.wire: dict[str, object] | None = None

    def resolve(self) -> dict[str, object]:
        """Read once: by the pickling for a child, by ``on_accepted`` (which a pool in
        this process calls before the run starts), or by the run, whichever is first."""
        if self.wire is None:
            handed = reservations.handed(self.task_id)
            self.token = handed.token if handed is not None else None
            self.wire = handed.wire() if handed is not None else {}
        return self.wire

    def __reduce__(self) -> tuple[type[dict[str, object]], tuple[dict[str, object]]]:
        return dict, (self.resolve(),)


class SingletonRequest(Request):  # type: ignore[misc]
    """Celery's Request, plus reservations and the release of a dead child's lease.

    A child killed by SIGKILL, by the hard time limit or by ``revoke(terminate=True)``
    runs no ``finally``. Celery reports each of these deaths to the main process through
    the task's ``Request`` class, and ``SingletonTask`` names this one.

    Celery's generated request class overrides ``on_success`` without calling this
    one's, so nothing here may rely on it: per-task state lives in Celery's own tables.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._singleton = is_singleton(self.task)
        self._singleton_released = False
        # Only the main process hands a lease to a run: a producer's header is not one.
        self.request_dict.pop(LEASE_HEADER, None)
        if self._singleton:
            # The message's headers as Celery copied them (not ``_context``, a Context
            # Celery would build per message here only for this).
            headers = self.request_dict
            context = self.task.singleton_context
            reservations.take(context, self.id, self.hostname, headers)
            if carries_window(headers):
                mode = self.task.singleton_options().mode
                revoked_windows.watch(self.id, headers, mode, context.store)
            headers[LEASE_HEADER] = Handoff(self.id)

    def on_accepted(self, pid: int, time_accepted: float) -> object:
        if self._singleton:
            child_watch.watch(pid)  # first: a terminate on accept (below) lets it go
        result = super().on_accepted(pid, time_accepted)
        if self._singleton:
            # The child takes the reservation over as it starts (or runs under the
            # lease taken here, handed before it is forgotten); renewing it from here
            # would only find it gone (or renew what the child renews).
            handoff = self.request_dict.get(LEASE_HEADER)
            if isinstance(handoff, Handoff):
                handoff.resolve()
            reservations.drop(self.id, release=False)
            revoked_windows.forget(self.id)
        return result

    def terminate(self, pool: object, signal: int | str | None = None) -> None:
        super().terminate(pool, signal)
        if self._singleton and self.time_start:
            # Celery forgets the request now and hears of its child's death only when
            # billiard next maintains the pool (up to 5 s): the watch releases sooner.
            child_watch.let_go(self.worker_pid, self)

    def cancel(self, *args: object, **kwargs: object) -> None:
        super().cancel(*args, **kwargs)  # (pool, signal[, emit_retry]: Celery 5.4+)
        if self._singleton and self.time_start:  # the same, on a lost broker connection
            child_watch.let_go(self.worker_pid, self)

    def on_failure(
        self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False
    ) -> object:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, CHILD_GONE) and self._singleton:
            # Before Celery requeues the message (acks_late + reject_on_worker_lost), so
            # the redelivered copy finds the key free.
            self.release_for_dead_child(kill=isinstance(exc, TimeLimitExceeded))
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )

    def _release_running(
        self, store: LockStore, lock_name: str, pid: int, queued: str | None
    ) -> ReleaseResult:
        """Release the running lease a dead child held: the one this process took for it
        as the message arrived, or the one the child took itself (by its pid); or the
        hold it passed to its retry's message (named from ``queued``, the message's).

        The child's pid and the task id, with the worker's hostname, are the fixed part of
        the child's lease token (``tokens.running_token``): exactly that lease is released,
        never a redelivered copy's, which runs under another pid or host."""
        task = self.task
        handoff = self.request_dict.get(LEASE_HEADER)
        if isinstance(handoff, Handoff) and handoff.token:
            result = store.release_token(lock_name, handoff.token)
            if result is ReleaseResult.RELEASED:
                send_signal(dead_child_released, task, lock_name, task_id=self.id, pid=pid)
                return result
        mode = task.singleton_options().mode
        shape = (running_prefix(self.hostname, pid), f"|{self.id}")
        # A total_limit's slot, whichever the child held (its lease's token's shape).
        for name in mode.also_held(lock_name):
            if store.release_matching(name, *shape) is ReleaseResult.RELEASED:
                break
        # Or the hold it passed to its retry's message, which it may have died sending.
        retries = header_count(self.request_dict, "retries")
        retried = retry_shape(self.id, queued, retries)
        # The key, or with limit=N whichever slot of it the child held.
        override = task.singleton_context.override(lock_name)  # a raised limit's slots
        names = list(mode.running_names(lock_name, override))
        # Over several slots, the child's own lease is looked for on each before any
        # retry's hold: another copy of this task id may wait out its retry on a slot.
        passes = [(shape, retried)] if len(names) == 1 else [(shape, None), (retried, None)]
        result = ReleaseResult.EXPIRED
        for own, also in passes:
            for name in names:
                result = store.release_matching(name, *own, or_shape=also)
                if result is ReleaseResult.RELEASED:
                    send_signal(dead_child_released, task, lock_name, task_id=self.id, pid=pid)
                    return result
        return result

    def release_for_dead_child(self, *, kill: bool) -> None:
        """Release what this request's pool child held; once, whoever notices first."""
        if self._singleton_released:
            return
        self._singleton_released = True
        task = self.task
        lock_name = header(self.request_dict, NAME_HEADER)
        if lock_name is None:
            try:
                lock_name = task.singleton_options().key.derive(self.args, self.kwargs)
            except KeyDerivationError:
                return
        store = task.singleton_context.store
        pid = self.worker_pid
        role = header(self.request_dict, HOLD_HEADER)
        queued = header(self.request_dict, TOKEN_HEADER)  # the message's own hold
        # The message's own hold: on the key, or beside it (lock="until_executing").
        hold = companion(lock_name, role) if role else lock_name
        try:
            if pid and child_watch.enabled:
                if kill:
                    kill_and_wait(pid)
                result = self._release_running(store, lock_name, pid, queued)
                # A child that died waiting kept its pending hold meanwhile, or passed it
                # to its requeue, which it may have died sending.
                if task.singleton_options().mode.waiting_hold(role) is not None:
                    attempt = header_count(self.request_dict, ATTEMPT_HEADER) + 1
                    store.release_matching(
                        hold,
                        running_prefix(self.hostname, pid),
                        f"|{self.id}",
                        or_shape=(requeue_token(self.id, queued, attempt), ""),
                    )
                logger.info(
                    "released %s for %s[%s] after its pool child %d died: %s",
                    lock_name,
                    task.name,
                    self.id,
                    pid,
                    result.name,
                )
            # A child that died before taking over leaves the reservation or the hold.
            reservations.drop(self.id, release=True)
            store.release_matching(
                hold,
                *reserved_shape(self.hostname, self.id),
                or_shape=(queued, "") if queued else None,
            )
            # A revoke with terminate=True, or a crash or time limit: a failure.
            end = "revoked" if self.id in worker_state.revoked else "failure"
            task.singleton_options().mode.ended(end, store, self.request_dict)
        except SingletonLockError as error:
            logger.warning("release of %s after its child died failed (%s)", lock_name, error)
