"""The watchdog: one scheduler thread per process renews every lease every ttl/3, one lane per node.

One scheduler for all leases (not one thread per lock, as redis-py's and many watchdogs
do); a stalled node delays only its own leases, and a lease whose renewal goes unanswered is
reported lost at its expiry. Fork-safe: a prefork child never renews its parent's leases.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Hashable, Sequence
from typing import Protocol

from .lease import Lease
from .outcomes import ExtendResult

logger = logging.getLogger(__name__)

# After a failed renewal (Redis unreachable), try again this often, as a share of ttl.
RETRY_SHARE = 0.1
MIN_RETRY = 0.01
# A lane with nothing to do for this long ends its thread (a new one starts on demand).
LANE_IDLE = 60.0
# A renewal not answered within this share of its lease's remaining time is given up
# (and tried again); the client's own retry policy can back off for longer than a lease.
DEADLINE_SHARE = 0.5
# Given-up renewals still waiting on the client, per lane, before the lane stops trying.
MAX_ABANDONED = 2


class RenewalTimeout(TimeoutError):
    """A renewal that did not answer within its deadline (it may still land later)."""


class _Attempt:
    """One ``extend_many`` call on a thread of its own, so the lane can stop waiting."""

    def __init__(self, store: Extender, batch: list[Lease]) -> None:
        self.results: Sequence[ExtendResult | BaseException] = []
        self.done = threading.Event()
        threading.Thread(
            target=self._run, args=(store, batch), name="celery-singleton-lock-renewal", daemon=True
        ).start()

    def _run(self, store: Extender, batch: list[Lease]) -> None:
        try:
            self.results = store.extend_many(batch)
        except Exception as error:  # a bug must not kill renewal of every other lease
            logger.exception("renewal of %d lease(s) raised", len(batch))
            self.results = [error] * len(batch)
        finally:
            self.done.set()


class Extender(Protocol):
    def extend_many(self, leases: Sequence[Lease]) -> list[ExtendResult | Exception]: ...

    def lane(self, lease: Lease) -> Hashable: ...


def next_delay(lease: Lease, result: ExtendResult | BaseException) -> float | None:
    """Seconds until the next renewal of ``lease`` after ``result``; None to stop."""
    if lease.released:
        return None
    if isinstance(result, BaseException):
        left = lease.remaining()
        if left <= 0:
            lease.mark_lost(
                f"renewal failed ({result or type(result).__name__}) until its ttl ran out"
            )
            return None
        logger.warning("renewal of %s failed, retrying: %s", lease.key, result)
        return max(MIN_RETRY, min(lease.ttl * RETRY_SHARE, left / 2))
    if result in (ExtendResult.EXTENDED, ExtendResult.CANCELLED):
        return cadence(lease)
    return None  # expired or taken: extend() has already marked it lost


def cadence(lease: Lease) -> float:
    """How often ``lease`` is renewed: every ttl/3, or as often as it looks at the lock
    it yields to (``Lease.yield_to``) when that is sooner."""
    yields = lease.yields_to
    return lease.ttl / 3 if yields is None else min(lease.ttl / 3, yields[1])


class _Lane:
    """One thread extending the due leases of one store's node, a batch per round trip."""

    def __init__(self, renewer: Renewer, store: Extender, name: str) -> None:
        self.renewer = renewer
        self.store = store
        self.queue: list[Lease] = []
        self.abandoned: list[_Attempt] = []
        self.closed = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, lease: Lease) -> bool:
        """Queue ``lease``; False if this lane has just ended (ask for a new one)."""
        with self.cond:
            if self.closed:
                return False
            self.queue.append(lease)
            self.cond.notify()
            return True

    def _run(self) -> None:
        while True:
            with self.cond:
                if not self.queue:
                    self.cond.wait(LANE_IDLE)
                batch, self.queue = self.queue, []
                if not batch:
                    self.closed = True
                    self.renewer._retire(self)
                    return
            if batch:
                self._extend(batch)

    def _extend(self, batch: list[Lease]) -> None:
        # Each renewal has its own deadline, well inside the time its leases have left.
        # One the client keeps waiting past it (a frozen node, a long backoff) is given up here;
        # its answer, if it comes, still updates the lease, and a new try goes out.
        self.abandoned = [a for a in self.abandoned if not a.done.is_set()]
        deadline = max(MIN_RETRY, min(lease.remaining() for lease in batch) * DEADLINE_SHARE)
        results: Sequence[ExtendResult | BaseException]
        if len(self.abandoned) >= MAX_ABANDONED:
            results = [RenewalTimeout("earlier renewals are still unanswered")] * len(batch)
        else:
            attempt = _Attempt(self.store, batch)
            if attempt.done.wait(deadline):
                results = attempt.results
            else:
                self.abandoned.append(attempt)
                error = RenewalTimeout(f"no answer within {deadline:.3f}s")
                results = [error] * len(batch)
        for lease, result in zip(batch, results, strict=True):
            # Outside any lock: next_delay may run lost-lease callbacks.
            self.renewer._done(lease, next_delay(lease, result))


