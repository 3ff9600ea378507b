"""Copies of a running message (same task id) and the quiet ``skip`` policy, in real workers.

A broker redelivery, or ``send_task(..., task_id=<running id>)``, delivers a second copy
of the message that holds the lock. Whatever ``on_contention`` says, that copy must end
without writing a state or result under the id its original runs as, and without firing
its ``link_error``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import states

from ..conftest import CeleryEnv
from ..support.runs import UNTIL_OPENED, dropped, open_gate, runs, started, wait_for
from ..support.workers import Worker

pytestmark = pytest.mark.slow

POLICIES = {
    "fail": "exclusive_fail",
    "wait-then-fail": "exclusive_wait_fail",
    "requeue": "work",
    "skip": "exclusive_skip",
    "wait-then-skip": "exclusive_wait_skip",
}


@pytest.fixture(
    name="pool_worker", scope="module", params=["prefork", "threads", "gevent", "eventlet"]
)
def fixture_pool_worker(request: pytest.FixtureRequest, celery_env: CeleryEnv) -> Iterator[Worker]:
    worker = Worker(celery_env.env, pool=request.param, concurrency=3).start()
    try:
        yield worker
    finally:
        worker.stop()


class StatePoller:
    """Every state the backend shows for one task id, polled every 10 ms in a thread."""

    def __init__(self, result: Any) -> None:
        self.result = result
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._look()
            time.sleep(0.01)

    def _look(self) -> None:
        state = self.result.backend.get_task_meta(self.result.id, cache=False)["status"]
        if not self.seen or self.seen[-1] != state:
            self.seen.append(state)

    def stop(self, worker: Worker) -> list[str]:
        """The states seen, the last read once ``worker`` has nothing left to run: after
        anything the copy would write."""
        wait_for(worker.idle, 30, f"{worker.name} idle")
        self._stop.set()
        self._thread.join(5)
        self._look()
        return self.seen


def wait_dropped(cenv: CeleryEnv, worker: Worker, task: str, task_id: str) -> None:
    """Wait for ``worker`` to drop a copy of ``task_id``'s running message (its signal)."""
    wait_for(
        lambda: any(
            (s["task"], s["hostname"], s["holder_state"]) == (task, worker.nodename, "running")
            for s in dropped(cenv, task_id)
        ),
        what=f"the copy dropped on {worker.name}",
    )


