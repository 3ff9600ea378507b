"""``total_limit`` round robin across keys (``lease.limits.turns``): one key's flood cannot
starve the others; weights share the turns; waiting calls hold no pool process; the caps
hold in every window (each call runs once: ``test_fair_shares_once``). On real prefork
workers."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from celery_singleton_lock import BackpressureError, ConfigurationError
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.contrib import limits
from celery_singleton_lock.lease.limits.overrides import Override, overrides_of

from ..conftest import CeleryEnv
from ..support.cli import cli
from ..support.modes import concurrency, define, results_of
from ..support.runs import UNTIL_OPENED, open_gate, runs, started, wait_for
from ..support.turns import FAIR, check_caps, of_items, of_started, slots_free, waiting
from ..support.workers import Worker

WEIGHTED = "tests.support.celery_app.export_weighted"
CAPPED = "tests.support.celery_app.export_fair_capped"


class TestRoundRobin:
    @pytest.mark.parametrize("pool", ["prefork", pytest.param("gevent", marks=pytest.mark.oneoff)])
    def test_late_keys_start_within_a_run_while_one_key_floods(
        self, cenv: CeleryEnv, pool: str
    ) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        flood, late = f"a-{tag}", [f"b-{tag}", f"c-{tag}"]
        worker = Worker(cenv.env, concurrency=4, pool=pool).start()
        try:
            calls = [
                app.export_fair.apply_async((flood, 0.4), queue=worker.queue) for _ in range(24)
            ]
            wait_for(lambda: len(of_items(runs(cenv), [flood])) >= 2, 30, "the flood going")
            sent: dict[str, float] = {}
            for tenant in late:
                sent[tenant] = time.time()
                calls += [
                    app.export_fair.apply_async((tenant, 0.4), queue=worker.queue) for _ in range(2)
                ]
            results = results_of(calls, worker, 90)
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
        assert sorted(results) == sorted([flood] * 24 + [t for t in late for _ in range(2)])
        done = of_items(runs(cenv), [flood, *late])
        assert sorted(r["id"] for r in done) == sorted(c.id for c in calls), "each ran once"
        check_caps(done, per_key=2, total=2)
        assert concurrency(done) == 2, "the total is used, not just kept"
        flood_starts = [r["start"] for r in done if r["item"] == flood]
        # Without an event loop (gevent) kombu's Redis channel whose prefetch was full
        # looks for messages again on its polling interval (1 s): a call sent on its
        # turn may wait that much more in the broker, once or twice (the flood: 10 s).
        bound = 1.0 if pool == "prefork" else 4.0
        for tenant in late:
            first = min(r["start"] for r in done if r["item"] == tenant)
            waited = first - sent[tenant]
            print(f"\n{tenant}'s first call started {waited:.2f}s after it was sent")
            assert waited < bound, f"{tenant} waited {waited:.2f}s behind the flood (0.4 s runs)"
            assert sum(1 for s in flood_starts if s > first) >= 10, "while the flood goes on"
        assert not waiting(cenv, FAIR), "the room is empty"
        assert slots_free(cenv, FAIR, 2), "every slot of the total given back"

    def test_a_waiting_call_holds_no_pool_process(self, cenv: CeleryEnv) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        keys = [f"p-{tag}-{n}" for n in range(4)]
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            calls = [app.export_fair.apply_async((key, -30.0), queue=worker.queue) for key in keys]
            # Two run (the total), held open; two wait in the room, not in the pool (two
            # processes are free: a call sent on while the pool is full waits in the broker).
            wait_for(lambda: len([s for s in started(cenv) if s["item"] in keys]) == 2, 30, "two")
            wait_for(lambda: sum(waiting(cenv, FAIR).values()) == 2, 30, "two kept")
            [row] = [r for r in limits.rows(app.app) if r.target == FAIR]
            assert sum(row.waiting.values()) == 2, "an operator sees who waits"
            assert row.waiting_said == "2 waiting their turn, in 2 keys"
            asked = worker.inspect("active", "reserved")
            assert len(asked["active"]) == 2, "only the two runs"
            assert not asked["reserved"], "nothing in the prefetch"
            checker = cenv.checker_client()
            for key in keys:
                checker.rpush(f"gate:{key}", 1)
            results_of(calls, worker, 60)
        finally:
            worker.stop()

    def test_a_retry_and_a_failure_take_their_turns(self, cenv: CeleryEnv) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        tenant, other = f"r-{tag}", f"f-{tag}"
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            flood = [
                app.export_fair.apply_async((other, 0.3), queue=worker.queue) for _ in range(6)
            ]
            retried = app.export_fair.apply_async((tenant, 0.1, "retry"), queue=worker.queue)
            failed = app.export_fair.apply_async((tenant, 0.0, "fail"), queue=worker.queue)
            assert retried.get(timeout=30) == tenant
            with pytest.raises(ValueError, match="failing on purpose"):
                failed.get(timeout=30)
            results_of(flood, worker, 60)
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
        records = of_items(runs(cenv), [tenant])
        attempts = sorted(r["retries"] for r in records if r["id"] == retried.id)
        assert attempts == [0, 1], "the retry ran once more, and once"
        check_caps(of_items(runs(cenv), [tenant, other]), per_key=2, total=2)
        wait_for(lambda: slots_free(cenv, FAIR, 2) and not waiting(cenv, FAIR), 5, "all free")

    def test_a_paused_key_takes_no_turn_and_goes_on_its_resume(self, cenv: CeleryEnv) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        paused, other = f"z-{tag}", f"o-{tag}"
        limits.set(app.app, f"fair:{paused}", paused=True)
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            held = [
                app.export_fair.apply_async((paused, 0.1), queue=worker.queue) for _ in range(2)
            ]
            going = [
                app.export_fair.apply_async((other, 0.3), queue=worker.queue) for _ in range(6)
            ]
            results_of(going, worker, 60)
            assert not [s for s in started(cenv) if s["item"] == paused], "none of it ran"
            assert paused not in waiting(cenv, FAIR), "it waits out the pause, not its turn"
            limits.set(app.app, f"fair:{paused}", paused=False)
            assert results_of(held, worker, 30) == [paused, paused]
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
            limits.set(app.app, f"fair:{paused}", reset=True)
        check_caps(of_items(runs(cenv), [paused, other]), per_key=2, total=2)

    def test_a_call_that_expired_waiting_gives_its_turn_on(self, cenv: CeleryEnv) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        long, expiring, after = f"x-{tag}", f"e-{tag}", f"y-{tag}"
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            held = [app.export_fair.apply_async((long, 1.5), queue=worker.queue) for _ in range(2)]
            wait_for(lambda: len([s for s in started(cenv) if s["item"] == long]) == 2, 30, "full")
            gone = app.export_fair.apply_async((expiring, 0.1), queue=worker.queue, expires=0.5)
            wait_for(lambda: waiting(cenv, FAIR).get(f"fair:{expiring}"), 10, "it waits")
            late = app.export_fair.apply_async((after, 0.1), queue=worker.queue)
            results_of([*held, late], worker, 30)
            wait_for(lambda: gone.state == "REVOKED", 10, "Celery's end of an expired call")
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
        done = of_items(runs(cenv), [long, after])
        freed = min(r["end"] for r in done if r["item"] == long)
        began = next(r["start"] for r in done if r["item"] == after)
        assert began - freed < 1.0, "the expired call's turn went on at once, not in 60 s"
        assert not of_items(runs(cenv), [expiring]), "an expired call does not run"
        assert not waiting(cenv, FAIR)

    def test_a_call_waiting_longer_than_its_place_keeps_the_cap(self, cenv: CeleryEnv) -> None:
        # max_pending=1, queue_ttl=2: its place is renewed while it waits in the room, so
        # another call of its key is refused however long it waits.
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        blockers, tenant = [f"g{n}-{tag}" for n in range(2)], f"m-{tag}"
        store = LockStores.for_app(app.app).lock
        place = store.keys(f"capped:{tenant}").backlog
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            gated = [
                app.export_fair_capped.apply_async((blocker, UNTIL_OPENED), queue=worker.queue)
                for blocker in blockers
            ]
            wait_for(lambda: all(of_started(cenv, b) for b in blockers), 30, "the total full")
            call = app.export_fair_capped.apply_async((tenant, 0.1), queue=worker.queue)
            wait_for(lambda: waiting(cenv, CAPPED).get(f"capped:{tenant}"), 10, "it waits")
            first = store.client.zscore(place, call.id)
            assert first is not None, "it holds a place"
            wait_for(
                lambda: (store.client.zscore(place, call.id) or 0) > first + 3000,
                20,
                "its place renewed past the queue ttl while it waits",
            )
            with pytest.raises(BackpressureError):
                app.export_fair_capped.apply_async((tenant, 0.1), queue=worker.queue)
            open_gate(cenv, blockers[0])
            assert call.get(timeout=20) == tenant
            open_gate(cenv, blockers[1])
            results_of(gated, worker, 30)
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
        wait_for(lambda: store.client.zscore(place, call.id) is None, 5, "its place left")


class TestWeights:
    @pytest.mark.parametrize("how", ["code", "operator"])
    def test_a_key_of_weight_three_gets_three_turns_to_one(self, cenv: CeleryEnv, how: str) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        task = app.export_weighted
        if how == "code":  # weight= a callable of the task's arguments
            heavy, light = f"heavy-{tag}", f"light-{tag}"
        else:  # celery singleton limits set KEY --weight 3 (over the code's 1)
            heavy, light = f"op-{tag}", f"plain-{tag}"
            limits.set(app.app, f"heavy:{heavy}", weight=3)
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            # Both floods wait together: the first two calls fill the total, then each
            # freed slot is a turn.
            calls = [task.apply_async((light, 0.15), queue=worker.queue) for _ in range(20)]
            calls += [task.apply_async((heavy, 0.15), queue=worker.queue) for _ in range(20)]
            results_of(calls, worker, 120)
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
            overrides = overrides_of(LockStores.for_app(app.app).lock)
            overrides.save(Override(f"heavy:{heavy}"))
        done = of_items(runs(cenv), [heavy, light])
        assert len(done) == 40
        check_caps(done, per_key=3, total=2)
        # While both wait: from the heavy flood's first start (the light one, sent first,
        # ran alone until then) to its last.
        starts = [r["start"] for r in done if r["item"] == heavy]
        both = [r for r in done if min(starts) <= r["start"] < max(starts)]
        shares = {item: sum(1 for r in both if r["item"] == item) for item in (heavy, light)}
        ratio = shares[heavy] / max(1, shares[light])
        order = "".join("H" if r["item"] == heavy else "l" for r in done)
        print(f"\nweights 3:1 under two floods: {shares} ({ratio:.2f} to 1): {order}")
        assert 2.4 <= ratio <= 4.0, f"shares {shares} (1 to 1 without weights)"
        assert slots_free(cenv, WEIGHTED, 2)


class TestOperators:
    def test_a_weight_is_set_listed_in_the_history_and_reset(self, cenv: CeleryEnv) -> None:
        key = f"fair:w-{uuid.uuid4().hex[:6]}"
        try:
            done = cli(cenv, "limits", "set", key, "--weight", "3")
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == f"{key}: weight 3"
            listed = json.loads(cli(cenv, "limits", "list", "--json").stdout)
            row = next(r for r in listed if r["target"] == key)
            assert (row["code"], row["override"]) == ("limit 2; total 2", "weight 3")
            entries = json.loads(cli(cenv, "history", key, "--json").stdout)
            assert entries[0]["event"] == "limits weight"
            store = LockStores.for_app(cenv.app_module.app).lock
            found = overrides_of(store).all()[key]
            assert found.weight == 3.0
            # A key's weight where it has no total taken in turn: said what to write.
            refused = cli(cenv, "limits", "set", "tests.support.celery_app.export", "--weight", "2")
            assert refused.returncode == 1
            assert "has no total_limit= taken round robin" in refused.stderr
            tiny = cli(cenv, "limits", "set", key, "--weight", "0.0001")
            assert tiny.returncode == 2
            assert "0.001<=x<=1000" in tiny.stderr, tiny.stderr
        finally:
            assert cli(cenv, "limits", "set", key, "--reset").returncode == 0

    def test_the_code_s_weight_and_order_are_checked(self) -> None:
        opts = define(key=["item"], limit=2, total_limit=3).singleton_options()
        assert opts.mode.takes_turns, "round robin is the default with total_limit"
        first = define(key=["item"], limit=2, total_limit=3, total_order="first_come")
        assert not first.singleton_options().mode.takes_turns
        weighted = define(key=["item"], limit=2, total_limit=3, weight=2.5).singleton_options()
        assert weighted.mode.weight(((), {}), None) == 2.5
        with pytest.raises(ConfigurationError, match="total_order='lifo' must be one of"):
            define(key=["item"], limit=2, total_limit=3, total_order="lifo")
        for tiny in (0, 0.0001):  # (too small a weight: its key would be served every turn)
            with pytest.raises(ConfigurationError, match=r"weight must be a number from 0\.001"):
                define(key=["item"], limit=2, total_limit=3, weight=tiny)
        assert define(key=["item"], limit=2, total_limit=3, weight=0.001).singleton_options()
