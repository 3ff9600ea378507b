"""Chaos scenarios: real processes, real Redis, faults on purpose, an external checker.

Sizes come from ``CHAOS_SCALE`` (see conftest.py); every scenario is bounded in count
and time, talks only to 127.0.0.1, and records its figures for docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from ..conftest import CeleryEnv
from ..support.runs import lock_keys, runs, started, wait_for
from ..support.workers import ROOT, Worker
from .checker import assert_outage, check, outage_figures
from .conftest import Figures, distribution, per_second, size

APP = "tests.support.celery_app"  # the test app's module: its tasks' name prefix

pytestmark = pytest.mark.slow

CALLER = """
import json, os, sys, time
from celery_singleton_lock import DuplicateTaskError
import tests.support.celery_app as m
mode, queue, calls, start_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
keys = int(sys.argv[5])
while time.time() < start_at:  # every caller starts at one barrier
    time.sleep(0.0005)
ids = []
for i in range(calls):
    if mode == "storm":
        try:
            ids.append(m.work.apply_async(("storm",), queue=queue).id)
        except DuplicateTaskError as error:
            ids.append(error.task_id)
    else:
        item = f"bypass-{i % keys}"
        ids.append(m.app.send_task("tests.support.celery_app.swarm", (item,), queue=queue).id)
