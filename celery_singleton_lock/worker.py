"""The worker's main process: release the lease of a pool child that died holding it.

A child killed by SIGKILL, by the hard time limit or by ``revoke(terminate=True)`` runs
no ``finally``; without help its lease would block the key until its TTL. Celery
reports each of these deaths to the main process through the task's ``Request``
class, and ``SingletonTask`` names this one. The main process knows the child's pid
and the task id, which together with the worker's hostname are the fixed part of the
child's lease token (see ``task.running_token``), so it can release exactly that
lease — never a redelivered copy's, which runs under another pid or host.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import redis
from billiard.einfo import ExceptionWithTraceback
from celery.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from .exceptions import KeyDerivationError
from .task import KEY_HEADER, TOKEN_HEADER, SingletonTask, header, running_prefix

logger = logging.getLogger(__name__)

# Exceptions that mean "the child is gone (or about to be) without running its finally".
CHILD_GONE = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)


def _kill_and_wait(pid: int, timeout: float = 1.0) -> None:
    """Make sure the child cannot run another instruction before its lease is released.

    On a hard time limit billiard reports the timeout first and kills the child after;
    releasing in between would let a duplicate start while the child still runs.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            # Field 3 is the state; "Z" (zombie) means dead but not yet reaped by billiard.
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.002)


class SingletonRequest(Request):  # type: ignore[misc]
    """Celery's Request, plus the release of a dead child's lease."""

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
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
                    _kill_and_wait(pid)
                result = store.release_matching(
                    key, running_prefix(self.hostname, pid), f"|{self.id}"
                )
                logger.info(
                    "released %s for %s[%s] after its pool child %d died: %s",
                    key,
                    task.name,
                    self.id,
                    pid,
                    result.name,
                )
            # A child that died before taking over leaves the message's queued hold.
            queued = header(self._context, TOKEN_HEADER)
            if queued:
                store.release_token(key, queued)
        except redis.RedisError as error:
            logger.warning("release of %s after its child died failed (%s)", key, error)
