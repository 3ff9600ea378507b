"""Lock modes: ``lock=`` scopes (until_executed, until_executing, while_executing) and
``throttle``, checked at decoration, at dispatch (real Redis, the broker's queue read
directly) and through a real prefork worker with an external execution log."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from redis.crc import key_slot

from celery_singleton_lock import (
    ConfigurationError,
    DuplicateTaskError,
    RateLimit,
    singleton_task,
)
from celery_singleton_lock.lease import LockKeys, Rate, companion, slot, split_role
from celery_singleton_lock.tokens import HOLD_HEADER, TOKEN_HEADER

from ..conftest import CeleryEnv, separate_lock_server
from ..support.modes import (
    QUEUE,
    concurrency,
    define,
    held,
    name_of,
    of,
    reads,
)
from ..support.runs import runs, started, wait_for
from ..support.servers import RedisServer
from ..support.workers import Worker


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
            (
                {"lock": "while_executing", "on_duplicate": "raise"},
                r"on_duplicate='raise' with lock='while_executing': .* checks nothing at dispatch",
            ),
            ({"dedupe": False, "on_duplicate": "return"}, r"'return' with dedupe=False"),
            ({"on_duplicate": "newest"}, r"on_duplicate='newest' is not supported"),
            ({"debounce": 5, "throttle": 5}, r"debounce with throttle"),
            ({"debounce": 5, "lock": "until_executed"}, r"debounce with lock"),
            ({"debounce": 5, "on_duplicate": "raise"}, r"debounce with on_duplicate='raise'"),
            ({"debounce": 5, "limit": 2}, r"limit=2 with debounce"),
            ({"debounce": 5, "max_wait": 2}, r"max_wait=2 is below debounce=5"),
            ({"max_wait": 60}, r"max_wait without debounce"),
            ({"debounce": 0}, r"debounce must be positive"),
            ({"rate": "ten/s"}, r"rate='ten/s': write calls per period the way Celery"),
            ({"rate": "0/s"}, r"the number of calls must be positive"),
            ({"rate": "5/s", "burst": 0}, r"burst=0 must be a whole number of calls >= 1"),
            ({"rate": "5/s", "throttle": 5}, r"rate with throttle: a rate never refuses"),
            ({"rate": "5/s", "lock": "until_executed"}, r"rate with lock='until_executed'"),
            ({"rate": "5/s", "on_duplicate": "raise"}, r"rate with on_duplicate"),
            ({"rate": "5/s", "debounce": 5}, r"rate with debounce"),
            ({"rate": "5/s", "on_limited": "drop"}, r"on_limited='drop': choose 'defer'"),
            ({"burst": 3}, r"burst without rate"),
            ({"on_limited": "raise"}, r"on_limited without rate"),
            ({"rate": lambda item: "1/s", "burst": -1}, r"burst=-1"),
            ({"cost": 3}, r"cost without rate"),
            ({"rate": "5/s", "cost": 2}, r"cost=2 is more than the burst of 5/s: .* burst=2"),
            ({"rate": "5/s", "cost": "two"}, r"cost='two': give the units"),
            ({"rate": []}, r"give at least one rate"),
            ({"rate": ["5/s", "ten/m"]}, r"rate='ten/m': write calls per period"),
        ],
    )
    def test_contradictions_fail_at_decoration(self, options: dict[str, Any], says: str) -> None:
        with pytest.raises(ConfigurationError, match=says):
            define(**options)

    @pytest.mark.parametrize("what", ["not a function", None, type("Plain", (), {}), 3])
    def test_the_decorator_takes_a_function_and_says_so(self, what: Any) -> None:
        with pytest.raises(ConfigurationError, match="singleton_task decorates a function"):
            singleton_task(key=["item"])(what)

    def test_rate(self) -> None:
        opts = define(rate="100/5m", burst=3).singleton_options()
        assert opts.lock == "while_executing"
        assert opts.rate is not None
        assert opts.rate.limits == (RateLimit(Rate(100, 300.0, burst=3)),)
        assert repr(opts.mode) == "<mode rate over while_executing>"
        several = define(rate=["60/m", RateLimit("10000/d", burst=50, cost=2)], burst=5)
        limits = several.singleton_options().rate
        assert limits is not None
        assert [(str(lim.rate), lim.cost) for lim in limits.limits or ()] == [
            ("60/m (burst 5)", None),
            ("10000/d (burst 50)", 2.0),
        ]
        paired = define(rate=(10, timedelta(seconds=1)), limit=2).singleton_options()
        assert repr(paired.mode) == "<mode rate over limit>"

    def test_limit(self) -> None:
        opts = define(limit=3).singleton_options()
        assert (opts.limit, opts.lock, opts.dedupe) == (3, "while_executing", False)
        one = define(limit=1, lock="while_executing").singleton_options()
        assert (one.limit, one.lock) == (None, "while_executing")  # plain exclusion

    def test_debounce_is_a_pending_call_whose_arguments_are_replaced(self) -> None:
        opts = define(debounce=timedelta(seconds=5), max_wait=60).singleton_options()
        assert (opts.debounce, opts.max_wait) == (5.0, 60.0)
        assert (opts.lock, opts.on_duplicate, opts.mode.hold_role) == (
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


class TestDispatch:
    @separate_lock_server
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

    @separate_lock_server
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
