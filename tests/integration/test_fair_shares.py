"""``total_limit`` round robin across keys (``lease.limits.turns``): one key's flood cannot
starve the others; weights share the turns; waiting calls hold no pool process, are not
lost with a worker, run once; the caps hold in every window. On real prefork workers."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from typing import Any

import pytest

from celery_singleton_lock import ConfigurationError
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.contrib import limits
from celery_singleton_lock.lease import slot
from celery_singleton_lock.lease.limits.overrides import REFRESH, Override, overrides_of
from celery_singleton_lock.lease.limits.turns import turns_of
from celery_singleton_lock.tokens import TURN_HEADER

from ..conftest import CeleryEnv
from ..support.cli import cli
from ..support.modes import concurrency, define, results_of
from ..support.runs import UNTIL_OPENED, dropped, open_gate, runs, started, wait_for
from ..support.workers import Worker

FAIR = "tests.support.celery_app.export_fair"
WEIGHTED = "tests.support.celery_app.export_weighted"


def of_items(records: list[dict[str, Any]], items: list[str]) -> list[dict[str, Any]]:
    return sorted((r for r in records if r["item"] in items), key=lambda r: r["start"])


def check_caps(done: list[dict[str, Any]], per_key: int, total: int) -> None:
    """No window ever ran more than ``total`` runs, nor more than ``per_key`` of a key."""
    assert concurrency(done) <= total, f"more than {total} at once"
    for _, runs_of_key in itertools.groupby(
        sorted(done, key=lambda r: r["item"]), key=lambda r: r["item"]
    ):
        assert concurrency(list(runs_of_key)) <= per_key


def waiting(cenv: CeleryEnv, task: str) -> dict[str, int]:
    turns = turns_of(LockStores.for_app(cenv.app_module.app).lock)
    assert turns is not None
    return turns.waiting(f"{task}#total")


def of_started(cenv: CeleryEnv, item: str) -> list[dict[str, Any]]:
    return [s for s in started(cenv) if s["item"] == item]


def stamp_of(cenv: CeleryEnv, task: str, ident: str) -> int:
    """The stamp of a call's turn (``lease.limits.turns``): its one message that may start."""
    store = LockStores.for_app(cenv.app_module.app).lock
    room = f"{store.keys(f'{task}#total').lock}:turns:stamps"
    return int(store.client.hget(room, ident))


def slots_free(cenv: CeleryEnv, task: str, total: int) -> bool:
    store = LockStores.for_app(cenv.app_module.app).lock
    return all(store.holder(slot(f"{task}#total", n)) is None for n in range(1, total + 1))


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


