"""``debounce=`` / ``max_wait=``: at dispatch and through a burst in a real worker."""

from __future__ import annotations

import time

import pytest
import redis

from celery_singleton_lock import ConfigurationError

from ..conftest import CeleryEnv
from ..support.modes import (
    QUEUE,
    held,
    of,
    results_of,
)
from ..support.runs import assert_no_overlap, runs, wait_for
from ..support.workers import Worker


class TestDebounceDispatch:
    def test_a_countdown_is_refused_before_anything_is_sent(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        debounced = cenv.app_module.debounced
        with pytest.raises(ConfigurationError, match="debounce sets each call's countdown"):
            debounced.apply_async(("b0", "v"), queue=QUEUE, countdown=3)
        assert queue.llen(QUEUE) == 0
        assert not held(cenv)


class TestDebounceInAWorker:
    def test_one_run_after_the_burst_with_the_last_arguments(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        debounced = cenv.app_module.debounced
        ids = set()
        for n in range(5):
            ids.add(debounced.apply_async(("b1", f"v{n}"), queue=worker.queue).id)
            last_call = time.time()
            time.sleep(0.1)
        [run_id] = ids
        assert debounced.AsyncResult(run_id).get(timeout=20) == "v4"
        [record] = of(runs(cenv), "b1")
        assert record["version"] == "v4"
        assert record["start"] - last_call >= 0.45, "it waits for the quiet spell"
        wait_for(lambda: not held(cenv), 3, "keys freed")

    def test_max_wait_bounds_a_steady_stream(self, cenv: CeleryEnv, worker: Worker) -> None:
        debounced = cenv.app_module.debounced
        first_call = time.time()
        results = []
        while time.time() - first_call < 2.6:
            results.append(debounced.apply_async(("b2", f"v{len(results)}"), queue=worker.queue))
            time.sleep(0.15)
        versions = set(results_of(results, worker, 20))  # no caller is left waiting
        records = of(runs(cenv), "b2")
        assert records[0]["start"] - first_call < 1.5 + 0.6, "no later than max_wait"
        assert 2 <= len(records) <= 4
        assert {r["id"] for r in records} == {r.id for r in results}
        assert versions == {r["version"] for r in records}
        assert_no_overlap(records)
        wait_for(lambda: not held(cenv), 5, "keys freed")

    def test_a_replaced_message_stores_no_state_under_the_shared_id(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        """task_track_started is on in the test app: Celery's tracer would store STARTED
        for the replaced message when its countdown comes, while the call's one run is
        still 0.2 s away (and, racing a SUCCESS, could overwrite it for good)."""
        debounced = cenv.app_module.debounced
        first = debounced.apply_async(("b3", "v0"), queue=worker.queue)
        # Well inside the 0.5 s window even on a loaded machine (0.4 s left too little:
        # the second call once came after it); 0.2 s is ten of the polls below.
        time.sleep(0.2)
        assert debounced.apply_async(("b3", "v1"), queue=worker.queue).id == first.id
        seen: list[tuple[float, str]] = []
        deadline = time.time() + 10
        while time.time() < deadline and first.state != "SUCCESS":
            seen.append((time.time(), first.state))
            time.sleep(0.02)
        assert first.get(timeout=10) == "v1"
        [record] = of(runs(cenv), "b3")
        started = [at for at, state in seen if state == "STARTED"]
        assert not started or started[0] >= record["start"] - 0.05, (
            f"STARTED {record['start'] - started[0]:.2f}s before the run began: the "
            "replaced message stored it"
        )
        assert first.state == "SUCCESS"
