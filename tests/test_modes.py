"""Lock modes: ``lock=`` scopes (until_executed, until_executing, while_executing) and
``throttle``, checked at decoration, at dispatch (real Redis, the broker's queue read
directly) and through a real prefork worker with an external execution log."""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import TimeoutError
from redis.crc import key_slot

from celery_singleton_lock import ConfigurationError, DuplicateTaskError, singleton_task
from celery_singleton_lock.lease import LockKeys, companion, memory, slot, split_role
from celery_singleton_lock.tokens import HOLD_HEADER, TOKEN_HEADER

from .conftest import CeleryEnv
from .servers import RedisServer
from .test_celery_lifecycle import assert_no_overlap, lock_keys, runs, started, wait_for
from .workers import Worker

QUEUE = "modes-dispatch"


def name_of(task: Any, *args: Any) -> str:
    return str(task.singleton_options().key.derive(args))


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
            ({"limit": 0}, r"limit must be an int from 1 to 100"),
            ({"limit": 101}, r"limit must be an int from 1 to 100"),
            ({"limit": True}, r"limit must be an int"),
            ({"limit": 3, "on_duplicate": "raise"}, r"limit=3 with on_duplicate: .*never refuses"),
            ({"limit": 3, "throttle": 5}, r"limit=3 with throttle"),
            ({"limit": 3, "lock": "until_executing"}, r"limit=3 with lock='until_executing'"),
            ({"limit": 3, "dedupe": True}, r"limit=3 with dedupe=True"),
            ({"on_duplicate": "replace", "dedupe": False}, r"replace' with lock='while_exec"),
            ({"on_duplicate": "replace", "throttle": 5}, r"replace' with throttle"),
            ({"on_duplicate": "newest"}, r"on_duplicate='newest' is not supported"),
            ({"debounce": 5, "throttle": 5}, r"debounce with throttle"),
            ({"debounce": 5, "lock": "until_executed"}, r"debounce with lock"),
            ({"debounce": 5, "on_duplicate": "raise"}, r"debounce with on_duplicate='raise'"),
            ({"debounce": 5, "limit": 2}, r"limit=2 with debounce"),
            ({"debounce": 5, "max_wait": 2}, r"max_wait=2 is below debounce=5"),
            ({"max_wait": 60}, r"max_wait without debounce"),
            ({"debounce": 0}, r"debounce must be positive"),
        ],
    )
    def test_contradictions_fail_at_decoration(self, options: dict[str, Any], says: str) -> None:
        with pytest.raises(ConfigurationError, match=says):
            define(**options)

    def test_limit(self) -> None:
        opts = define(limit=3).singleton_options()
        assert (opts.limit, opts.lock, opts.dedupe) == (3, "while_executing", False)
        one = define(limit=1, lock="while_executing").singleton_options()
        assert (one.limit, one.lock) == (None, "while_executing")  # plain exclusion

    def test_debounce_is_a_pending_call_whose_arguments_are_replaced(self) -> None:
        opts = define(debounce=timedelta(seconds=5), max_wait=60).singleton_options()
        assert (opts.debounce, opts.max_wait) == (5.0, 60.0)
        assert (opts.lock, opts.on_duplicate, opts.hold_role) == (
            "until_executing",
            "replace",
            "pending",
        )

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
        refresh, store = cenv.app_module.refresh, cenv.app_module.refresh.singleton_context.store
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


def _storm(  # noqa: PLR0917  (a process target's arguments)
    task_name: str, item: str, calls: int, barrier: Any, out: Any, extra: tuple[Any, ...] = ()
) -> None:
    from tests import celery_app

    task = celery_app.app.tasks[task_name]
    barrier.wait(10)
    queue = celery_app.app.conf.task_default_queue
    out.put([task.apply_async((item, *extra), queue=queue).id for _ in range(calls)])


def storm(  # noqa: PLR0917  (a storm's shape)
    task: Any,
    item: str,
    queue: str,
    processes: int = 8,
    calls: int = 20,
    extra: tuple[Any, ...] = (),
) -> set[str]:
    """``processes`` forked producers, ``calls`` dispatches each, released at a barrier."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    task.app.conf.task_default_queue = queue
    procs = [
        ctx.Process(target=_storm, args=(task.name, item, calls, barrier, out, extra))
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


def results_of(results: list[Any], worker: Worker, timeout: float) -> list[Any]:
    """Every result's value; a caller left waiting fails with what the worker said of it."""
    deadline = time.monotonic() + timeout
    values = []
    for result in results:
        try:
            values.append(result.get(timeout=max(0.1, deadline - time.monotonic())))
        except TimeoutError:
            said = [line for line in worker.output().splitlines() if result.id in line]
            pytest.fail(
                f"no result for {result.id} in {timeout}s; the worker said:\n" + "\n".join(said)
            )
    return values


