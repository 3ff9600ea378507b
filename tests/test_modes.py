"""Lock modes: ``lock=`` scopes (until_executed, until_executing, while_executing) and
``throttle``, checked at decoration, at dispatch (real Redis, the broker's queue read
directly) and through a real prefork worker with an external execution log."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from redis.crc import key_slot

from celery_singleton_lock import ConfigurationError, DuplicateTaskError, singleton_task
from celery_singleton_lock.lease import LockKeys, companion, split_role
from celery_singleton_lock.tokens import HOLD_HEADER, TOKEN_HEADER

from .conftest import CeleryEnv
from .test_celery_lifecycle import assert_no_overlap, lock_keys, runs, started, wait_for
from .workers import Worker

QUEUE = "modes-dispatch"


def define(**options: Any) -> Any:
    app = Celery("modes-options", set_as_current=False)

    def body(item: str) -> str:
        return item

    return singleton_task(app=app, name=f"modes.t{time.monotonic_ns()}", **options)(body)


class TestOptions:
    @pytest.mark.parametrize(
        ("options", "scope"),
        [
            ({}, "until_executed"),
            ({"dedupe": False}, "while_executing"),
            ({"lock": "until_executing"}, "until_executing"),
            ({"lock": "while_executing"}, "while_executing"),
            ({"lock": "until_executed", "dedupe": True}, "until_executed"),
        ],
    )
    def test_scopes(self, options: dict[str, Any], scope: str) -> None:
        opts = define(**options).singleton_options()
        assert opts.lock == scope
        assert opts.dedupe is (scope != "while_executing")

    @pytest.mark.parametrize(
        ("options", "says"),
        [
            ({"lock": "until_started"}, r"lock='until_started' is not a lock scope"),
            ({"lock": "until_executing", "dedupe": False}, r"contradict.*write lock= alone"),
            ({"lock": "while_executing", "dedupe": True}, r"contradict"),
            ({"throttle": 60, "lock": "until_executing"}, r"throttle with lock=.*alone"),
            ({"throttle": 60, "lock": "while_executing"}, r"throttle with lock="),
            ({"throttle": 60, "dedupe": False}, r"throttle with dedupe=False"),
            ({"throttle": 0}, r"throttle must be positive"),
            ({"throttle": -1}, r"throttle must be positive"),
            ({"throttle": "60"}, r"throttle must be a number of seconds"),
            ({"debounce": 5}, r"not supported by this version"),
            ({"limit": 3}, r"not supported by this version"),
        ],
    )
    def test_contradictions_fail_at_decoration(self, options: dict[str, Any], says: str) -> None:
        with pytest.raises(ConfigurationError, match=says):
            define(**options)

    def test_throttle_takes_a_timedelta(self) -> None:
        assert define(throttle=timedelta(minutes=1)).singleton_options().throttle == 60.0


class TestCompanionKeys:
    def test_a_companion_shares_the_hash_tag_and_collides_with_nothing(self) -> None:
        own, pending = LockKeys.build("p", "k"), LockKeys.build("p", companion("k", "pending"))
        assert own.lock == "p:{k}"
        assert pending.lock == "p:{k}:pending"
        assert pending.fence == "p:{k}:pending:fence"
        ours = {own.lock, own.fence, own.signal, own.waiters}
        assert not ours & {pending.lock, pending.fence, pending.signal, pending.waiters}
        assert split_role(companion("k", "throttle")) == ("k", "throttle")
        assert split_role("k") == ("k", None)
        with pytest.raises(ConfigurationError, match="unknown companion role"):
            companion("k", "other")

    def test_names_that_need_quoting_keep_one_cluster_slot(self) -> None:
        name = "tenant {7}*"
        own, pending = LockKeys.build("p", name), LockKeys.build("p", companion(name, "pending"))
        assert pending.lock == own.lock + ":pending"
        assert key_slot(own.lock.encode()) == key_slot(pending.lock.encode())


@pytest.fixture(name="queue")
def fixture_queue(cenv: CeleryEnv) -> Any:
    broker = cenv.broker.client()
    broker.delete(QUEUE)
    yield broker
    broker.delete(QUEUE)


def reads(client: redis.Redis) -> int:
    return int(client.info("stats")["total_reads_processed"])


class TestDispatch:
    def test_until_executing_holds_beside_the_key_in_one_round_trip(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        refresh, lock = cenv.app_module.refresh, cenv.lock_client()
        refresh.apply_async(("warm",), queue=QUEUE)  # scripts and connections in place
        before = reads(lock)
        first = refresh.apply_async(("d1",), queue=QUEUE)
        assert reads(lock) - before - 1 == 1  # minus the INFO read itself
        again = [refresh.apply_async(("d1",), queue=QUEUE) for _ in range(10)]
        assert {r.id for r in again} == {first.id}
        assert queue.llen(QUEUE) == 2
        key = refresh.singleton_options().key.derive(("d1",))
        assert lock.get(f"t:{{{key}}}") is None  # the key itself is for the run
        assert lock.get(f"t:{{{key}}}:pending").decode().endswith(first.id)

    def test_until_executing_refuses_while_pending_even_if_one_runs(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        refresh, store = cenv.app_module.refresh, cenv.app_module.refresh._singleton_store.lock
        key = refresh.singleton_options().key.derive(("d2",))
        running = store.try_acquire(key, 10, token="x|elsewhere|1|n|someone")
        first = refresh.apply_async(("d2",), queue=QUEUE)  # accepted: nothing pending
        assert refresh.apply_async(("d2",), queue=QUEUE).id == first.id
        store.release(running)
        assert queue.llen(QUEUE) == 1

    def test_until_executing_raise_says_queued(self, cenv: CeleryEnv, queue: redis.Redis) -> None:
        app = cenv.app_module.app

        def body(item: str) -> str:
            return item

        strict = singleton_task(
            app=app, name="modes.raise", key=["item"], lock="until_executing", on_duplicate="raise"
        )(body)
        first = strict.apply_async(("d3",), queue=QUEUE)
        with pytest.raises(DuplicateTaskError, match="is already queued for") as caught:
            strict.apply_async(("d3",), queue=QUEUE)
        assert caught.value.task_id == first.id

    def test_throttle_accepts_one_call_per_window(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        throttled, lock = cenv.app_module.throttled, cenv.lock_client()
        throttled.apply_async(("warm",), queue=QUEUE)
        before = reads(lock)
        first = throttled.apply_async(("d4",), queue=QUEUE)
        assert reads(lock) - before - 1 == 1
        assert {throttled.apply_async(("d4",), queue=QUEUE).id for _ in range(10)} == {first.id}
        message = queue.lindex(QUEUE, 0)
        assert TOKEN_HEADER.encode() not in message  # the window is nobody's to take over
        assert HOLD_HEADER.encode() not in message
        wait_for(lambda: throttled.apply_async(("d4",), queue=QUEUE).id != first.id, 3, "window")
        assert queue.llen(QUEUE) == 3  # warm, the first window's call, the second's

    def test_canvas_members_are_never_refused(self, cenv: CeleryEnv, queue: redis.Redis) -> None:
        throttled = cenv.app_module.throttled
        first = throttled.apply_async(("d5",), queue=QUEUE)
        linked = throttled.apply_async(("d5",), queue=QUEUE, link=throttled.si("d6"))
        assert linked.id != first.id
        assert queue.llen(QUEUE) == 2


def _storm(task_name: str, item: str, calls: int, barrier: Any, out: Any) -> None:
    from tests import celery_app

    task = celery_app.app.tasks[task_name]
    barrier.wait(10)
    out.put([task.apply_async((item,), queue=celery_app.app.conf.task_default_queue).id
             for _ in range(calls)])  # fmt: skip


def storm(task: Any, item: str, queue: str, processes: int = 8, calls: int = 20) -> set[str]:
    """``processes`` forked producers, ``calls`` dispatches each, released at a barrier."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    task.app.conf.task_default_queue = queue
    procs = [
        ctx.Process(target=_storm, args=(task.name, item, calls, barrier, out))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        ids = [i for _ in procs for i in out.get(timeout=30)]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert len(ids) == processes * calls
    return set(ids)


def held(cenv: CeleryEnv) -> list[bytes]:
    """Locks and holds still taken (a wait's signal keys expire by themselves)."""
    return [k for k in lock_keys(cenv) if not k.endswith((b":signal", b":waiters"))]


def of(records: list[dict[str, Any]], item: str) -> list[dict[str, Any]]:
    return sorted((r for r in records if r["item"] == item), key=lambda r: r["start"])


class TestUntilExecutingInAWorker:
    def test_one_running_and_one_pending_under_a_storm(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        refresh = cenv.app_module.refresh
        first = refresh.apply_async(("s1", 1.5), queue=worker.queue)
        wait_for(lambda: started(cenv), 10, "first run")
        ids = storm(refresh, "s1", worker.queue)
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
        first = refresh.apply_async(("s2", 1.5), queue=worker.queue)
        wait_for(lambda: started(cenv), 10, "first run")
        pending = refresh.apply_async(("s2",), queue=worker.queue)
        time.sleep(0.5)  # it has met the running key and been requeued meanwhile
        later = {refresh.apply_async(("s2",), queue=worker.queue).id for _ in range(5)}
        assert later == {pending.id}
        assert pending.get(timeout=20) == "s2"
        assert [r["id"] for r in of(runs(cenv), "s2")] == [first.id, pending.id]
        assert_no_overlap(of(runs(cenv), "s2"))
        wait_for(lambda: not held(cenv), 3, "keys freed")

    def test_a_waiting_pending_call_keeps_its_place(self, cenv: CeleryEnv, worker: Worker) -> None:
        patient = cenv.app_module.refresh_waiting
        first = patient.apply_async(("s3", 1.5), queue=worker.queue)
        wait_for(lambda: started(cenv), 10, "first run")
        pending = patient.apply_async(("s3",), queue=worker.queue)
        time.sleep(0.5)  # parked in the second child, waiting for the push wake-up
        assert {patient.apply_async(("s3",), queue=worker.queue).id for _ in range(5)} == {
            pending.id
        }
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
        time.sleep(0.5)
        killed = time.monotonic()
        os.kill(begun["pid"], signal.SIGKILL)
        assert pending.get(timeout=20) == "s5"
        assert time.monotonic() - killed < 5
        wait_for(lambda: not held(cenv), 3, "keys freed")


class TestThrottleInAWorker:
    def test_one_run_per_window_and_copies_never_overlap(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        throttled = cenv.app_module.throttled
        ids = storm(throttled, "t1", worker.queue, processes=4, calls=10)
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
