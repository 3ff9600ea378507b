"""``lock="until_executing"``: one running and one pending, in a real worker."""

from __future__ import annotations

import os
import signal
import time

from ..conftest import CeleryEnv
from ..support.modes import (
    held,
    of,
    storm,
)
from ..support.runs import (
    UNTIL_OPENED,
    assert_no_overlap,
    open_gate,
    requeued,
    runs,
    started,
    wait_for,
    waiting_for_a_wake_up,
)
from ..support.workers import Worker


class TestUntilExecutingInAWorker:
    def test_one_running_and_one_pending_under_a_storm(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        refresh = cenv.app_module.refresh
        first = refresh.apply_async(("s1", UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: started(cenv), 10, "first run")
        ids = storm(refresh, "s1", worker.queue)
        open_gate(cenv, "s1")
        assert len(ids) == 1, "a storm during a run queues exactly one pending call"
        [pending] = ids
        assert pending != first.id
        assert refresh.AsyncResult(pending).get(timeout=20) == "s1"
        done = of(runs(cenv), "s1")
        assert [r["id"] for r in done] == [first.id, pending]
        assert done[0]["end"] <= done[1]["start"], "the pending call runs after the running one"
        assert_no_overlap(done)
        wait_for(lambda: not held(cenv), 3, "keys freed")

    def test_a_pending_call_that_must_wait_keeps_its_place(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        # Two children: the pending call starts at once, finds the key running, and
        # requeues; it stays the pending call, so later calls still get its result.
        refresh = cenv.app_module.refresh
        first = refresh.apply_async(("s2", UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: started(cenv), 10, "first run")
        pending = refresh.apply_async(("s2",), queue=worker.queue)
        wait_for(lambda: requeued(worker.output(), pending.id), 10, "the pending call requeued")
        later = {refresh.apply_async(("s2",), queue=worker.queue).id for _ in range(5)}
        open_gate(cenv, "s2")
        assert later == {pending.id}
        assert pending.get(timeout=20) == "s2"
        assert [r["id"] for r in of(runs(cenv), "s2")] == [first.id, pending.id]
        assert_no_overlap(of(runs(cenv), "s2"))
        wait_for(lambda: not held(cenv), 3, "keys freed")

    def test_a_waiting_pending_call_keeps_its_place(self, cenv: CeleryEnv, worker: Worker) -> None:
        patient = cenv.app_module.refresh_waiting
        first = patient.apply_async(("s3", UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: started(cenv), 10, "first run")
        pending = patient.apply_async(("s3",), queue=worker.queue)
        # Parked in the second child, waiting for the push wake-up.
        wait_for(lambda: waiting_for_a_wake_up(cenv), 10, "the pending call parked")
        assert {patient.apply_async(("s3",), queue=worker.queue).id for _ in range(5)} == {
            pending.id
        }
        open_gate(cenv, "s3")
        assert pending.get(timeout=20) == "s3"
        records = of(runs(cenv), "s3")
        assert [r["id"] for r in records] == [first.id, pending.id]
        assert_no_overlap(records)
        wait_for(lambda: not held(cenv), 3, "keys freed")

    def test_a_retry_keeps_the_key_and_a_call_during_it_runs_after(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        refresh = cenv.app_module.refresh
        first = refresh.apply_async(("s4", 0.2, "retry"), queue=worker.queue)
        wait_for(lambda: of(runs(cenv), "s4"), 10, "first attempt")
        during = refresh.apply_async(("s4",), queue=worker.queue)  # the retry is not pending
        assert during.id != first.id
        assert first.get(timeout=20) == "s4"
        assert during.get(timeout=20) == "s4"
        records = of(runs(cenv), "s4")
        assert [r["id"] for r in records] == [first.id, first.id, during.id]
        assert_no_overlap(records)
        wait_for(lambda: not held(cenv), 3, "keys freed")

    def test_a_killed_child_frees_the_key_and_the_pending_hold(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        refresh = cenv.app_module.refresh
        refresh.apply_async(("s5", 30.0), queue=worker.queue)
        [begun] = wait_for(lambda: started(cenv), 10, "run")
        pending = refresh.apply_async(("s5",), queue=worker.queue)
        wait_for(lambda: requeued(worker.output(), pending.id), 10, "the pending call requeued")
        killed = time.monotonic()
        os.kill(begun["pid"], signal.SIGKILL)
        assert pending.get(timeout=20) == "s5"
        assert time.monotonic() - killed < 5
        wait_for(lambda: not held(cenv), 3, "keys freed")
