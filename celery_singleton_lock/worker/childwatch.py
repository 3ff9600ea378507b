"""The release of a dead pool child's lease: the main process watches its children (prefork).

A child killed by SIGKILL, by the hard time limit or by ``revoke(terminate=True)`` runs no
``finally``. The main process watches each child that ran a singleton task (``ChildWatch``)
and, when one dies, asks the requests it was running to release what the child held.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from typing import Protocol

from celery.worker import state as worker_state

from ..holders import is_dead

logger = logging.getLogger(__name__)


class DeadChildRelease(Protocol):
    """A request that can release what its dead pool child held (``SingletonRequest``)."""

    def release_for_dead_child(self, *, kill: bool) -> None: ...


def kill_and_wait(pid: int, timeout: float = 1.0) -> None:
    """Make sure the child cannot run another instruction before its lease is released.

    On a hard time limit billiard reports the timeout first and kills the child after;
    releasing in between would let a duplicate start while the child still runs.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while not is_dead(pid) and time.monotonic() < deadline:
        time.sleep(0.002)


class ChildWatch:
    """Notices a pool child's death at once and releases what its tasks held.

    Only where tasks run in child processes (prefork): ``enabled`` is set when the worker
    starts with such a pool. Thread, gevent, eventlet and solo pools report the main
    process or a greenlet's id as the "pid"; a task there dies with the whole worker and
    its lease is freed by its ttl.

    billiard reports a SIGKILLed child to Celery only when it next maintains the pool,
    which was seen to take several seconds; a lease must not wait that long. One daemon
    thread in the main process sleeps in poll() on a pidfd per pool child (Linux 5.3+),
    so it costs nothing per task and wakes only when a child exits. Elsewhere it polls
    the watched children (``/proc``) every ``INTERVAL``. Nothing is kept per task: on a
    child's death the tasks it was running are Celery's own active requests with that pid.
    """

    INTERVAL = 0.05

    def __init__(self) -> None:
        self.enabled = False
        self._guard = threading.Condition()
        self._pids: dict[int, int | None] = {}  # watched pool child pid -> its pidfd
        # Requests Celery has let go of while their child may still run (terminate,
        # cancel): its table no longer names them, so they are kept here until their
        # child dies or takes another task.
        self._let_go: dict[int, list[DeadChildRelease]] = {}
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # pipe that makes the thread re-poll
        self._use_pidfd = hasattr(os, "pidfd_open") and hasattr(select, "poll")

    def watch(self, pid: int) -> None:
        """Watch the pool child ``pid`` (a no-op when already watched or not enabled).

        Called as the child accepts a task: a task of it let go of earlier is over (a
        prefork child runs one at a time), so nothing is left to release for it."""
        with self._guard:
            if self._let_go.pop(pid, None) is not None:
                logger.debug("pool child %d outlived the signal its task was stopped with", pid)
        self._watch(pid)

    def _watch(self, pid: int) -> None:
        if not self.enabled or not pid or pid in self._pids:
            return
        wake = gone = False
        with self._guard:
            if pid in self._pids:
                return
            fd = None
            if self._use_pidfd:
                try:
                    # A child that exited before this still gives a pidfd (a zombie's),
                    # and it polls readable at once.
                    fd = os.pidfd_open(pid)
                    wake = True
                except ProcessLookupError:
                    gone = True  # reaped already
                except OSError:  # no pidfds here (old kernel, seccomp): poll instead
                    self._use_pidfd = False
            if not gone:
                self._pids[pid] = fd
            if self._thread is None or not self._thread.is_alive():
                if self._use_pidfd and self._wake is None:
                    self._wake = os.pipe()
                self._thread = threading.Thread(
                    target=self._run, name="celery-singleton-lock-child-watch", daemon=True
                )
                self._thread.start()
            self._guard.notify()
        if wake and self._wake is not None:
            os.write(self._wake[1], b"!")
        if gone:
            self._child_gone(pid)

    def let_go(self, pid: int, request: DeadChildRelease) -> None:
        """Celery stopped ``request`` by signalling its child ``pid`` (``revoke(terminate=
        True)``) and forgot it at once: release what it held when the child is gone.

        Celery learns of the death only when billiard next maintains the pool, which
        may be 5 s later; this watch notices it at once."""
        if not self.enabled or not pid:
            return
        with self._guard:
            self._let_go.setdefault(pid, []).append(request)
        # Watched again if its death was already noticed (before Celery let it go).
        self._watch(pid)

    def watched(self) -> int:
        """How many pool children are watched (at most the pool's size, plus dead ones
        not yet noticed)."""
        return len(self._pids)

    def _child_gone(self, pid: int) -> None:
        with self._guard:
            fd = self._pids.pop(pid, None)
            let_go = self._let_go.pop(pid, [])
        if fd is not None:
            os.close(fd)
        for stopped in let_go:
            stopped.release_for_dead_child(kill=False)
        # Celery's own table of accepted requests (task id -> request); copied in one C
        # call, so the consumer thread adding to it meanwhile cannot break the loop.
        for request in list(worker_state.requests.values()):
            if request.worker_pid == pid and hasattr(request, "release_for_dead_child"):
                request.release_for_dead_child(kill=False)

    def _run(self) -> None:
        if self._use_pidfd and self._wake is not None:
            self._run_pidfd(self._wake[0])
        else:
            self._run_polling()

    def _run_pidfd(self, wake: int) -> None:
        while True:
            with self._guard:
                by_fd = {fd: pid for pid, fd in self._pids.items() if fd is not None}
            poller = select.poll()
            poller.register(wake, select.POLLIN)
            for fd in by_fd:
                poller.register(fd, select.POLLIN)
            for fd, _ in poller.poll():
                if fd == wake:
                    os.read(wake, 4096)
                elif fd in by_fd:
                    self._child_gone(by_fd[fd])

    def _run_polling(self) -> None:
        while True:
            with self._guard:
                while not self._pids:
                    self._guard.wait()
                watched = list(self._pids)
            for pid in watched:
                if is_dead(pid):
                    self._child_gone(pid)
            time.sleep(self.INTERVAL)


child_watch = ChildWatch()
