"""``total_limit`` round robin across keys (``lease.limits.turns``): every call runs once,
whichever of its messages comes, however late; a revoked waiting call gives its turn on;
a worker killed with calls waiting loses none. On real prefork workers."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from celery_singleton_lock.broker.turn_sweep import kept_call, send_turns
from celery_singleton_lock.contrib import limits
from celery_singleton_lock.lease.limits.overrides import REFRESH
from celery_singleton_lock.lease.limits.turns import Handed
from celery_singleton_lock.signals import execution_skipped
from celery_singleton_lock.tokens import NAME_HEADER, TURN_HEADER

from ..conftest import CeleryEnv
from ..support.modes import results_of
from ..support.runs import UNTIL_OPENED, dropped, open_gate, runs, wait_for
from ..support.turns import (
    FAIR,
    check_caps,
    of_items,
    of_started,
    slots_free,
    stamp_kept_for,
    stamp_of,
    waiting,
)
from ..support.workers import Worker


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

    def test_a_copy_of_a_running_call_is_dropped(self, cenv: CeleryEnv) -> None:
        # Its own message, of its current stamp, delivered again while it runs (acks_late
        # past the visibility timeout, or the library's restorer): a copy, not a new call.
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        blocker, tenant = f"g-{tag}", f"r-{tag}"
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            gated = [
                app.export_fair.apply_async((blocker, UNTIL_OPENED), queue=worker.queue)
                for _ in range(2)
            ]
            wait_for(lambda: len(of_started(cenv, blocker)) == 2, 30, "the total full")
            call = app.export_fair.apply_async((tenant, UNTIL_OPENED), queue=worker.queue)
            wait_for(lambda: waiting(cenv, FAIR).get(f"fair:{tenant}"), 10, "it waits")
            open_gate(cenv, blocker)
            wait_for(lambda: of_started(cenv, tenant), 20, "it runs on its turn")
            stamp = stamp_of(cenv, FAIR, f"{call.id}:0")
            app.app.send_task(
                FAIR, (tenant, UNTIL_OPENED), task_id=call.id,
                headers={TURN_HEADER: str(stamp)}, queue=worker.queue,
            )  # fmt: skip
            wait_for(lambda: dropped(cenv, call.id), 20, "the copy dropped")
            # Its stamp outlives the broker's visibility timeout (kombu's 1 h here) and a
            # reservation: a copy handed out after it is still told for one.
            assert stamp_kept_for(cenv, FAIR, f"{call.id}:0") > 3600.0
            open_gate(cenv, tenant)
            open_gate(cenv, blocker)
            assert call.get(timeout=20) == tenant
            results_of(gated, worker, 30)
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
        assert len(of_started(cenv, tenant)) == 1, "it ran once"
        assert not waiting(cenv, FAIR)

    def test_a_call_revoked_while_waiting_gives_its_turn_on(self, cenv: CeleryEnv) -> None:
        # Sent on its turn, it is dropped as revoked: its turn goes on at once, not after
        # its reservation's 60 s (and it is not sent round again).
        app, tag = cenv.app_module, uuid.uuid4().hex[:6]
        blocker, revoked, after = f"g-{tag}", f"v-{tag}", f"w-{tag}"
        worker = Worker(cenv.env, concurrency=4).start()
        try:
            gated = [
                app.export_fair.apply_async((blocker, UNTIL_OPENED), queue=worker.queue)
                for _ in range(2)
            ]
            wait_for(lambda: len(of_started(cenv, blocker)) == 2, 30, "the total full")
            call = app.export_fair.apply_async((revoked, 0.1), queue=worker.queue)
            wait_for(lambda: waiting(cenv, FAIR).get(f"fair:{revoked}"), 10, "it waits")
            app.app.control.revoke(call.id)
            wait_for(lambda: "flagged as revoked" in worker.output(), 10, "the worker knows")
            open_gate(cenv, blocker)
            wait_for(lambda: not waiting(cenv, FAIR), 10, "its turn forgotten")
            late = app.export_fair.apply_async((after, 0.1), queue=worker.queue)
            assert late.get(timeout=10) == after, "the slot its turn had is free"
            open_gate(cenv, blocker)
            results_of(gated, worker, 30)
        except BaseException:
            print(worker.output()[-6000:])
            raise
        finally:
            worker.stop()
        assert not of_started(cenv, revoked), "a revoked call does not run"
        wait_for(lambda: slots_free(cenv, FAIR, 2), 5, "every slot of the total given back")

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


def test_a_call_given_up_is_said_and_not_sent(
    cenv: CeleryEnv, caplog: pytest.LogCaptureFixture
) -> None:
    # A room's hand-out gave it up (sent on its turn again and again, never started):
    # an error names it, as a skipped call, and nothing is sent.
    app, tag = cenv.app_module, uuid.uuid4().hex[:6]
    task_id, name = f"gone-{tag}", f"fair:gone-{tag}"
    signature = app.export_fair.signature(
        (f"gone-{tag}",), task_id=task_id, headers={NAME_HEADER: name}
    )
    record = kept_call(signature, {})
    assert record is not None
    skipped: list[dict[str, object]] = []

    def heard(sender: object = None, **fields: object) -> None:
        skipped.append(fields)

    execution_skipped.connect(heard, weak=False)
    try:
        with caplog.at_level(logging.ERROR, logger="celery_singleton_lock.broker.turn_sweep"):
            send_turns(app.app, [Handed(f"{task_id}:0", record, -1)])
    finally:
        execution_skipped.disconnect(heard)
    assert [(s["task_id"], s["name"]) for s in skipped] == [(task_id, name)]
    assert f"[{task_id}] given up" in caplog.text
    assert app.app.AsyncResult(task_id).state == "PENDING", "not sent"
