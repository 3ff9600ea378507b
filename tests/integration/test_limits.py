"""Limits changed at run time (``limits.set``, ``celery singleton limits``): a pause that
stops new starts and a resume that lets them go in order, a raised rate, a lowered
limit, against a real worker; the commands, their history entries and their errors;
and the same eagerly on both stores."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import (
    BackpressureError,
    ConfigurationError,
    RateLimit,
    RateLimitedError,
    signals,
    singleton_task,
)
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.contrib import limits
from celery_singleton_lock.lease import slot
from celery_singleton_lock.lease.limits.backlog import backlog_of
from celery_singleton_lock.lease.limits.overrides import REFRESH, Override, overrides_of
from celery_singleton_lock.lease.limits.rates import rates_of

from ..conftest import CeleryEnv
from ..support.apps import eager_app
from ..support.cli import cli
from ..support.modes import concurrency, define, of, results_of
from ..support.rates import all_delivered, check_rate, closest_slots, rated_runs
from ..support.runs import assert_no_overlap, runs, started, wait_for, waiting_for_a_wake_up
from ..support.servers import RedisServer
from ..support.workers import Worker

PAIR = "tests.support.celery_app.rated_pair"


def clear(app: Celery) -> None:
    overrides = overrides_of(LockStores.for_app(app).lock)
    for target in overrides.all():
        overrides.save(Override(target))


@pytest.fixture(name="app")
def fixture_app(cenv: CeleryEnv) -> Iterator[Any]:
    """The test app's module, with no override left behind for the shared worker."""
    yield cenv.app_module
    clear(cenv.app_module.app)


def schedule_end(store: Any, name: str) -> float:
    """Where ``name``'s rate schedule ends: its first limit's next slot (``rate.lua``)."""
    raw = store.client.get(rates_of(store).key(name))
    assert raw is not None, f"no schedule for {name!r}"
    text = raw.decode() if isinstance(raw, bytes) else raw
    return int(text.split("|")[0].split(";")[0].split(",")[0]) / 1e6


def server_time(store: Any) -> float:
    seconds, micros = store.client.time()
    return float(seconds) + micros / 1e6


def item_runs(cenv: CeleryEnv, item: str) -> list[dict[str, Any]]:
    return sorted((r for r in rated_runs(cenv) if r["item"] == item), key=lambda r: r["start"])


ONE_TOTAL = "tests.support.celery_app.export_one_total"


def held_by(cenv: CeleryEnv, tenants: list[str]) -> list[str]:
    """The slots of ``tenants`` and of ``export_one_total``'s total still held."""
    store = LockStores.for_app(cenv.app_module.app).lock
    task = cenv.app_module.export_one_total
    names = [slot(task.singleton_options().key.derive((t,), {}), 1) for t in tenants]
    names += [slot(f"{ONE_TOTAL}#total", n) for n in range(1, 4)]
    return [name for name in names if store.holder(name) is not None]