class TestOnce:
    def test_a_late_copy_of_a_call_sent_on_its_turn_is_dropped(self, cenv: CeleryEnv) -> None:
        # What a turn re-sent after its message seemed lost can leave behind: the message
        # of an earlier hand-out (or of a later one), or the one the call was kept from,
        # delivered after the call started. Each is dropped as a copy: the call runs once.
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        blocker, tenant = f"g-{tag}", f"c-{tag}"
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            gated = [
                app.export_fair.apply_async((blocker, UNTIL_OPENED), queue=worker.queue)
                for _ in range(2)
            ]
            wait_for(lambda: len(of_started(cenv, blocker)) == 2, 30, "the total full")
            call = app.export_fair.apply_async((tenant, 0.1), queue=worker.queue)
            wait_for(lambda: waiting(cenv, FAIR).get(f"fair:{tenant}"), 10, "it waits")
            open_gate(cenv, blocker)
            assert call.get(timeout=20) == tenant
            stamp = stamp_of(cenv, FAIR, f"{call.id}:0")
            copies = [{TURN_HEADER: str(stamp + 1)}, {}]
            if stamp > 1:
                copies.append({TURN_HEADER: str(stamp - 1)})
            for headers in copies:
                app.app.send_task(
                    FAIR, (tenant, 0.1), task_id=call.id, headers=headers, queue=worker.queue
                )
            wait_for(lambda: len(dropped(cenv, call.id)) == len(copies), 20, "copies dropped")
            open_gate(cenv, blocker)
            results_of(gated, worker, 30)
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
        assert [r["id"] for r in runs(cenv) if r["item"] == tenant] == [call.id], "it ran once"
        assert not waiting(cenv, FAIR)

    def test_a_call_handed_its_turn_as_its_key_pauses_gives_it_on(self, cenv: CeleryEnv) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        # (the paused key is named first: at an equal pass it is served first)
        blocker, paused, other = f"g-{tag}", f"a-{tag}", f"b-{tag}"
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            gated = [
                app.export_fair.apply_async((blocker, UNTIL_OPENED), queue=worker.queue)
                for _ in range(2)
            ]
            wait_for(lambda: len(of_started(cenv, blocker)) == 2, 30, "the total full")
            held = app.export_fair.apply_async((paused, 0.1), queue=worker.queue)
            wait_for(lambda: waiting(cenv, FAIR).get(f"fair:{paused}"), 10, "it waits")
            going = app.export_fair.apply_async((other, 0.1), queue=worker.queue)
            wait_for(lambda: waiting(cenv, FAIR).get(f"fair:{other}"), 10, "it waits too")
            limits.set(app.app, f"fair:{paused}", paused=True)
            # Every worker process reads an operator's change within REFRESH (0.5 s):
            # the paused key's call is handed its turn only once they all know.
            time.sleep(2 * REFRESH)
            open_gate(cenv, blocker)  # one slot frees: the paused key's turn
            # Given on at once, not held for the reservation's 60 s.
            assert going.get(timeout=20) == other
            assert not of_started(cenv, paused), "the paused call did not run"
            assert f"fair:{paused}" not in waiting(cenv, FAIR), "it waits out the pause"
            limits.set(app.app, f"fair:{paused}", paused=False)
            assert held.get(timeout=30) == paused
            open_gate(cenv, blocker)
            results_of(gated, worker, 30)
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
            limits.set(app.app, f"fair:{paused}", reset=True)
        done = of_items(runs(cenv), [blocker, paused, other])
        assert [r["id"] for r in done if r["item"] == paused] == [held.id], "once"
        check_caps(done, per_key=2, total=2)
        assert not waiting(cenv, FAIR)
        wait_for(lambda: slots_free(cenv, FAIR, 2), 5, "every slot of the total given back")


class TestWorkerDeath:
    def test_a_worker_killed_with_calls_waiting_loses_none(self, cenv: CeleryEnv) -> None:
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        tenants = [f"k-{tag}-{n}" for n in range(3)]
        # Short leases and visibility: the killed runs' slots free and their messages
        # (acks_late) come again within seconds.
        env = {"CSL_TTL": "2", "CSL_VISIBILITY_TIMEOUT": "2"}
        doomed = Worker(cenv.env, concurrency=4, extra_env=env).start()
        other = Worker(cenv.env, concurrency=4, extra_env=env, queue=doomed.queue)
        calls = []
        try:
            calls = [
                app.export_fair.apply_async((tenant, 0.5), queue=doomed.queue)
                for _ in range(4)
                for tenant in tenants
            ]
            wait_for(lambda: sum(waiting(cenv, FAIR).values()) >= 6, 30, "calls waiting")
            children = set(doomed.children())
            doomed.kill()  # two runs, and the calls handed a turn on their way
            other.start()
            results = results_of(calls, other, 90)
        except BaseException:
            print(doomed.output()[-4000:], other.output()[-4000:])
            raise
        finally:
            doomed.stop()
            other.stop()
        assert sorted(results) == sorted(t for t in tenants for _ in range(4))
        done = of_items(runs(cenv), tenants)
        assert {r["id"] for r in done} == {c.id for c in calls}, "each call ran to its end"
        # Once, but for a run the kill caught between its end and its ack (acks_late:
        # Celery's own at-least-once): one of its runs was on the killed worker.
        for task_id in {r["id"] for r in done}:
            twice = [r for r in done if r["id"] == task_id]
            assert len(twice) == 1 or any(r["pid"] in children for r in twice), twice
        check_caps(done, per_key=2, total=2)
        assert not waiting(cenv, FAIR)


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
        with pytest.raises(ConfigurationError, match="weight must be a number above 0"):
            define(key=["item"], limit=2, total_limit=3, weight=0)
