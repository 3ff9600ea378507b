"""A lease found lost by one thread while another calls ``check()``: the callbacks have
run by the time ``check()`` raises, whichever thread found the loss."""

from __future__ import annotations

import threading
import time

import pytest

from celery_singleton_lock import Lease, LockLostError


def test_check_waits_for_a_loss_another_thread_is_reporting() -> None:
    lease = Lease.granted("job", "k", "t", fence=1, ttl=10.0, sent_at=time.monotonic())
    reporting, done = threading.Event(), []

    def slow_callback(_: Lease) -> None:
        reporting.set()
        time.sleep(0.2)
        done.append(time.monotonic())

    lease.on_lost(slow_callback)
    reporter = threading.Thread(target=lease.mark_lost, args=("taken",))
    reporter.start()
    assert reporting.wait(5)
    with pytest.raises(LockLostError, match="taken"):
        lease.check()
    raised = time.monotonic()
    reporter.join(5)
    assert done
    assert done[0] <= raised


def test_a_callback_that_checks_its_own_lease_does_not_wait() -> None:
    lease = Lease.granted("job", "k", "t", fence=1, ttl=10.0, sent_at=time.monotonic())
    seen: list[str] = []

    def check_inside(lost: Lease) -> None:
        started = time.monotonic()
        with pytest.raises(LockLostError):
            lost.check()
        seen.append(f"{time.monotonic() - started:.3f}")

    lease.on_lost(check_inside)
    lease.mark_lost("taken")
    assert seen
    assert float(seen[0]) < 0.5