def held(cenv: CeleryEnv) -> list[bytes]:
    """Locks and holds still taken (a wait's signal keys and the record of replaced
    messages are bookkeeping that expires by itself)."""
    bookkeeping = (b":signal", b":waiters", b":replaced")
    return [k for k in lock_keys(cenv) if not k.endswith(bookkeeping)]


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


class TestEager:
    """task_always_eager with memory:// and Redis: the modes run in-process, with a lease."""

    @pytest.fixture(name="app", params=["memory", "redis"])
    def fixture_app(
        self, request: pytest.FixtureRequest, raw: redis.Redis, redis_server: RedisServer
    ) -> Celery:
        url = "memory://" if request.param == "memory" else redis_server.url
        app = Celery(f"modes-eager-{request.param}", set_as_current=False)
        app.conf.update(task_always_eager=True, singleton_lock_url=url, singleton_lock_prefix="me")
        return app

    def test_until_executing_lets_a_call_made_during_the_run_queue(self, app: Celery) -> None:
        inner: list[str] = []

        @singleton_task(app=app, bind=True, name=f"{app.main}.r", key=["k"], lock="until_executing")
        def rebuild(self: Any, k: str, nested: bool = True) -> int:
            if nested:  # a call made while this one runs is a new pending call, not refused
                inner.append(rebuild.apply_async((k,), {"nested": False}, task_id="in").id)
            return self.lease.fence

        assert rebuild.delay("a").get() > 0
        assert inner == ["in"]

    def test_limit_runs_nested_calls_up_to_the_limit_in_slots(self, app: Celery) -> None:
        seen: list[tuple[str, int]] = []

        @singleton_task(app=app, bind=True, name=f"{app.main}.l", key=["k"], limit=2)
        def export(self: Any, k: str, depth: int = 0) -> None:
            seen.append((self.lease.name, self.lease.fence))
            if depth == 0:
                export.delay(k, 1)  # a second execution at once: the second slot

        export.delay("a")
        assert [name for name, _ in seen] == [slot(name_of(export, "a"), n) for n in (1, 2)]
        assert seen[0][1] < seen[1][1]

    def test_throttle_refuses_within_the_window(self, app: Celery) -> None:
        @singleton_task(app=app, name=f"{app.main}.t", key=["k"], throttle=30)
        def sync(k: str) -> str:
            return k

        first = sync.apply_async(("a",), task_id="first")
        assert first.get() == "a"
        assert sync.apply_async(("a",)).id == "first"  # the window outlives the run
        assert sync.apply_async(("b",)).id != "first"


def concurrency(records: list[dict[str, Any]]) -> int:
    """The most executions that ran at once."""
    edges = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.fixture(name="three_workers")
def fixture_three_workers(celery_env: CeleryEnv, worker: Worker) -> Any:
    """The shared worker and two more on its queue: six pool children in all."""
    extra = [Worker(celery_env.env, queue=worker.queue) for _ in range(2)]
    try:
        for each in extra:
            each.start()
        yield [worker, *extra]
    finally:
        for each in extra:
            each.stop()


def messages(queue: redis.Redis, name: str) -> list[dict[str, Any]]:
    """The messages waiting in a Redis-broker queue: (task id, args, headers)."""
    found = []
    for raw_message in queue.lrange(name, 0, -1):
        message = json.loads(raw_message)
        body = json.loads(base64.b64decode(message["body"]))
        found.append({"id": message["headers"]["id"], "args": body[0], **message["headers"]})
    return found


