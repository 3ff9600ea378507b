"""Every worker pool keeps every promise: prefork, threads, gevent, eventlet and solo.

One real ``celery worker -P <pool>`` per pool (module-scoped), on the shared broker and
lock store. Each test runs in every pool: dispatch dedupe, execution exclusion for
``send_task`` copies under each contention policy, a rate's deferrals, renewal past 3x
the ttl, the key given back however a task ends, and no per-task extra commands or log
lines.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_singleton_lock import DuplicateTaskError

from ..conftest import SAME_SERVER, CeleryEnv
from ..support.rates import check_rate, rated_runs
from ..support.runs import (
    assert_no_overlap,
    lock_keys,
    runs,
    started,
    wait_for,
    waiting_for_a_wake_up,
)
from ..support.workers import Worker

POOLS = ["prefork", "threads", "gevent", "eventlet", "solo"]
TTL = 1.5  # the workers' lease ttl: short, so renewal is exercised within a test


@pytest.fixture(name="pool_worker", scope="module", params=POOLS)
def fixture_pool_worker(request: pytest.FixtureRequest, celery_env: CeleryEnv) -> Iterator[Worker]:
    pool = request.param
    worker = Worker(
        celery_env.env,
        pool=pool,
        concurrency=1 if pool == "solo" else 4,
        extra_env={"CSL_TTL": str(TTL)},
    ).start()
    try:
        yield worker
    finally:
        worker.stop()


def _send(cenv: CeleryEnv, worker: Worker, task: Any, *args: Any) -> Any:
    """A copy that bypasses dispatch (another service, a scheduler sending by name)."""
    return cenv.app_module.app.send_task(task.name, args, queue=worker.queue)


def _settle_results(*results: Any) -> None:
    # Celery 5.3's AsyncResult.__del__ unsubscribes from the result backend: let it
    # while the servers are up, not at interpreter exit.
    del results
    gc.collect()


class TestEveryPool:
    def test_a_duplicate_dispatch_is_refused(self, cenv: CeleryEnv, pool_worker: Worker) -> None:
        work = cenv.app_module.work
        first = work.apply_async(("dedupe", 0.5), queue=pool_worker.queue)
        second = work.apply_async(("dedupe", 0.5), queue=pool_worker.queue)
        assert second.id == first.id
        assert first.get(timeout=20) == "dedupe"
        assert [r["id"] for r in runs(cenv)] == [first.id]
        wait_for(lambda: lock_keys(cenv) == [], what="the key given back")

    def test_a_rate_defers_runs_to_their_slots_and_loses_none(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        rated = cenv.app_module.rated
        results = [rated.apply_async(("pool", n), queue=pool_worker.queue) for n in range(8)]
        assert [r.get(timeout=30) for r in results] == list(range(8))
        check_rate(rated_runs(cenv), 20, 1.0)
        _settle_results(*results)

    def test_copies_under_requeue_run_one_after_the_other(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        work = cenv.app_module.work
        copies = [_send(cenv, pool_worker, work, "requeue", 0.5) for _ in range(3)]
        for copy in copies:
            assert copy.get(timeout=60) == "requeue"
        assert sorted(r["id"] for r in runs(cenv)) == sorted(c.id for c in copies)
        assert_no_overlap(runs(cenv))
        wait_for(lambda: lock_keys(cenv) == [], what="the key given back")

    def test_a_copy_under_fail_fails_naming_the_holder(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        if pool_worker.pool == "solo":
            pytest.skip("one execution at a time: a solo worker never has two at once")
        strict = cenv.app_module.strict
        holder = _send(cenv, pool_worker, strict, "fail", 2.0)
        wait_for(lambda: started(cenv), what="the holder started")
        copy = _send(cenv, pool_worker, strict, "fail", 0.0)
        with pytest.raises(DuplicateTaskError, match=holder.id):
            copy.get(timeout=20)
        assert holder.get(timeout=20) == "fail"
        assert [r["id"] for r in runs(cenv)] == [holder.id]

    def test_a_copy_under_wait_waits_without_blocking_other_tasks(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        if pool_worker.pool == "solo":
            pytest.skip("one execution at a time: a solo worker never has two at once")
        patient, work = cenv.app_module.patient, cenv.app_module.work
        holder = _send(cenv, pool_worker, patient, "wait", 2.0)
        wait_for(lambda: started(cenv), what="the holder started")
        waiter = _send(cenv, pool_worker, patient, "wait", 0.0)
        wait_for(lambda: waiting_for_a_wake_up(cenv), what="the waiter parked on the wake-up")
        # While the waiter is parked on the push wake-up, the pool still runs other work.
        other = work.apply_async(("elsewhere", 0.0), queue=pool_worker.queue)
        assert other.get(timeout=20) == "elsewhere"
        by_id = {r["id"]: r for r in runs(cenv)}
        assert holder.id not in by_id, "another task waited for the holder to finish"
        assert holder.get(timeout=20) == waiter.get(timeout=20) == "wait"
        records = [r for r in runs(cenv) if r["item"] == "wait"]
        assert len(records) == 2
        assert_no_overlap(records)

    def test_renewal_keeps_a_task_past_three_times_its_ttl(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        work = cenv.app_module.work
        long = work.apply_async(("long", 3.5 * TTL), queue=pool_worker.queue)
        wait_for(lambda: started(cenv), what="the task started")
        time.sleep(3 * TTL)
        # Still held by the running execution, which a duplicate dispatch is told of.
        assert lock_keys(cenv), "the lease expired while its task ran"
        assert work.apply_async(("long",), queue=pool_worker.queue).id == long.id
        assert long.get(timeout=20) == "long"
        wait_for(lambda: lock_keys(cenv) == [], what="the key given back")

    @pytest.mark.parametrize("mode", ["ok", "fail", "retry", "ignore", "reject"])
    def test_every_way_a_task_ends_gives_the_key_back(
        self, cenv: CeleryEnv, pool_worker: Worker, mode: str
    ) -> None:
        work = cenv.app_module.work
        result = work.apply_async((f"end-{mode}", 0.0, mode), queue=pool_worker.queue)
        expected = {"ok": 1, "fail": 1, "retry": 2, "ignore": 1, "reject": 1}[mode]
        wait_for(lambda: len(runs(cenv)) >= expected, what=f"{expected} run(s)")
        wait_for(lambda: lock_keys(cenv) == [], what="the key given back")
        if mode in ("ok", "retry"):
            assert result.get(timeout=20) == f"end-{mode}"
        if mode == "fail":
            _wait_failure_logged(pool_worker, result.id)
        _settle_results(result)

    def test_a_hard_time_limit_gives_the_key_back(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        if pool_worker.pool in ("threads", "eventlet", "solo"):
            pytest.skip(f"Celery's {pool_worker.pool} pool has no time limits")
        limited = cenv.app_module.limited
        result = limited.apply_async(("limit", 5.0), queue=pool_worker.queue)
        wait_for(lambda: result.state == "FAILURE", 20, "the hard time limit")
        _wait_failure_logged(pool_worker, result.id)
        wait_for(lambda: lock_keys(cenv) == [], 2.0, "the key given back")
        assert runs(cenv) == []
        if pool_worker.pool == "prefork":
            pool_worker.settle()

    def test_no_extra_commands_or_log_lines_per_task(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        work = cenv.app_module.work
        store = cenv.lock_client()
        before = _calls(store)
        log_before = len(pool_worker.output().splitlines())
        tasks = 40
        results = [work.apply_async((f"cost-{n}",), queue=pool_worker.queue) for n in range(tasks)]
        for result in results:
            result.get(timeout=60)
        # The last release comes after the task reports success.
        wait_for(lambda: lock_keys(cenv) == [], 5, "the last release")
        spent = _calls(store) - before
        lines = pool_worker.output().splitlines()[log_before:]
        ours = [line for line in lines if "received" not in line and "succeeded" not in line]
        print({"pool": pool_worker.pool, "lock_store_calls_per_task": spent / tasks})
        # The dispatch's hold (the lock store is not the broker's server here), the
        # running lease the worker takes as the message arrives (the run starts under
        # it), and the release; renewals hardly fall due in tasks this short, and the
        # first calls after the test's script flush load their scripts. On the broker's
        # server kombu's own scripts count too, and ours ride its round trips (the hold
        # the push, the take and the in-transit note's forget the unacked pipeline, the
        # release the result's): `dev.py bench --only round_trips` counts trips there.
        if not SAME_SERVER:
            assert spent / tasks <= 3.2
        assert ours == [], ours[:5]
        assert lock_keys(cenv) == []
        # Only prefork has pool children to watch; nothing is kept per task.
        [reply] = cenv.app_module.app.control.broadcast(
            "singleton_stats", destination=[pool_worker.nodename], reply=True, timeout=5
        )
        stats = reply[pool_worker.nodename]
        assert stats["child_watch"] is (pool_worker.pool == "prefork")
        assert stats["reservations"] == 0
        _settle_results(*results)


def _wait_failure_logged(worker: Worker, task_id: str) -> None:
    """Celery logs a failure (ERROR, with its traceback) after it stores it: wait for the
    line, or a later test on this worker that counts log lines would count it."""

    def logged() -> bool:
        return any(task_id in line and "ERROR/" in line for line in worker.output().splitlines())

    wait_for(logged, 10, f"the failure of {task_id} logged")


def _calls(store: Any) -> int:
    """Lock-store calls so far: scripts, and dispatch holds (a SET and PTTL, pipelined).

    Counted from ``commandstats``, where a script's own commands count too: scripts by
    EVAL/EVALSHA, holds by their PTTL (a script asks PTTL only of a contended key).
    """
    stats = store.info("commandstats")
    return sum(
        stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("eval", "evalsha", "pttl")
    )


class TestRevoke:
    def test_revoking_a_countdown_task_frees_its_key_within_two_seconds(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        work = cenv.app_module.work
        later = work.apply_async(("revoked",), countdown=30, queue=pool_worker.queue)
        key = lock_keys(cenv)[0]
        wait_for(lambda: pool_worker.took(cenv.lock_client().get(key)), what="reserved")
        cenv.app_module.app.control.revoke(later.id)
        revoked_at = time.monotonic()
        again = wait_for(
            lambda: (
                (r := work.apply_async(("revoked",), queue=pool_worker.queue)).id != later.id and r
            ),
            timeout=5,
            what="a new dispatch accepted",
        )
        assert time.monotonic() - revoked_at < 2.0
        assert again.get(timeout=20) == "revoked"
        assert [r["id"] for r in runs(cenv)] == [again.id]
        _settle_results(later, again)