class Renewer:
    """Keeps registered leases alive until they are discarded or found lost.

    Due renewals go to a lane per store and Redis node, which extends everything due on
    that node in one round trip (a pipeline), so one stalled node delays only its own
    leases. Every renewal also has a deadline, the lease's expiry: a renewal still
    unanswered then reports the lease lost (``on_lost``) at that moment, no later than
    ``check()`` starts raising.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # token -> (store, lease, in flight); the heap has (due, seq, token, deadline?)
        # and may hold stale entries for discarded tokens, which the loop skips.
        self._leases: dict[str, tuple[Extender, Lease, bool]] = {}
        self._heap: list[tuple[float, int, str, bool]] = []
        self._lanes: dict[Hashable, _Lane] = {}
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # When the thread will wake by itself (inf: only when told): a lease due later
        # needs no wake-up, which would cost the process a thread switch per task.
        self._asleep_until = math.inf

    def __len__(self) -> int:
        with self._cond:
            return len(self._leases)

    def __contains__(self, lease: Lease) -> bool:
        """Whether ``lease`` is being renewed (a lease found lost no longer is)."""
        with self._cond:
            return lease.token in self._leases and not lease.lost

    def add(self, store: Extender, lease: Lease) -> None:
        """Renew ``lease`` through ``store`` every ttl/3 until ``discard`` or loss."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the renewer was stopped; leases can no longer be renewed")
            self._leases[lease.token] = (store, lease, False)
            # Due a cadence after it was granted, not after it was registered: a lease
            # handed over from another process (the worker's main process takes it as
            # the message arrives) may have spent much of its ttl on the way, over a slow
            # link more than a cadence, and would run out before a first renewal.
            every = cadence(lease)
            due = min(time.monotonic() + every, lease.expires_at - lease.ttl + every)
            # Most leases (one ttl for a task) are due after the thread wakes anyway.
            wake = due < self._asleep_until
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
            # Its entry goes now when it is the earliest (leases mostly end in the order
            # they began), and the heap is rebuilt when mostly stale: otherwise the thread
            # would wake at each gone lease's due time, once per task.
            heap = self._heap
            while heap and heap[0][2] not in self._leases:
                heapq.heappop(heap)
            if len(heap) > 2 * len(self._leases) + 64:
                heap[:] = [entry for entry in heap if entry[2] in self._leases]
                heapq.heapify(heap)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; registered leases are no longer renewed (they expire by TTL)."""
        with self._cond:
            self._stopping = True
            self._leases.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _schedule(self, token: str, due: float, *, deadline: bool = False) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), token, deadline))

    def _next_due(self) -> tuple[Extender, Lease, bool] | None:
        """Block until a renewal or a deadline is due (or stop); return it."""
        with self._cond:
            while not self._stopping:
                while self._heap and self._heap[0][2] not in self._leases:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._asleep_until = math.inf
                    self._cond.wait()
                    continue
                due, _, token, deadline = self._heap[0]
                delay = due - time.monotonic()
                if delay > 0:
                    self._asleep_until = due
                    self._cond.wait(delay)
                    continue
                heapq.heappop(self._heap)
                store, lease, in_flight = self._leases[token]
                if deadline:
                    if not in_flight or lease.remaining() > 0:
                        continue  # answered in time, or renewed meanwhile by someone
                    self._leases.pop(token, None)
                    return store, lease, True
                if in_flight:
                    continue
                self._leases[token] = (store, lease, True)
                self._schedule(token, lease.expires_at, deadline=True)
                return store, lease, False
            return None

    def _run(self) -> None:
        while (entry := self._next_due()) is not None:
            store, lease, overdue = entry
            if overdue:
                lease.mark_lost("its renewal did not answer before its ttl ran out")
                continue
            while not self._lane(store, lease).submit(lease):
                pass  # that lane ended as it went idle; the next call makes a new one

    def _lane(self, store: Extender, lease: Lease) -> _Lane:
        try:
            where: Hashable = (id(store), store.lane(lease))
        except Exception:  # a topology lookup that failed: renew on the store's own lane
            where = (id(store), None)
        with self._cond:
            lane = self._lanes.get(where)
            if lane is None:
                name = f"celery-singleton-lock-renewer-lane-{len(self._lanes) + 1}"
                lane = self._lanes[where] = _Lane(self, store, name)
            return lane

    def _retire(self, lane: _Lane) -> None:
        """Forget a lane that went idle (it has stopped taking leases)."""
        with self._cond:
            for where, known in list(self._lanes.items()):
                if known is lane:
                    del self._lanes[where]

    def _done(self, lease: Lease, delay: float | None) -> None:
        with self._cond:
            entry = self._leases.get(lease.token)
            if entry is None:
                return  # released, or reported lost at its deadline, while in flight
            if delay is None:
                self._leases.pop(lease.token, None)
            else:
                self._leases[lease.token] = (entry[0], lease, False)
                due = time.monotonic() + delay
                # The scheduler sleeps until its earliest entry (often this lease's
                # deadline): a sooner retry must wake it.
                if due < self._asleep_until:
                    self._cond.notify()
                self._schedule(lease.token, due)


_renewer = Renewer()


def get_renewer() -> Renewer:
    """This process's renewer (a new one in each forked child)."""
    return _renewer


def _forget_parent_leases() -> None:
    # Celery's prefork pool forks children from a process that may be renewing: a child
    # starts with a fresh, empty renewer and never renews (or reports as lost) its
    # parent's leases.
    global _renewer  # noqa: PLW0603  (per-process state by design)
    # The parent's threads do not exist in the child and its Condition may have been
    # held at fork time: replace it rather than reuse any of it.
    _renewer = Renewer()


def _stop_at_exit() -> None:
    _renewer.stop(timeout=1.0)


os.register_at_fork(after_in_child=_forget_parent_leases)
atexit.register(_stop_at_exit)