class TestInAWorker:
    @pytest.mark.parametrize(
        ("pool", "children"),
        [("prefork", 1), pytest.param("gevent", 4, marks=pytest.mark.oneoff)],  # (CI's one-offs)
    )
    def test_a_pause_stops_new_starts_within_a_second_and_a_resume_lets_them_go_in_order(
        self, cenv: CeleryEnv, app: Any, pool: str, children: int
    ) -> None:
        # One run of the key at a time on prefork: none contends with another and
        # requeues (which would put it behind the calls after it before the pause came).
        # On gevent one child fetches a message a cycle (prefetch 1): several children.
        worker = Worker(cenv.env, concurrency=children, pool=pool).start()
        try:
            self._pause_and_resume(cenv, app, worker)
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()

    def _pause_and_resume(self, cenv: CeleryEnv, app: Any, worker: Worker) -> None:
        # A free tenant's plan: 5 a second. The calls take their places in line (rate
        # slots) as the worker first sees them; a deferred message that comes back later
        # than its slot's grace (a busy worker: it is queued behind the other calls)
        # starts then, or on the next free slot, and its slot says which: the line is
        # the slots' order.
        item = f"free-pause-{uuid.uuid4().hex[:8]}"
        name = app.planned.singleton_options().key.derive((item,), {})
        calls = [app.planned.apply_async((item, n), queue=worker.queue) for n in range(20)]

        def in_line() -> bool:  # every call run, or deferred to a slot of its own
            out, ran = worker.output(), {r["id"] for r in item_runs(cenv, item)}
            return all(c.id in ran or f"[{c.id}] deferred" in out for c in calls)

        # Before the pause every call is in the rate's line (a call first seen while
        # paused has no slot: it takes one after the resume, maybe after later calls).
        wait_for(lambda: len(item_runs(cenv, item)) >= 5 and in_line(), 20, "the calls in line")
        limits.set(app.app, name, paused=True)
        paused_at = time.time()
        # Held back, not dropped: none starts while paused (a second is the promise).
        # The pause outlasts the rate's schedule as it stood (its key would expire):
        # the runs held back keep it for the resume to move on.
        store = LockStores.for_app(app.app).lock
        wait_for(lambda: time.time() > paused_at + 1.0, 5, "the pause in force")
        end = schedule_end(store, name)
        wait_for(lambda: server_time(store) > end + 0.5, 10, "the schedule passed")
        held = item_runs(cenv, item)
        assert max(r["start"] for r in held) <= paused_at + 1.0
        assert len(held) < 20, "the pause came too late to hold anything back"
        limits.set(app.app, name, paused=False)
        began, ended = overrides_of(store).all()[name].pause or (0.0, 0.0)
        moved_end = end + (ended - began if end > began else 0.0)
        # Calls made after the resume queue behind the ones held back.
        calls += [app.planned.apply_async((item, n), queue=worker.queue) for n in range(20, 23)]
        assert sorted(c.get(timeout=30) for c in calls) == list(range(23)), "none lost"
        done = item_runs(cenv, item)
        assert len(done) == 23, "none twice"
        held_back = [r for r in done if r["start"] > paused_at + 1.0 and r["n"] < 20]
        order = [r["n"] for r in held_back]  # by start
        line = [r["n"] for r in sorted(held_back, key=lambda r: r["slot"])]
        assert order == line, f"let go in the order they came: {order}, in line {line}"
        # The calls made after the resume take the slots after the moved schedule: they
        # pass none of the runs held back that kept their place (among themselves, as their
        # workers took them). A run already late for its slot when the pause began (its
        # slot passed by the runs after it: a loaded worker) takes the next free slot as it
        # is let go (docs/operations.md), which may be after theirs: seen in loaded CI runs.
        later = [r for r in done if r["n"] >= 20]
        first_later = min(r["slot"] for r in later)
        assert first_later >= moved_end - 1e-3, "the calls after the resume go after the line"
        moved_on = [r["n"] for r in held_back if r["slot"] >= first_later]
        assert len(moved_on) <= 2, f"calls after the resume passed held-back runs {moved_on}"
        check_rate(done, 5, 1.0)  # the rate holds across the pause

    def test_a_wait_after_the_resume_longer_than_the_visibility_timeout_goes_in_hops(
        self, cenv: CeleryEnv, app: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A call made 4 s into a pause waits as long after the resume (its place in
        # line), unacked in its worker: the broker (visibility_timeout 3 s) would hand
        # it out again, and it would run twice. It is held back in hops of 1.5 s instead.
        visibility = 3.0
        conf = app.app.conf
        options = {**(conf.broker_transport_options or {}), "visibility_timeout": visibility}
        monkeypatch.setitem(conf, "broker_transport_options", options)
        worker = Worker(cenv.env, extra_env={"CSL_VISIBILITY_TIMEOUT": str(visibility)}).start()
        item = f"hops-{uuid.uuid4().hex[:8]}"
        name = app.rated_slowly.singleton_options().key.derive((item,), {})
        try:
            limits.set(app.app, name, paused=True)
            paused_at = time.time()
            first = app.rated_slowly.apply_async((item, 0), queue=worker.queue)
            wait_for(lambda: f"[{first.id}] held back" in worker.output(), 10, "held back")
            wait_for(lambda: time.time() > paused_at + 4.0, 10, "4 s of the pause")
            second = app.rated_slowly.apply_async((item, 1), queue=worker.queue)
            wait_for(lambda: f"[{second.id}] held back" in worker.output(), 10, "held back")
            limits.set(app.app, name, paused=False)
            resumed_at = time.time()
            assert [c.get(timeout=30) for c in (first, second)] == [0, 1]
            ids = {first.id, second.id}
            wait_for(lambda: all_delivered(cenv, worker, ids), 15, "every delivery done")
            log = worker.output()
        finally:
            worker.stop()
        done = item_runs(cenv, item)
        assert [r["n"] for r in done] == [0, 1], f"each ran once:\n{log[-4000:]}"
        assert done[1]["start"] >= resumed_at + 3.5, "it kept its place: as late after the resume"
        assert "the broker's unacked timeout" in log, log[-4000:]

    def test_a_raised_rate_takes_effect_at_the_next_decisions(
        self, cenv: CeleryEnv, app: Any, worker: Worker
    ) -> None:
        item = f"raise-{uuid.uuid4().hex[:8]}"
        before = [app.rated_pair.apply_async((item, n), queue=worker.queue) for n in range(6)]
        for call in before:
            call.get(timeout=20)
        assert closest_slots(item_runs(cenv, item)) == pytest.approx(0.1, abs=0.003)
        limits.set(app.app, PAIR, rate="50/s")
        time.sleep(REFRESH + 0.1)  # the promise: every process decides with it by then
        after = [app.rated_pair.apply_async((item, n), queue=worker.queue) for n in range(6, 14)]
        for call in after:
            call.get(timeout=20)
        later = [r for r in item_runs(cenv, item) if r["n"] >= 6]
        assert closest_slots(later) == pytest.approx(0.02, abs=0.003)
        check_rate(later, 50, 1.0)

    def test_a_lowered_limit_holds_for_the_next_starts(
        self, cenv: CeleryEnv, app: Any, worker: Worker
    ) -> None:
        limits.set(app.app, "tests.support.celery_app.export", limit=1)
        time.sleep(REFRESH + 0.1)
        item = f"one-{uuid.uuid4().hex[:8]}"
        calls = [app.export.apply_async((item, 0.3), queue=worker.queue) for _ in range(4)]
        for call in calls:
            call.get(timeout=30)
        done = of(runs(cenv), item)
        assert len(done) == 4
        assert concurrency(done) == 1, "limit=3 in the code, 1 by the operator"


class TestCommands:
    def test_set_list_history_and_reset(self, cenv: CeleryEnv, app: Any) -> None:
        done = cli(cenv, "limits", "set", PAIR, "--rate", "5/s", "--rate", "100/m", "--limit", "1")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{PAIR}: rate 5/s, 100/m; limit 1"
        paused = cli(cenv, "limits", "set", PAIR, "--pause")
        assert paused.stdout.strip() == f"{PAIR}: rate 5/s, 100/m; limit 1; paused"
        listed = json.loads(cli(cenv, "limits", "list", "--json").stdout)
        row = next(r for r in listed if r["target"] == PAIR)
        assert row["code"] == "rate 10/s; limit 2"
        assert row["override"] == "rate 5/s, 100/m; limit 1; paused"
        assert "@" in row["changed_by"]
        table = cli(cenv, "limits", "list").stdout
        assert "rate 10/s; limit 2" in table
        assert "rate 5/s, 100/m; limit 1; paused" in table
        # Each change is in the target's history (the app keeps one: singleton_lock_history).
        entries = json.loads(cli(cenv, "history", PAIR, "--json").stdout)
        assert [e["event"] for e in entries[:2]] == ["limits pause", "limits rate limit"]
        reset = cli(cenv, "limits", "set", PAIR, "--reset")
        assert reset.stdout.strip() == f"{PAIR}: the code's limits"
        listed = json.loads(cli(cenv, "limits", "list", "--json").stdout)
        assert next(r for r in listed if r["target"] == PAIR)["override"] == ""

    @pytest.mark.parametrize(
        ("args", "says"),
        [
            (("nosuch.task", "--pause"), "no task with a rate or a limit has keys named like"),
            (("tests.support.celery_app.rated", "--limit", "3"), "has no limit= in its code"),
            (("tests.support.celery_app.export", "--rate", "5/s"), "has no rate= in its code"),
            ((PAIR,), "nothing to change"),
            ((PAIR, "--rate", "five a second"), "write calls per period"),
        ],
    )
    def test_what_cannot_be_set_says_what_to_write(
        self, cenv: CeleryEnv, app: Any, args: tuple[str, ...], says: str
    ) -> None:
        done = cli(cenv, "limits", "set", *args)
        assert done.returncode == 1
        assert says in done.stderr
        assert "Traceback" not in done.stderr


class TestEagerly:
    @pytest.fixture(name="eager", params=["memory", "redis"])
    def fixture_eager(
        self, request: pytest.FixtureRequest, raw: redis.Redis, redis_server: RedisServer
    ) -> Celery:
        url = "memory://" if request.param == "memory" else redis_server.url
        return eager_app(url, f"limits-{request.param}-{uuid.uuid4().hex[:6]}")

    def test_a_limit_above_one_is_refused_where_calls_take_idempotency_keys(
        self, eager: Celery
    ) -> None:
        # limit=1 under a total takes idempotency keys (one run of a key at a time): an
        # override may not let a copy of a call run beside it.
        @singleton_task(
            app=eager, shared=False, name=f"{eager.main}.keyed", key="tenant:{tenant}",
            limit=1, total_limit=3, idempotency=True,
        )  # fmt: skip
        def keyed(tenant: str) -> str:
            return tenant

        with pytest.raises(ConfigurationError, match="a limit of 3 would run a copy beside"):
            limits.set(eager, keyed.name, limit=3)
        assert limits.set(eager, keyed.name, limit=1) is not None

    def test_pause_resume_rate_and_reset_by_template(self, eager: Celery) -> None:
        heard: list[dict[str, Any]] = []

        def hear(**fields: Any) -> None:
            heard.append(fields)

        @singleton_task(
            app=eager, shared=False, name=f"{eager.main}.sync", key="tenant:{tenant}", rate="2/s"
        )
        def sync(tenant: str) -> str:
            return tenant

        signals.limits_changed.connect(hear)
        try:
            limits.set(eager, "tenant:{tenant}", paused=True)
            with pytest.raises(RateLimitedError, match="'tenant:acme' is paused"):
                sync.delay("acme").get()
            # A key's own override wins over its template's.
            limits.set(eager, "tenant:beta", paused=False, rate="100/s")
            assert [sync.delay("beta").get() for _ in range(3)] == ["beta"] * 3
            limits.set(eager, "tenant:{tenant}", reset=True)
            began = time.monotonic()
            assert [sync.delay("acme").get() for _ in range(2)] == ["acme"] * 2
            assert time.monotonic() - began >= 0.5 - 0.01  # the code's 2/s again
        finally:
            signals.limits_changed.disconnect(hear)
        assert [(h["name"], h["change"]) for h in heard] == [
            ("tenant:{tenant}", "pause"),
            ("tenant:beta", "rate resume"),
            ("tenant:{tenant}", "reset"),
        ]
        rows = {row.target: row for row in limits.rows(eager)}
        assert rows[f"{eager.main}.sync"].code == "rate 2/s"
        assert rows["tenant:beta"].override == "rate 100/s; resumed"
        assert "tenant:{tenant}" not in rows  # reset: nothing left to show

    def test_a_rate_override_keeps_the_code_s_burst_and_checks_its_cost(
        self, eager: Celery
    ) -> None:
        @singleton_task(
            app=eager,
            shared=False,
            name=f"{eager.main}.llm",
            key=["n"],
            rate=["10/s", RateLimit("100/m", burst=5, cost=3)],
        )
        def llm(n: int) -> int:
            return n

        target = f"{eager.main}.llm"
        kept = limits.set(eager, target, rate=["20/s", "200/m"])
        assert kept is not None
        assert kept.rates is not None
        assert [rate.burst for rate in kept.rates] == [1, 5]  # the code's, in their places
        assert llm.delay(1).get() == 1
        with pytest.raises(ConfigurationError, match=r"charges a call 3 units.*--burst 3"):
            limits.set(eager, target, rate=["20/s", "200/m"], burst=2)

    def test_an_override_over_a_limit_is_refused(self, eager: Celery) -> None:
        @singleton_task(app=eager, shared=False, name=f"{eager.main}.export", key=["n"], limit=2)
        def export(n: int) -> int:
            return n

        with pytest.raises(ConfigurationError, match="limit=500 must be from 1 to 100"):
            limits.set(eager, f"{eager.main}.export", limit=500)


class TestBackpressure:
    def test_ten_producers_never_have_more_than_max_pending_waiting(
        self, cenv: CeleryEnv, app: Any, worker: Worker
    ) -> None:
        item = f"cap-{uuid.uuid4().hex[:8]}"
        name = app.capped.singleton_options().key.derive((item,), {})
        backlog = cenv.lock_client()
        key = LockStores.for_app(app.app).lock.keys(name).backlog
        accepted: list[Any] = []
        refused: list[BackpressureError] = []
        guard = threading.Lock()
        counter = itertools.count()
        stop = time.monotonic() + 2.0

        def produce() -> None:
            while time.monotonic() < stop:
                try:
                    result = app.capped.apply_async((item, next(counter)), queue=worker.queue)
                except BackpressureError as error:
                    with guard:
                        refused.append(error)
                    time.sleep(error.retry_after)
                else:
                    with guard:
                        accepted.append(result)

        producers = [threading.Thread(target=produce) for _ in range(10)]
        for thread in producers:
            thread.start()
        most = 0
        while any(thread.is_alive() for thread in producers):
            most = max(most, int(backlog.zcard(key)))
        for thread in producers:
            thread.join(10)
        assert most <= 5, f"{most} calls waiting at once"
        assert refused, "10 producers at 20/s were never refused"
        assert all(0 < error.retry_after <= 0.05 + 1e-6 for error in refused)
        assert refused[0].cap == 5
        # Every accepted call ran, once; the refused ones were never sent.
        ran = sorted(result.get(timeout=30) for result in accepted)
        done = item_runs(cenv, item)
        assert sorted(r["n"] for r in done) == ran
        check_rate(done, 20, 1.0)
        wait_for(lambda: backlog.zcard(key) == 0, 10, "every place freed")
        print(f"\n10 producers: {len(accepted)} accepted, {len(refused)} refused, {most} waiting")

    def test_a_call_its_rate_refuses_gives_its_place_back(self, cenv: CeleryEnv, app: Any) -> None:
        parked, item = f"parked-{uuid.uuid4().hex[:8]}", f"refused-{uuid.uuid4().hex[:8]}"
        app.capped_checked.apply_async((item, 0), queue=parked)
        for n in range(1, 4):
            with pytest.raises(RateLimitedError):
                app.capped_checked.apply_async((item, n), queue=parked)
        name = app.capped_checked.singleton_options().key.derive((item,), {})
        store = LockStores.for_app(app.app).lock
        assert backlog_of(store).waiting(name) == 1, "only the call sent waits"
        cenv.broker.client().delete(parked)

    def test_a_shorter_place_taken_later_never_shortens_a_longer_one(
        self, cenv: CeleryEnv, app: Any
    ) -> None:
        # A place renewed for its slot's wait (70 s), then another call's of 1 s: the set
        # of places lives as long as its last place, not as the last call asked.
        store = LockStores.for_app(app.app).lock
        backlog, name = backlog_of(store), f"places-{uuid.uuid4().hex[:8]}"
        assert backlog.enter(name, "waits-for-its-slot", 3, 10).taken
        backlog.renew(name, "waits-for-its-slot", 70)
        assert backlog.enter(name, "soon", 3, 1).taken
        key = store.keys(name).backlog
        assert int(cenv.lock_client().pttl(key)) > 60_000
        backlog.leave(name, "waits-for-its-slot")
        backlog.leave(name, "soon")

    def test_the_places_of_many_waiting_calls_are_renewed_together(
        self, cenv: CeleryEnv, app: Any
    ) -> None:
        # (the waiting rooms' sweep renews every kept call's place: more than one batch)
        store = LockStores.for_app(app.app).lock
        backlog, tag = backlog_of(store), uuid.uuid4().hex[:8]
        places = [(f"renewed-{tag}-{n % 3}", f"call-{n}") for n in range(backlog.BATCH + 7)]
        for name, call in places:
            assert backlog.enter(name, call, len(places), 5).taken
        backlog.renew_all(places, 120)
        client = cenv.lock_client()
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        for name, call in places:
            expires = client.zscore(store.keys(name).backlog, call)
            assert expires is not None
            assert expires - now_ms > 100_000, (name, call)
        for name in {name for name, _ in places}:
            assert int(client.pttl(store.keys(name).backlog)) > 100_000
            client.delete(store.keys(name).backlog)

    def test_a_refused_call_sends_nothing_and_max_pending_needs_a_queue_to_cap(
        self, cenv: CeleryEnv, app: Any
    ) -> None:
        parked = f"parked-{uuid.uuid4().hex[:8]}"
        item = f"parked-{uuid.uuid4().hex[:8]}"
        first = [app.capped.apply_async((item, n), queue=parked) for n in range(5)]
        with pytest.raises(BackpressureError, match="5 calls waiting, as many as max_pending=5"):
            app.capped.apply_async((item, 5), queue=parked)
        broker = cenv.broker.client()
        assert broker.llen(parked) == 5
        broker.delete(parked)
        assert len({r.id for r in first}) == 5
        with pytest.raises(ConfigurationError, match="max_pending=3 with lock='until_executed'"):
            singleton_task(app=app.app, shared=False, name="capless", max_pending=3)(lambda: None)


class TestTotalLimit:
    def test_fifty_keys_never_run_more_than_the_total_at_once(self, cenv: CeleryEnv) -> None:
        app = cenv.app_module
        worker = Worker(cenv.env, concurrency=8).start()
        tag = uuid.uuid4().hex[:6]
        try:
            calls = [
                app.export_total.apply_async((f"total-{tag}-{n}", 0.3), queue=worker.queue)
                for n in range(50)
            ]
            for call in calls:
                call.get(timeout=60)
        finally:
            worker.stop()
        done = [r for r in runs(cenv) if str(r["item"]).startswith(f"total-{tag}-")]
        assert len(done) == 50, "every key ran, once"
        most = concurrency(done)
        print(f"\n50 keys, limit=2, total_limit=3, 8 children: at most {most} at once")
        assert most <= 3
        assert most == 3, "the total is used, not just kept"
        # Every slot of the total was given back.
        store = LockStores.for_app(app.app).lock
        total = "tests.support.celery_app.export_total#total"
        assert all(store.holder(slot(total, n)) is None for n in range(1, 4))

    @pytest.mark.parametrize(
        ("pool", "children", "task"),
        [
            ("prefork", 8, "export_total"),
            ("gevent", 8, "export_total"),
            ("prefork", 8, "export_one_total"),  # limit=1: one run per key
        ],
    )
    def test_runs_waiting_for_the_total_start_in_the_order_they_came(
        self, cenv: CeleryEnv, pool: str, children: int, task: str
    ) -> None:
        tag = uuid.uuid4().hex[:6]
        limited = getattr(cenv.app_module, task)
        worker = Worker(cenv.env, concurrency=children, pool=pool).start()

        def waiting() -> int:  # the runs blocked on a wake-up of the total (BLPOP)
            return waiting_for_a_wake_up(cenv)

        def of_this_test(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [r for r in records if f"-{tag}-" in str(r["item"])]

        def first_start(items: list[str]) -> str | None:
            found = [r["item"] for r in started(cenv) if r["item"] in items]
            return found[0] if found else None

        try:
            # Three runs of three keys fill the total, each until its own go-key is set.
            for n in range(3):
                limited.apply_async(
                    (f"long-{tag}-{n}", 0.0, f"go-long-{tag}-{n}"), queue=worker.queue
                )
            wait_for(lambda: len(of_this_test(started(cenv))) == 3, 30, "the total full")
            # Four more keys, one after the other: each waits for a slot of the total.
            waiters = [f"late-{tag}-{n}" for n in range(4)]
            for n, item in enumerate(waiters):
                limited.apply_async((item, 0.0, f"go-{item}"), queue=worker.queue)
                wait_for(lambda n=n: waiting() == n + 1, 30, f"{n + 1} runs waiting")
            # Each slot given back goes to the run that has waited longest.
            checker = cenv.checker_client()
            order: list[str] = []
            left = list(waiters)
            for freed in [f"long-{tag}-0", f"long-{tag}-1", f"long-{tag}-2", waiters[0]]:
                checker.set(f"go-{freed}", 1)
                order.append(wait_for(lambda: first_start(left), 30, "the next start"))
                left.remove(order[-1])
            assert order == waiters, f"started {order}, called {waiters}"
            for item in waiters[1:]:
                checker.set(f"go-{item}", 1)
            wait_for(lambda: len(of_this_test(runs(cenv))) == 7, 30, "all seven done")
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()

    def test_a_killed_child_gives_its_slot_of_the_total_back_within_a_second(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        app.export_total.apply_async((f"killed-{tag}", 30.0), queue=worker.queue)
        [first] = wait_for(
            lambda: [r for r in started(cenv) if r["item"] == f"killed-{tag}"], what="start"
        )
        store = LockStores.for_app(app.app).lock
        total = "tests.support.celery_app.export_total#total"
        held = [slot(total, n) for n in range(1, 4) if store.holder(slot(total, n))]
        assert len(held) == 1, "the run holds one slot of the total"
        os.kill(first["pid"], signal.SIGKILL)
        wait_for(lambda: store.holder(held[0]) is None, 1.0, "the total's slot within 1 s")

    def test_total_limit_needs_a_limit(self, cenv: CeleryEnv) -> None:
        with pytest.raises(ConfigurationError, match=r"without limit: .*\(limit=1 for"):
            singleton_task(app=cenv.app_module.app, shared=False, name="t", total_limit=3)(
                lambda: None
            )


class TestTotalLimitWithOneRunPerKey:
    """``limit=1, total_limit=3`` (``export_one_total``): one run per tenant, three in all,
    with ``limit=N``'s guarantees."""

    def test_limit_one_takes_a_slot_only_next_to_a_total(self) -> None:
        opts = define(key=["item"], limit=1, total_limit=3).singleton_options()
        assert (opts.limit, opts.total_limit, opts.lock) == (1, 3, "while_executing")
        assert repr(opts.mode) == "<mode limit>"
        assert opts.mode.total.limit == 3
        alone = define(key=["item"], limit=1).singleton_options()
        assert (alone.limit, alone.total_limit) == (None, None)
        assert repr(alone.mode) == "<mode while_executing>", "limit=1 alone holds the key"

    def test_tenants_never_run_two_at_once_nor_more_than_the_total(self, cenv: CeleryEnv) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        tenants = [f"tenant-{tag}-{n}" for n in range(6)]
        worker = Worker(cenv.env, concurrency=8).start()
        try:
            # Five calls of each of six tenants, interleaved: 30 calls, 3 runs at once.
            calls = [
                app.export_one_total.apply_async((tenant, 0.15), queue=worker.queue)
                for _ in range(5)
                for tenant in tenants
            ]
            results = results_of(calls, worker, 90)
        finally:
            worker.stop()
        assert sorted(results) == sorted(tenant for tenant in tenants for _ in range(5))
        done = [r for r in runs(cenv) if r["item"] in tenants]
        assert sorted(r["id"] for r in done) == sorted(c.id for c in calls), "each ran once"
        for tenant in tenants:
            assert_no_overlap(of(done, tenant))  # one at a time, fences increasing
        most = concurrency(done)
        print(f"\n6 tenants x 5 calls, limit=1, total_limit=3, 8 children: {most} at once")
        assert most <= 3
        assert most == 3, "the total is used, not just kept"
        assert not held_by(cenv, tenants), "every slot given back"

    def test_a_retry_keeps_the_tenant_and_a_failure_frees_it(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        app, tenant = cenv.app_module, f"ends-{uuid.uuid4().hex[:6]}"
        retried = app.export_one_total.apply_async((tenant, 0.1, "", "retry"), queue=worker.queue)
        wait_for(lambda: [r for r in runs(cenv) if r["item"] == tenant], what="the first try")
        # Sent during the retry's countdown: it waits, as the retry keeps the tenant's slot.
        later = app.export_one_total.apply_async((tenant, 0.1), queue=worker.queue)
        assert retried.get(timeout=20) == tenant
        assert later.get(timeout=20) == tenant
        records = of(runs(cenv), tenant)
        assert [(r["id"], r["retries"]) for r in records] == [
            (retried.id, 0),
            (retried.id, 1),
            (later.id, 0),
        ]
        assert_no_overlap(records)
        failed = app.export_one_total.apply_async((tenant, 0.0, "", "fail"), queue=worker.queue)
        with pytest.raises(ValueError, match="failing on purpose"):
            failed.get(timeout=20)
        wait_for(lambda: not held_by(cenv, [tenant]), 3, "the slots freed")

    @pytest.mark.parametrize("end", ["SIGKILL", "revoke"])
    def test_a_killed_child_gives_both_slots_back_and_the_tenants_next_call_runs(
        self, cenv: CeleryEnv, worker: Worker, end: str
    ) -> None:
        app, tenant = cenv.app_module, f"killed-{uuid.uuid4().hex[:6]}"
        first = app.export_one_total.apply_async((tenant, 30.0), queue=worker.queue)
        [begun] = wait_for(
            lambda: [r for r in started(cenv) if r["item"] == tenant], what="the first start"
        )
        held = held_by(cenv, [tenant])
        assert len(held) == 2, f"the tenant's slot and one of the total: {held}"
        parked = waiting_for_a_wake_up(cenv)
        later = app.export_one_total.apply_async((tenant, 0.0), queue=worker.queue)
        wait_for(lambda: waiting_for_a_wake_up(cenv) > parked, 10, "the next call waiting")
        assert [r["id"] for r in started(cenv) if r["item"] == tenant] == [first.id]
        killed = time.time()
        if end == "SIGKILL":
            os.kill(begun["pid"], signal.SIGKILL)
        else:
            app.app.control.revoke(first.id, terminate=True)
        assert later.get(timeout=10) == tenant
        assert [r["id"] for r in started(cenv) if r["item"] == tenant] == [first.id, later.id]
        [ran] = of(runs(cenv), tenant)
        # Freed by the worker's child watch, not by the slots' ttl (10 s here).
        assert ran["start"] - killed < 1.5, f"the next call began {ran['start'] - killed:.2f}s on"
        wait_for(lambda: not held_by(cenv, [tenant]), 3, "the slots freed")