print(json.dumps(ids))
"""


def callers(
    cenv: CeleryEnv, mode: str, queue: str, processes: int, calls: int, *, keys: int = 1
) -> list[str]:
    start_at = time.time() + 3.0  # time for every interpreter to import Celery
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CALLER, mode, queue, str(calls), str(start_at), str(keys)],
            cwd=ROOT,
            env={**os.environ, **cenv.env},
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    ids: list[str] = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0
            ids += json.loads(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    return ids


def free_after(cenv: CeleryEnv, item: str, task: Any, limit: float) -> float:
    key = "t:{" + task.singleton_options().key.derive((item,), {}) + "}"
    began = time.monotonic()
    wait_for(lambda: not cenv.lock_client().exists(key), limit, f"{key} free")
    return time.monotonic() - began


class TestStorms:
    def test_storm_of_one_key_publishes_one_message(
        self, cenv: CeleryEnv, figures: Figures
    ) -> None:
        processes, calls = size("storm_processes"), size("storm_calls")
        queue = "storm-q"
        cenv.broker.client().delete(queue)
        ids = callers(cenv, "storm", queue, processes, calls)
        published = int(cenv.broker.client().llen(queue))
        figures.record(
            "storm",
            dispatches=len(ids),
            processes=processes,
            messages_published=published,
            distinct_task_ids=len(set(ids)),
        )
        assert len(ids) == processes * calls
        assert published == 1
        assert len(set(ids)) == 1
        cenv.broker.client().delete(queue)

    def test_bypass_storm_never_overlaps_and_runs_every_message(
        self, cenv: CeleryEnv, worker: Worker, figures: Figures
    ) -> None:
        processes, calls, keys = size("bypass_processes"), size("bypass_calls"), size("bypass_keys")
        ids = callers(cenv, "bypass", worker.queue, processes, calls, keys=keys)
        wait_for(lambda: len(runs(cenv)) >= len(ids), 240, "every message to run")
        verdict = check(runs(cenv), submitted=ids, exactly_once=True, allow_unlocked=False)
        figures.record(
            "bypass_storm",
            messages=len(ids),
            keys=keys,
            executions=verdict.executions,
            overlaps=len(verdict.overlaps),
            fence_regressions=len(verdict.fence_regressions),
            missing=len(verdict.missing),
            duplicated=len(verdict.duplicated),
        )
        assert verdict.ok, verdict.summary()


class TestCrashLoop:
    def test_killed_children_free_their_keys_within_a_second(
        self, cenv: CeleryEnv, worker: Worker, figures: Figures
    ) -> None:
        rng = random.Random(5)
        work = cenv.app_module.work
        freed: list[float] = []
        for trial in range(size("child_kills")):
            item = f"crash-{trial}"
            work.apply_async((item, 30), queue=worker.queue)
            record = wait_for(
                lambda item=item: next((s for s in started(cenv) if s["item"] == item), None),
                20,
                "start",
            )
            time.sleep(rng.uniform(0, 0.2))  # a random point of the running task
            os.kill(record["pid"], signal.SIGKILL)
            freed.append(free_after(cenv, item, work, 1.0))
        figures.record("crash_child", trials=len(freed), **distribution(freed))
        assert max(freed) <= 1.0

    def test_killed_workers_free_their_keys_within_ttl(
        self, cenv: CeleryEnv, figures: Figures
    ) -> None:
        ttl = 2.0
        rng = random.Random(6)
        work = cenv.app_module.work
        freed: list[float] = []
        for trial in range(size("worker_kills")):
            doomed = Worker(cenv.env, extra_env={"CSL_TTL": str(ttl)}).start()
            try:
                item = f"whole-{trial}"
                work.apply_async((item, 30), queue=doomed.queue)
                wait_for(lambda item=item: any(s["item"] == item for s in started(cenv)), 20)
                time.sleep(rng.uniform(0, 0.3))
                doomed.kill()
                freed.append(free_after(cenv, item, work, ttl + 1.0))
            finally:
                doomed.stop()
        figures.record("crash_worker", trials=len(freed), ttl_s=ttl, **distribution(freed))
        assert max(freed) <= ttl + 1.0


class TestLockStoreFaults:
    def test_redis_restart_loses_every_lease_and_fencing_rejects_stale_writes(
        self, cenv: CeleryEnv, figures: Figures
    ) -> None:
        keys = size("restart_keys")
        app = cenv.app_module.app
        pool = Worker(cenv.env, concurrency=2 * keys).start()
        try:
            first = [
                app.send_task(f"{APP}.fenced_writer", (f"rs-{i}", 4.0), queue=pool.queue)
                for i in range(keys)
            ]
            wait_for(lambda: len(started(cenv)) >= keys, 20, "first generation running")
            cenv.lock.restart()  # persistence off: every lock and fence key is gone
            second = [
                app.send_task(f"{APP}.fenced_writer", (f"rs-{i}",), queue=pool.queue)
                for i in range(keys)
            ]
            late = [r.get(timeout=60) for r in first]
            fresh = [r.get(timeout=60) for r in second]
            after = cenv.app_module.work.apply_async(("after-restart",), queue=pool.queue)
            assert after.get(timeout=30) == "after-restart"  # the workers recovered
        finally:
            pool.stop()
        figures.record(
            "redis_restart",
            in_flight=keys,
            detected_lost=sum(r["lost"] for r in late),
            stale_writes_rejected=sum(not r["accepted"] for r in late),
            fresh_writes_accepted=sum(r["accepted"] for r in fresh),
        )
        assert all(r["lost"] for r in late)
        assert not any(r["accepted"] for r in late)
        assert all(r["accepted"] and not r["lost"] for r in fresh)

    @pytest.mark.parametrize("policy", ["fail_closed", "fail_open"])
    def test_redis_unreachable_for_five_seconds(
        self, cenv: CeleryEnv, figures: Figures, policy: str
    ) -> None:
        from ..support.servers import RedisServer

        store = RedisServer().start()
        env = {**cenv.env, "CSL_LOCK_URL": store.url, "CSL_ON_REDIS_ERROR": policy}
        pool = Worker(env).start()
        try:
            app = cenv.app_module.app
            store.kill()
            sent = [
                app.send_task(f"{APP}.swarm", (f"down-{i}",), queue=pool.queue).id
                for i in range(size("outage_tasks"))
            ]
            time.sleep(5.0)
            ran_during = len(runs(cenv))
            store.start()
            wait_for(lambda: len(runs(cenv)) >= len(sent), 90, "every task to run")
            log = pool.output()
        finally:
            pool.stop()
            store.cleanup()
        records = runs(cenv)
        verdict = check(records, submitted=sent, exactly_once=True)
        figures.record(f"redis_down_{policy}", **outage_figures(verdict, sent, ran_during))
        assert_outage(verdict, policy, sent, ran_during, log)

    def test_paused_holder_is_fenced_off_and_told(self, cenv: CeleryEnv, figures: Figures) -> None:
        ttl = 1.0
        pool = Worker(cenv.env, extra_env={"CSL_TTL": str(ttl)}).start()
        try:
            app = cenv.app_module.app
            paused = app.send_task(f"{APP}.fenced_writer", ("pause", 3.0), queue=pool.queue)
            [record] = wait_for(lambda: started(cenv), 20, "holder running")
            os.kill(record["pid"], signal.SIGSTOP)  # GC pause, VM freeze, SIGSTOP...
            try:
                time.sleep(ttl * 2.5)  # its lease expires: renewal is paused with it
                successor = app.send_task(f"{APP}.fenced_writer", ("pause",), queue=pool.queue)
                took_over = successor.get(timeout=30)
            finally:
                os.kill(record["pid"], signal.SIGCONT)
            resumed = paused.get(timeout=30)
        finally:
            pool.stop()
        figures.record(
            "pause",
            ttl_s=ttl,
            successor_write_accepted=took_over["accepted"],
            resumed_write_rejected=not resumed["accepted"],
            resumed_check_raised=resumed["lost"],
        )
        assert took_over == {"accepted": True, "lost": False}
        assert resumed == {"accepted": False, "lost": True}


class TestSoak:
    def test_mixed_load_with_random_kills(self, cenv: CeleryEnv, figures: Figures) -> None:
        ttl, seconds = 2.0, size("soak_seconds")
        rng = random.Random(8)
        queue = "soak-q"
        pool = [
            Worker(cenv.env, extra_env={"CSL_TTL": str(ttl)}, queue=queue).start() for _ in range(2)
        ]
        app, work = cenv.app_module.app, cenv.app_module.work
        try:
            time.sleep(1.0)
            rss_before = [w.rss_kib() for w in pool]
            sent: list[Any] = []
            kills, killed_at, began = 0, [], time.time()
            deadline = time.monotonic() + seconds
            next_kill = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                item = f"soak-{rng.randrange(20)}"
                if rng.random() < 0.7:
                    sent.append(work.apply_async((item, rng.uniform(0, 0.05)), queue=queue))
                else:
                    sent.append(app.send_task(f"{APP}.swarm", (item,), queue=queue))
                if time.monotonic() >= next_kill:
                    victim = rng.choice([c for w in pool for c in w.children()] or [0])
                    if victim:
                        os.kill(victim, signal.SIGKILL)
                        kills += 1
                        killed_at.append(round(time.time() - began, 2))
                    next_kill = time.monotonic() + rng.uniform(1.0, 3.0)
                time.sleep(rng.uniform(0, 0.02))
            wait_for(lambda: all(r.ready() for r in sent), 180, "the load to drain")
            rss_after = [w.rss_kib() for w in pool]
            time.sleep(ttl + 0.5)  # fence bookkeeping expires with the leases
            leaked = lock_keys(cenv) + [
                k for k in cenv.lock_client().scan_iter("t:*") if k.endswith(b":fence")
            ]
        finally:
            for w in pool:
                w.stop()
        verdict = check(runs(cenv), submitted={r.id for r in sent}, at_most_once=True)
        figures.record(
            "soak",
            seconds=seconds,
            dispatches=len(sent),
            executions=verdict.executions,
            child_kills=kills,
            overlaps=len(verdict.overlaps),
            fence_regressions=len(verdict.fence_regressions),
            keys_leaked=len(leaked),
            worker_rss_kib_before=rss_before,
            worker_rss_kib_after=rss_after,
            timeline={"per_second": per_second(runs(cenv), began, seconds), "kills": killed_at},
        )
        assert verdict.ok, verdict.summary()
        assert leaked == []
        assert all(
            after < before * 1.5 + 20_000
            for before, after in zip(rss_before, rss_after, strict=True)
        )

    @pytest.mark.parametrize(
        "visibility",
        [None, pytest.param(10, marks=pytest.mark.skipif(
            not os.environ.get("CHAOS_RESULTS"), reason="runs with `dev.py chaos`"))],
    )  # fmt: skip
    def test_mixed_load_with_random_worker_kills_on_a_green_pool(
        self, cenv: CeleryEnv, figures: Figures, visibility: int | None
    ) -> None:
        """gevent: no pool children, so the kills are of whole workers (a replacement
        starts each time). A killed worker's running tasks are lost (acked at start) and
        its prefetched messages wait for the visibility timeout: at most once, never two
        at a time, and every key free within ttl of the drain. With the test app's
        visibility timeout (an hour) those messages, and the queued holds on their keys,
        stay for the whole soak; with 10 s they come back (the second run)."""
        ttl, seconds = 2.0, size("soak_seconds")
        rng = random.Random(9)
        queue = f"soak-green-q{visibility or ''}"
        env = {"CSL_TTL": str(ttl)}
        if visibility is not None:
            env["CSL_VISIBILITY_TIMEOUT"] = str(visibility)
        broker = cenv.broker.client()
        stuck: list[int] = []  # per second: unacked messages older than 10 s

        def start() -> Worker:
            return Worker(
                cenv.env, pool="gevent", concurrency=20, extra_env=env, queue=queue
            ).start()

        pool = [start(), start()]
        app, work = cenv.app_module.app, cenv.app_module.work
        try:
            sent: list[Any] = []
            kills, killed_at, began = 0, [], time.time()
            deadline = time.monotonic() + seconds
            next_kill = time.monotonic() + 3.0
            sampled = time.monotonic()
            while time.monotonic() < deadline:
                if time.monotonic() >= sampled:
                    stuck.append(broker.zcount("unacked_index", "-inf", time.time() - 10))
                    sampled += 1.0
                item = f"green-{rng.randrange(20)}"
                if rng.random() < 0.7:
                    sent.append(work.apply_async((item, rng.uniform(0, 0.05)), queue=queue))
                else:
                    sent.append(app.send_task(f"{APP}.swarm", (item,), queue=queue))
                if time.monotonic() >= next_kill:
                    victim = pool.pop(rng.randrange(len(pool)))
                    victim.kill()
                    victim.stop()
                    kills += 1
                    killed_at.append(round(time.time() - began, 2))
                    pool.append(start())
                    next_kill = time.monotonic() + rng.uniform(3.0, 5.0)
                time.sleep(rng.uniform(0, 0.02))

            def drained() -> bool:
                ready = sum(r.ready() for r in sent)
                time.sleep(1.0)
                # Drained once none is noted in transit: a message lost between the
                # broker and a killed worker is pushed again and runs up to twice the
                # transit timeout later, taking its key (and a fence) after the rest.
                # With a short visibility timeout a killed worker's messages come back
                # and run too: none may be left unacked.
                back = broker.zcard("t:transit:due") == 0 and (
                    visibility is None or broker.zcard("unacked_index") == 0
                )
                return ready == sum(r.ready() for r in sent) and not held_by_others() and back

            def unacked_holds() -> list[bytes]:
                """Queued holds of messages a killed worker took off the queue but never
                received: they wait in the broker's unacked set for the visibility
                timeout, and their holds with them (documented)."""
                lost = {r.id for r in sent if not r.ready()}
                store = cenv.lock_client()
                return [
                    k
                    for k in lock_keys(cenv)
                    if (value := store.get(k) or b"").startswith(b"q|")
                    and value.split(b"|")[-1].decode() in lost
                ]

            def held_by_others() -> list[bytes]:
                return sorted(set(lock_keys(cenv)) - set(unacked_holds()))

            wait_for(drained, 120, "the load to drain")
            lost = sum(not r.ready() for r in sent)
            store = cenv.lock_client()

            def fences() -> list[bytes]:
                return [k for k in store.scan_iter("t:*") if k.endswith(b":fence")]

            # Fence bookkeeping expires with the leases: a ttl after the last run.
            with contextlib.suppress(AssertionError):
                wait_for(lambda: not fences(), ttl + 5, "the fence keys to expire")
            in_unacked = len(unacked_holds())
            leaked = held_by_others() + fences()
            # For the failure report: how long each has left, and what it holds.
            leaked_as = {
                k: (store.pttl(k), store.get(k) if store.type(k) == b"string" else store.type(k))
                for k in leaked
            }
        finally:
            for w in pool:
                w.stop()
        verdict = check(runs(cenv), submitted={r.id for r in sent}, at_most_once=True)
        figures.record(
            "soak_green" if visibility is None else f"soak_green_visibility_{visibility}s",
            seconds=seconds,
            pool="gevent",
            visibility_timeout_s=visibility or 3600,
            dispatches=len(sent),
            executions=verdict.executions,
            worker_kills=kills,
            lost_with_killed_workers=lost,
            holds_of_messages_in_unacked=in_unacked,
            overlaps=len(verdict.overlaps),
            fence_regressions=len(verdict.fence_regressions),
            keys_leaked=len(leaked),
            timeline={"per_second": per_second(runs(cenv), began, seconds), "kills": killed_at,
                      "stuck_unacked": stuck},
        )  # fmt: skip
        assert verdict.ok, verdict.summary()
        assert leaked == [], leaked_as
        assert kills >= 1
