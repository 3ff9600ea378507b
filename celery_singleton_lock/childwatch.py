"""The release of a dead pool child's lease: the main process watches its children (prefork).

A child killed by SIGKILL, by the hard time limit or by ``revoke(terminate=True)`` runs
no ``finally``. The main process watches each child running a singleton task (a pidfd
where Linux has one, else a poll of ``/proc``) and, when one dies, asks its request to
release what the child held.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def is_dead(pid: int) -> bool:
    """Gone, or a zombie ("Z": dead but not yet reaped by billiard)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    except (OSError, IndexError):  # no /proc (not Linux): ask the kernel instead
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return state in ("Z", "X")


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
    """Notices a pool child's death at once and releases its lease.

    billiard reports a SIGKILLed child to Celery only when it next maintains the pool,
    which was seen to take several seconds; a lease must not wait that long. One daemon
    thread in the main process sleeps in poll() on a pidfd per pool child (Linux 5.3+),
    so it costs nothing per task and wakes only when a child exits. Elsewhere it polls
    the children of running singleton tasks every ``INTERVAL``; measured on Linux, that
    polling thread cost the worker's main process a fifth of its throughput.
    """

    INTERVAL = 0.05

    def __init__(self) -> None:
        self._guard = threading.Condition()
        self._running: dict[str, Any] = {}
        self._pidfds: dict[int, int] = {}  # pool child pid -> its pidfd
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # pipe that makes the thread re-poll
        self._use_pidfd = hasattr(os, "pidfd_open") and hasattr(select, "poll")

    def watch(self, request: Any) -> None:
        pid = request.worker_pid
        wake = gone = False
        with self._guard:
            self._running[request.id] = request
            if self._use_pidfd and pid and pid not in self._pidfds:
                try:
                    # A child that exited before this still gives a pidfd (a zombie's),
                    # and it polls readable at once.
                    self._pidfds[pid] = os.pidfd_open(pid)
                    wake = True
                except ProcessLookupError:
                    gone = True  # reaped already
                except OSError:  # no pidfds here (old kernel, seccomp): poll instead
                    self._use_pidfd = False
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
        if gone and pid:
            self._child_gone(pid)

    def forget(self, request: Any) -> None:
        task_id = request.id
        with self._guard:
            if self._running.get(task_id) is request:
                del self._running[task_id]

    def _child_gone(self, pid: int) -> None:
        with self._guard:
            fd = self._pidfds.pop(pid, None)
            orphans = [r for r in self._running.values() if r.worker_pid == pid]
            for request in orphans:
                del self._running[request.id]
        if fd is not None:
            os.close(fd)
        for request in orphans:
            request._release_for_dead_child(kill=False)

    def _run(self) -> None:
        if self._use_pidfd and self._wake is not None:
            self._run_pidfd(self._wake[0])
        else:
            self._run_polling()

    def _run_pidfd(self, wake: int) -> None:
        while True:
            with self._guard:
                by_fd = {fd: pid for pid, fd in self._pidfds.items()}
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
                while not self._running:
                    self._guard.wait()
                watched = list(self._running.values())
            for request in watched:
                pid = request.worker_pid
                if pid and is_dead(pid):
                    self._child_gone(pid)
            time.sleep(self.INTERVAL)


child_watch = ChildWatch()
