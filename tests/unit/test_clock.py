"""``ManualClock``: a ``MemoryLock``'s leases, waits and rate slots count time as told."""

from __future__ import annotations

import datetime
import pickle
import threading

import pytest

from celery_singleton_lock import (
    Contended,
    Lease,
    LockNotAcquiredError,
    ManualClock,
    MemoryLock,
)
from celery_singleton_lock.lease import Rate, rates_of

JOIN = 10  # real seconds a helper thread may take; each is woken by the test long before


def in_thread(work: object) -> tuple[threading.Thread, list[object]]:
    """Run ``work()`` in a thread; the list gets its result or the error it raised."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(work())  # type: ignore[operator]
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


class ObservedClock(ManualClock):
    """A manual clock that says each time a thread parks on it."""

    def __init__(self) -> None:
        super().__init__()
        self.parked = threading.Semaphore(0)

    def wait(self, condition: threading.Condition, seconds: float | None) -> None:
        # The waiter still holds the condition here, so a notify cannot come before
        # the wait below begins: nothing is missed.
        self.parked.release()
        super().wait(condition, seconds)

    def parks(self) -> None:
        assert self.parked.acquire(timeout=JOIN), "the waiter never parked"


class TestLeases:
    def test_a_ttl_runs_out_only_when_the_clock_is_advanced(self) -> None:
        clock = ManualClock()
        store = MemoryLock(clock=clock)
        lease = store.try_acquire("job", 30)
        assert isinstance(lease, Lease)
        assert lease.remaining() == pytest.approx(30 * 0.99 - 0.002)
        clock.advance(29.0)
        refused = store.try_acquire("job", 30)
        assert isinstance(refused, Contended)
        assert refused.retry_after == pytest.approx(1.0)
        assert not lease.lost
        clock.advance(datetime.timedelta(seconds=1.5))
        assert lease.lost
        assert isinstance(store.try_acquire("job", 30), Lease)

    def test_an_extend_counts_from_the_clock_s_now(self) -> None:
        clock = ManualClock()
        store = MemoryLock(clock=clock)
        lease = store.try_acquire("job", 10)
        assert isinstance(lease, Lease)
        clock.advance(8)
        store.extend(lease)
        clock.advance(8)
        assert isinstance(store.try_acquire("job", 10), Contended)
        assert store.holder("job") == lease.token

    def test_a_lease_sent_to_another_process_counts_on_that_process_s_clock(self) -> None:
        store = MemoryLock(clock=ManualClock())
        lease = store.try_acquire("job", 30)
        assert isinstance(lease, Lease)
        copy = pickle.loads(pickle.dumps(lease))
        assert copy.token == lease.token
        # The machine's monotonic clock, where the manual one started: about the same.
        assert copy.remaining() == pytest.approx(lease.remaining(), abs=5)

    def test_a_store_goes_back_to_the_machine_s_clock_ahead_by_the_time_advanced(
        self,
    ) -> None:
        store = MemoryLock()
        machine, manual = store.clock, ManualClock()
        store.clock = manual
        assert isinstance(store.try_acquire("job", 30), Lease)
        manual.advance(3600)
        store.clock = machine.later(manual.moved)  # as manual_clock leaves it
        # Its ttl ran out an hour ago on the store's time: not 30 s from now.
        assert isinstance(store.try_acquire("job", 30), Lease)

    def test_the_clock_only_moves_forward(self) -> None:
        with pytest.raises(ValueError, match="only moves forward"):
            ManualClock().advance(-1)


class TestWaits:
    def test_a_blocked_acquire_takes_the_lock_when_the_clock_passes_the_holder_s_ttl(
        self,
    ) -> None:
        clock = ObservedClock()
        store = MemoryLock(clock=clock)
        store.acquire("job", 10)
        thread, outcome = in_thread(lambda: store.acquire("job", 10, timeout=60))
        clock.parks()
        clock.advance(10)
        thread.join(JOIN)
        assert isinstance(outcome[0], Lease)

    def test_a_blocked_acquire_times_out_on_the_clock(self) -> None:
        clock = ObservedClock()
        store = MemoryLock(clock=clock)
        held = store.acquire("job", 10)
        store.renew(held)  # held until released: only the timeout can end the wait
        thread, outcome = in_thread(lambda: store.acquire("job", 10, timeout=5))
        clock.parks()
        clock.advance(4)
        clock.parks()  # woken, looked, and waits again
        assert outcome == []
        clock.advance(1)
        thread.join(JOIN)
        assert isinstance(outcome[0], LockNotAcquiredError)

    def test_a_release_still_wakes_a_waiter(self) -> None:
        clock = ObservedClock()
        store = MemoryLock(clock=clock)
        held = store.acquire("job", 10)
        thread, outcome = in_thread(lambda: store.acquire("job", 10))
        clock.parks()
        store.release(held)
        thread.join(JOIN)
        assert isinstance(outcome[0], Lease)

    def test_a_wait_nothing_wakes_says_so_instead_of_hanging(self) -> None:
        store = MemoryLock(clock=ManualClock(stall=0.2))
        store.acquire("job", 10)
        with pytest.raises(TimeoutError, match=r"clock\.advance\(seconds\)"):
            store.acquire("job", 10, timeout=60)


class TestRates:
    def test_a_slot_comes_due_when_the_clock_reaches_it(self) -> None:
        clock = ManualClock()
        rates = rates_of(MemoryLock(clock=clock))
        rate = Rate(10, 1.0)
        assert rates.ask("feed", rate).now
        second = rates.ask("feed", rate, "peek")
        assert not second.now
        assert second.wait == pytest.approx(0.1)
        clock.sleep(0.1)  # what an eager call waiting for its slot does
        assert rates.ask("feed", rate).now