class TestReplaceDispatch:
    def test_later_calls_take_the_queued_calls_place_under_its_id(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        latest = cenv.app_module.latest
        first = latest.apply_async(("r1", "v1"), queue=QUEUE)
        later = [latest.apply_async(("r1", f"v{n}"), queue=QUEUE) for n in range(2, 6)]
        assert {r.id for r in later} == {first.id}
        sent = messages(queue, QUEUE)
        assert [m["id"] for m in sent] == [first.id] * 5
        assert [m["args"][1] for m in sent] == ["v5", "v4", "v3", "v2", "v1"]  # LPUSH order
        hold = cenv.lock_client().get(f"t:{{{name_of(latest, 'r1', 'v1')}}}:pending")
        assert hold.decode() == sent[0][TOKEN_HEADER], "the hold is the newest message's"

    def test_a_running_call_is_never_replaced(self, cenv: CeleryEnv, queue: redis.Redis) -> None:
        latest, store = cenv.app_module.latest_queued, cenv.app_module.latest_queued
        key = name_of(latest, "r2", "v1")
        lock = store.singleton_context.store
        running = lock.try_acquire(key, 10, token="x|h|1|n|the-running-one")
        assert latest.apply_async(("r2", "v2"), queue=QUEUE).id == "the-running-one"
        assert queue.llen(QUEUE) == 0
        lock.release(running)


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


class TestReplaceInAWorker:
    def test_the_pending_run_has_the_latest_arguments(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        latest = cenv.app_module.latest
        first = latest.apply_async(("r3", "v0", 1.5), queue=worker.queue)
        wait_for(lambda: started(cenv), 10, "first run")
        ids = storm(latest, "r3", worker.queue, calls=5, extra=("storm",))
        final = latest.apply_async(("r3", "final"), queue=worker.queue)
        assert ids == {final.id} != {first.id}
        assert final.get(timeout=20) == "final"
        records = of(runs(cenv), "r3")
        assert [(r["id"], r["version"]) for r in records] == [
            (first.id, "v0"),
            (final.id, "final"),
        ], "replaced messages were dropped, not run"
        assert final.state == "SUCCESS"
        time.sleep(0.5)  # the replaced messages, acked meanwhile, must not change the state
        assert latest.AsyncResult(final.id).result == "final"
        wait_for(lambda: not held(cenv), 3, "keys freed")

    def test_a_queued_call_takes_the_latest_arguments(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        latest = cenv.app_module.latest_queued
        first = latest.apply_async(("r4", "v1"), queue=worker.queue, countdown=1.0)
        second = latest.apply_async(("r4", "v2"), queue=worker.queue, countdown=1.0)
        assert second.id == first.id
        assert first.get(timeout=20) == "v2"
        assert [r["version"] for r in of(runs(cenv), "r4")] == ["v2"]
        wait_for(lambda: not held(cenv), 3, "keys freed")


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
        long = [export.apply_async(("l3", 4.0), queue=queue) for _ in range(3)]
        begun = wait_for(lambda: len(started(cenv)) == 3 and started(cenv), 20, "three runs")
        waiting = [export.apply_async(("l3", 0.2), queue=queue) for _ in range(2)]
        time.sleep(1.0)
        assert len(started(cenv)) == 3, "the fourth waits for a slot"
        killed = time.monotonic()
        os.kill(begun[0]["pid"], signal.SIGKILL)
        # The other runs last ~2.5 s more: only the dead child's slot can serve a waiter now.
        wait_for(lambda: any(r.ready() for r in waiting), 1.5, "the dead child's slot to a waiter")
        assert time.monotonic() - killed < 1.5
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


class FakeClock:
    """Stands in for the ``time`` module of the in-memory store: time moves when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return int(self.now * 1e9)


class TestThrottleWithAFakeClock:
    def test_one_accepted_call_per_window_from_acceptance(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        clock = FakeClock()
        monkeypatch.setattr(memory, "time", clock)
        app = Celery("modes-clock", set_as_current=False)
        app.conf.update(task_always_eager=True, singleton_lock_url="memory://")

        @singleton_task(app=app, name="modes.clock.sync", key=["k"], throttle=60)
        def sync(k: str) -> str:
            return k

        first = sync.apply_async(("a",), task_id="first")
        clock.now += 59.9
        assert sync.apply_async(("a",)).id == "first"
        clock.now += 0.2  # 60.1 s after acceptance: a new window
        second = sync.apply_async(("a",), task_id="second")
        assert second.id == "second"
        clock.now += 30
        assert sync.apply_async(("a",)).id == "second"
        assert first.get() == second.get() == "a"


class TestWorkerDeathInEveryMode:
    def test_a_killed_worker_frees_the_key_the_pending_hold_and_its_slots_within_ttl(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        ttl = 2.0
        doomed = Worker(cenv.env, extra_env={"CSL_TTL": str(ttl)}).start()
        m = cenv.app_module
        try:
            m.refresh.apply_async(("k1", 60), queue=doomed.queue)  # running
            m.export.apply_async(("k2", 60), queue=doomed.queue)  # running in a slot
            wait_for(lambda: len(started(cenv)) == 2, 10, "both run")
            m.refresh.apply_async(("k1",), queue=doomed.queue)  # pending, prefetched
            pending = f"t:{{{name_of(m.refresh, 'k1')}}}:pending"
            wait_for(lambda: (cenv.lock_client().get(pending) or b"").startswith(b"r|"), 10)
            time.sleep(ttl * 1.5)  # renewed past its ttl while the worker lives
            assert len(held(cenv)) == 3  # the key, the pending hold and a slot
            doomed.kill()
            killed_at = time.monotonic()
            wait_for(lambda: not held(cenv), ttl + 1.0, "everything free within ttl")
            print(f"\nmodes, whole worker SIGKILL: free {time.monotonic() - killed_at:.2f}s later")
        finally:
            doomed.stop()
        again = m.refresh.apply_async(("k1",), queue=worker.queue)
        assert again.get(timeout=20) == "k1"


# Each mode's test task, and its arguments for a call of ``item`` lasting ``seconds``.
MODES: dict[str, Callable[[str, float], tuple[Any, ...]]] = {
    "refresh": lambda item, seconds: (item, seconds),  # until_executing
    "latest": lambda item, seconds: (item, "v", seconds),  # until_executing + replace
    "throttled": lambda item, seconds: (item, seconds),  # throttle
    "debounced": lambda item, seconds: (item, "v", seconds),  # debounce
    "export": lambda item, seconds: (item, seconds),  # limit=3
}


class TestEveryModeInAWorker:
    @pytest.mark.parametrize("mode", list(MODES))
    def test_send_task_copies_never_overlap_and_all_run(
        self, cenv: CeleryEnv, worker: Worker, mode: str
    ) -> None:
        task = getattr(cenv.app_module, mode)
        copies = [
            task.app.send_task(task.name, MODES[mode]("c1", 0.3), queue=worker.queue)
            for _ in range(4)
        ]
        for copy in copies:
            copy.get(timeout=30)
        records = of(runs(cenv), "c1")
        assert len(records) == 4, "copies that bypass dispatch are never refused or merged"
        # Two pool children: limit=3 lets both run at once, every other mode one.
        assert concurrency(records) == (2 if mode == "export" else 1)
        wait_for(lambda: all(k.endswith(b":throttle") for k in held(cenv)), 3, "freed")

    @pytest.mark.parametrize("mode", ["refresh", "latest", "throttled", "debounced"])
    def test_a_killed_child_frees_the_key_within_a_second(
        self, cenv: CeleryEnv, worker: Worker, mode: str
    ) -> None:
        task = getattr(cenv.app_module, mode)
        first = task.apply_async(MODES[mode]("c2", 60.0), queue=worker.queue)
        [begun] = wait_for(lambda: started(cenv), 10, "run")
        key = f"t:{{{name_of(task, *MODES[mode]('c2', 60.0))}}}".encode()
        assert key in held(cenv)
        os.kill(begun["pid"], signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: key not in held(cenv), 1.0, "the running key freed")
        print(f"\n{mode}: child SIGKILL, key free {time.monotonic() - killed:.2f}s later")
        copy = task.app.send_task(task.name, MODES[mode]("c2", 0.0), queue=worker.queue)
        assert copy.get(timeout=20) is not None
        assert copy.id != first.id

    @pytest.mark.parametrize("mode", ["refresh", "latest"])
    def test_revoking_the_pending_call_frees_its_place(
        self, cenv: CeleryEnv, worker: Worker, mode: str
    ) -> None:
        task = getattr(cenv.app_module, mode)
        pending = task.apply_async(MODES[mode]("c3", 0.0), queue=worker.queue, countdown=30)
        hold = f"t:{{{name_of(task, *MODES[mode]('c3', 0.0))}}}:pending".encode()
        wait_for(lambda: (cenv.lock_client().get(hold) or b"").startswith(b"r|"), 10, "reserved")
        pending.revoke()
        wait_for(lambda: hold not in held(cenv), 3, "the pending hold given back")
        again = task.apply_async(MODES[mode]("c3", 0.0), queue=worker.queue)
        assert again.id != pending.id
        assert again.get(timeout=20) is not None
