"""``throttle=``: one accepted call per window, in a real worker and on a manual clock."""

from __future__ import annotations

from celery import Celery

from celery_singleton_lock import singleton_task
from celery_singleton_lock.contrib.testing import manual_clock

from ..conftest import CeleryEnv
from ..support.modes import (
    held,
    of,
    storm,
)
from ..support.runs import assert_no_overlap, runs, wait_for
from ..support.workers import Worker


class TestThrottleInAWorker:
    def test_one_run_per_window_and_copies_never_overlap(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        throttled = cenv.app_module.throttled
        ids = storm(throttled, "t1", worker.queue, calls=10)
        assert len(ids) == 1
        [accepted] = ids
        # A copy that bypasses dispatch (send_task) is not throttled, but never overlaps.
        copy = throttled.app.send_task(throttled.name, ("t1", 0.3), queue=worker.queue)
        assert throttled.AsyncResult(accepted).get(timeout=20) == "t1"
        assert copy.get(timeout=20) == "t1"
        wait_for(lambda: throttled.apply_async(("t1",), queue=worker.queue).id != accepted, 4)
        wait_for(lambda: len(of(runs(cenv), "t1")) == 3, 20, "three runs")
        assert_no_overlap(of(runs(cenv), "t1"))
        wait_for(lambda: all(k.endswith(b":throttle") for k in held(cenv)), 3, "freed")


class TestThrottleOnAManualClock:
    def test_one_accepted_call_per_window_from_acceptance(self) -> None:
        app = Celery("modes-clock", set_as_current=False)
        app.conf.update(task_always_eager=True, singleton_lock_url="memory://")

        @singleton_task(app=app, name="modes.clock.sync", key=["k"], throttle=60)
        def sync(k: str) -> str:
            return k

        with manual_clock(app) as clock:
            first = sync.apply_async(("a",), task_id="first")
            clock.advance(59.9)
            assert sync.apply_async(("a",)).id == "first"
            clock.advance(0.2)  # 60.1 s after acceptance: a new window
            second = sync.apply_async(("a",), task_id="second")
            assert second.id == "second"
            clock.advance(30)
            assert sync.apply_async(("a",)).id == "second"
        assert first.get() == second.get() == "a"
