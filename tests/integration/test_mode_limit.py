"""``limit=N``: N executions at once across workers, slots kept by retries."""

from __future__ import annotations

import os
import signal
import time

from celery_singleton_lock.lease import slot

from ..conftest import CeleryEnv
from ..support.modes import (
    concurrency,
    held,
    name_of,
    of,
)
from ..support.runs import (
    UNTIL_OPENED,
    open_gate,
    runs,
    started,
    wait_for,
    waiting_for_a_wake_up,
)
from ..support.workers import Worker


class TestLimitInWorkers:
    def test_never_more_than_the_limit_across_three_workers(
        self, cenv: CeleryEnv, three_workers: list[Worker]
    ) -> None:
        export, queue = cenv.app_module.export, three_workers[0].queue
        results = [export.apply_async(("l1", 0.4), queue=queue) for _ in range(12)]
        other = export.apply_async(("l2", 0.4), queue=queue)  # another key is not counted
        for result in [*results, other]:
            assert result.get(timeout=60) == result.result
        records = of(runs(cenv), "l1")
        assert len(records) == 12
        assert concurrency(records) == 3, "three at once, never four"
        fences = [r["fence"] for r in records]
        assert len(set(fences)) == 12
        assert {r["key"] for r in records} == {slot(name_of(export, "l1"), n) for n in (1, 2, 3)}
        wait_for(lambda: not held(cenv), 3, "slots freed")

    def test_waiters_run_in_turn_and_a_killed_child_frees_its_slot(
        self, cenv: CeleryEnv, three_workers: list[Worker]
    ) -> None:
        export, queue = cenv.app_module.export_waiting, three_workers[0].queue
        long = [export.apply_async(("l3", UNTIL_OPENED), queue=queue) for _ in range(3)]
        begun = wait_for(lambda: len(started(cenv)) == 3 and started(cenv), 20, "three runs")
        waiting = [export.apply_async(("l3", 0.2), queue=queue) for _ in range(2)]
        # Both refused a slot by now: each parked on the push wake-up, none started.
        wait_for(lambda: waiting_for_a_wake_up(cenv) == 2, 20, "both waiters parked")
        assert len(started(cenv)) == 3, "the fourth waits for a slot"
        killed = time.monotonic()
        os.kill(begun[0]["pid"], signal.SIGKILL)
        # The other runs hold their slots until the gate opens: only the dead child's slot
        # can serve a waiter now.
        wait_for(lambda: any(r.ready() for r in waiting), 1.5, "the dead child's slot to a waiter")
        assert time.monotonic() - killed < 1.5
        for _ in range(2):
            open_gate(cenv, "l3")
        survivors = [r for r in long if r.id != begun[0]["id"]]
        for result in [*survivors, *waiting]:
            assert result.get(timeout=20) == "l3"
        assert concurrency(of(runs(cenv), "l3")) <= 3
        wait_for(lambda: not held(cenv), 5, "slots freed")

    def test_a_retry_keeps_its_slot(self, cenv: CeleryEnv, worker: Worker) -> None:
        export = cenv.app_module.export
        first = export.apply_async(("l4", 0.1, "retry"), queue=worker.queue)
        assert first.get(timeout=20) == "l4"
        records = of(runs(cenv), "l4")
        assert [r["retries"] for r in records] == [0, 1]
        assert records[0]["key"] == records[1]["key"], "the retry ran in the slot it kept"
        assert records[0]["fence"] < records[1]["fence"]
        wait_for(lambda: not held(cenv), 3, "slots freed")
