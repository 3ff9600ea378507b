"""The watchdog: one background thread per process extends every renewed lease every ttl/3.

One thread for all leases (not one per lock, as redis-py's and many watchdogs do), so
a worker running many singleton tasks pays for one thread. Fork-safe: Celery's prefork
pool forks children from a process that may be renewing; a child starts with a fresh,
empty renewer and never renews (or reports as lost) its parent's leases.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Protocol

import redis

if TYPE_CHECKING:
    from .lock import ExtendResult, Lease

logger = logging.getLogger(__name__)

# After a failed renewal (Redis unreachable), try again this often, as a share of ttl.
RETRY_SHARE = 0.1
MIN_RETRY = 0.01


class _Extender(Protocol):
    def extend(self, lease: Lease, ttl: object | None = None) -> ExtendResult: ...


class Renewer:
    """Keeps registered leases alive until they are discarded or found lost."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # token -> (lock, lease); the heap holds (due, seq, token) and may hold stale
        # entries for discarded tokens, which the loop skips.
        self._leases: dict[str, tuple[_Extender, Lease]] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._leases)

    def __contains__(self, lease: Lease) -> bool:
        with self._cond:
            return lease.token in self._leases

    def add(self, lock: _Extender, lease: Lease) -> None:
        """Renew ``lease`` through ``lock`` every ttl/3 until ``discard`` or loss."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the renewer was stopped; leases can no longer be renewed")
            self._leases[lease.token] = (lock, lease)
            due = time.monotonic() + lease.ttl / 3
            # The thread sleeps until the earliest due lease; wake it only if this one is
            # earlier still. Most leases (one ttl for a task) are not, and a wake-up per
            # task would cost the process a thread switch per task.
            wake = not self._heap or due < self._heap[0][0]
            self._schedule(lease.token, due)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-singleton-lock-renewer", daemon=True
                )
                self._thread.start()
            if wake:
                self._cond.notify()

    def discard(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (no-op if it was not registered)."""
        with self._cond:
            self._leases.pop(lease.token, None)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; registered leases are no longer renewed (they expire by TTL)."""
        with self._cond:
            self._stopping = True
            self._leases.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @staticmethod
    def next_delay(lease: Lease, result: ExtendResult | Exception) -> float | None:
        """Seconds until the next renewal of ``lease`` after ``result``; None to stop."""
        from .lock import ExtendResult  # noqa: PLC0415  (lock imports this module)

        if lease._state.released:
            return None
        if isinstance(result, Exception):
            left = lease.remaining()
            if left <= 0:
                lease._mark_lost(f"renewal failed ({result}) until its ttl ran out")
                return None
            logger.warning("renewal of %s failed, retrying: %s", lease.key, result)
            return max(MIN_RETRY, min(lease.ttl * RETRY_SHARE, left / 2))
        if result is ExtendResult.EXTENDED:
            return lease.ttl / 3
        return None  # expired or taken: extend() has already marked it lost

    def _schedule(self, token: str, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), token))

    def _next_due(self) -> tuple[_Extender, Lease] | None:
        """Block until a registered lease is due (or stop); pop and return it."""
        with self._cond:
            while not self._stopping:
                while self._heap and self._heap[0][2] not in self._leases:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due, _, token = self._heap[0]
                delay = due - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                heapq.heappop(self._heap)
                return self._leases[token]
            return None

    def _run(self) -> None:
        while (entry := self._next_due()) is not None:
            lock, lease = entry
            try:
                result: ExtendResult | Exception = lock.extend(lease)
            except redis.RedisError as error:
                result = error
            except Exception as error:  # a bug must not kill renewal of every other lease
                logger.exception("renewal of %s raised", lease.key)
                result = error
            # Outside the lock: next_delay may run lost-lease callbacks.
            delay = self.next_delay(lease, result)
            with self._cond:
                if lease.token not in self._leases:
                    continue  # released while the extend was in flight
                if delay is None:
                    self._leases.pop(lease.token, None)
                else:
                    self._schedule(lease.token, time.monotonic() + delay)


_renewer = Renewer()


def get_renewer() -> Renewer:
    """This process's renewer (a new one in each forked child)."""
    return _renewer


def _forget_parent_leases() -> None:
    global _renewer  # noqa: PLW0603  (per-process state by design)
    # The parent's thread does not exist in the child and its Condition may have been
    # held at fork time: replace it rather than reuse any of it.
    _renewer = Renewer()


def _stop_at_exit() -> None:
    _renewer.stop(timeout=1.0)


os.register_at_fork(after_in_child=_forget_parent_leases)
atexit.register(_stop_at_exit)
