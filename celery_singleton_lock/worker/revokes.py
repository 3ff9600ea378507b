"""Throttle windows that a revoked message gives back as soon as the revoke reaches its worker.

With ``reopen_on=("revoked",)`` a revoked call gives its window back so the next call is
accepted. Celery discards a revoked message it holds only when it would run it: at its
ETA (``countdown=30``: 30 s later), or when a pool child is free for a prefetched one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from celery.worker import state as worker_state

from ..exceptions import SingletonLockError
from ..lease import LockStore
from ..modes import Mode
from ..tokens import WINDOW_HEADER, header

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Waiting:
    """A received message whose window a revoke gives back: its mode, store, headers."""

    mode: Mode
    store: LockStore
    headers: Mapping[str, object]


class RevokedWindows:
    """The messages this worker received that carry a window to give back if revoked."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._waiting: dict[str, Waiting] = {}

    def watch(
        self, task_id: str, headers: Mapping[str, object], mode: Mode, store: LockStore
    ) -> None:
        """Note a received message that carries a window (``carries_window``), if
        ``reopen_on`` gives it back on a revoke."""
        if "revoked" not in mode.reopen_on:
            return
        with self._guard:
            self._waiting[task_id] = Waiting(mode, store, headers)

    def forget(self, task_id: str) -> None:
        """The message's run started, or Celery dropped it (and reopened it itself)."""
        if self._waiting:
            with self._guard:
                self._waiting.pop(task_id, None)

    def reopen_revoked(self) -> None:
        """Give back the windows of the messages revoked since.

        The worker's main process calls this every ``REVOKE_CHECK_INTERVAL`` (~0.5 s, with
        the reservations: ``hooks``). Reopening is owner-checked by the window's token, so
        the discard that comes later frees nothing a newer call holds."""
        if not self._waiting:
            return
        revoked = worker_state.revoked
        with self._guard:
            found = {t: self._waiting.pop(t) for t in list(self._waiting) if t in revoked}
        for task_id, waiting in found.items():
            try:
                waiting.mode.ended("revoked", waiting.store, waiting.headers)
            except SingletonLockError as error:
                logger.warning("revoked %s: its window stays (%s)", task_id, error)
            else:
                logger.info("revoked %s: its window is open again", task_id)


def carries_window(headers: Mapping[str, object]) -> bool:
    """Whether a received message carries a window to give back (one header read: the
    check every message pays)."""
    return header(headers, WINDOW_HEADER) is not None


revoked_windows = RevokedWindows()