class TestCopyOfTheRunningMessage:
    @pytest.mark.parametrize("policy", list(POLICIES))
    def test_a_same_id_copy_never_touches_the_originals_result(
        self, cenv: CeleryEnv, pool_worker: Worker, policy: str
    ) -> None:
        app = cenv.app_module.app
        task = getattr(cenv.app_module, POLICIES[policy])
        item = f"copy-{policy}-{pool_worker.pool}"
        original = task.apply_async((item, UNTIL_OPENED), queue=pool_worker.queue)
        poller = StatePoller(original)
        wait_for(lambda: started(cenv), what="the original's start")
        copy = app.send_task(
            task.name,
            (item, 1.5),
            task_id=original.id,
            queue=pool_worker.queue,
            link_error=cenv.app_module.note_error.s(),
        )
        assert copy.id == original.id
        wait_dropped(cenv, pool_worker, task.name, original.id)
        open_gate(cenv, item)
        assert original.get(timeout=20) == item
        seen = poller.stop(pool_worker)
        print(f"\n{policy} on {pool_worker.pool}: states {seen}")
        assert states.FAILURE not in seen
        assert seen[-1] == states.SUCCESS
        assert set(seen) <= {states.PENDING, states.STARTED, states.SUCCESS}
        assert len(runs(cenv)) == 1  # the body ran once
        # (The copy's errback, had it failed, runs in the worker as it fails: before idle.)
        assert cenv.checker_client().lrange("errbacks", 0, -1) == []
        assert len(dropped(cenv, original.id)) == 1
        assert "DuplicateTaskError" not in pool_worker.output().split(original.id, 1)[1]

    def test_a_retry_still_runs_after_its_first_attempt_and_keeps_the_key(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        work = cenv.app_module.work
        item = f"retry-{pool_worker.pool}"
        result = work.apply_async((item, 0.2, "retry"), queue=pool_worker.queue)
        wait_for(lambda: runs(cenv), what="the first attempt")
        # Between the attempts the key is held for the retry: a new call is refused.
        assert work.apply_async((item,), queue=pool_worker.queue).id == result.id
        assert result.get(timeout=20) == item
        attempts = runs(cenv)
        assert [r["retries"] for r in attempts] == [0, 1]
        assert dropped(cenv, result.id) == []  # the retry is no copy of its first attempt


class TestCopyOnAnotherWorker:
    def test_a_copy_on_another_worker_is_dropped_once_the_holders_worker_says_it_runs(
        self, cenv: CeleryEnv, pool_worker: Worker, worker: Worker
    ) -> None:
        app = cenv.app_module.app
        task = cenv.app_module.exclusive_fail
        item = f"elsewhere-{pool_worker.pool}"
        original = task.apply_async((item, UNTIL_OPENED), queue=pool_worker.queue)
        poller = StatePoller(original)
        wait_for(lambda: started(cenv), what="the original's start")
        app.send_task(task.name, (item,), task_id=original.id, queue=worker.queue)
        wait_dropped(cenv, worker, task.name, original.id)
        open_gate(cenv, item)
        assert original.get(timeout=20) == item
        assert states.FAILURE not in poller.stop(worker)
        assert len(runs(cenv)) == 1

    def test_a_dead_workers_lease_is_no_live_original_the_copy_runs_after_it(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        """RabbitMQ redelivers at once when a worker dies, before its lease runs out:
        that delivery must run (once the lease is free), never be dropped as a copy."""
        ttl = 2.0
        doomed = Worker(cenv.env, extra_env={"CSL_TTL": str(ttl)}).start()
        try:
            work = cenv.app_module.work
            original = work.apply_async(("orphaned", 60), queue=doomed.queue)
            wait_for(lambda: started(cenv), what="the original's start")
            doomed.kill()
        finally:
            doomed.stop()
        redelivered = cenv.app_module.app.send_task(
            work.name, ("orphaned", 0.1), task_id=original.id, queue=worker.queue
        )
        assert redelivered.get(timeout=30) == "orphaned"
        [run] = runs(cenv)
        assert run["id"] == original.id
        assert dropped(cenv, original.id) == []


class TestSkip:
    @pytest.mark.parametrize("task_name", ["exclusive_skip", "exclusive_wait_skip"])
    def test_a_contended_send_task_copy_ends_ignored_with_one_info_line(
        self, cenv: CeleryEnv, pool_worker: Worker, task_name: str
    ) -> None:
        app = cenv.app_module.app
        task = getattr(cenv.app_module, task_name)
        item = f"skip-{task_name}-{pool_worker.pool}"
        holder = task.apply_async((item, UNTIL_OPENED), queue=pool_worker.queue)
        wait_for(lambda: started(cenv), what="the holder's start")
        copy = app.send_task(
            task.name, (item,), queue=pool_worker.queue, link_error=cenv.app_module.note_error.s()
        )
        wait_for(lambda: copy.state == states.IGNORED, 10, "the copy's IGNORED state")
        open_gate(cenv, item)
        assert holder.get(timeout=20) == item
        assert len(runs(cenv)) == 1
        log = pool_worker.output().split(copy.id, 1)[1]
        contended = f"contended at execution: task={task.name} id={copy.id}"
        assert pool_worker.output().count(contended) == 1
        assert ("then=wait up to 0.3s" if "wait" in task_name else "then=skip") in log
        assert "Traceback" not in log
        assert cenv.checker_client().lrange("errbacks", 0, -1) == []
