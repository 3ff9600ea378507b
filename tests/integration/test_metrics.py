"""Prometheus metrics scraped from a real prefork worker's endpoint after a run with known
counts, and a producer's own registry; the running leases a worker's children hold now."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from celery_singleton_lock import DuplicateTaskError
from celery_singleton_lock.contrib import metrics

from ..conftest import CeleryEnv
from ..support.runs import UNTIL_OPENED, dropped, open_gate, started, wait_for
from ..support.servers import free_port
from ..support.workers import Worker

APP = "tests.support.celery_app"  # the test app's module: its tasks' name prefix

pytestmark = pytest.mark.slow


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(name="metrics_worker", scope="module")
def fixture_metrics_worker(celery_env: CeleryEnv) -> Iterator[tuple[Worker, int]]:
    port = free_port()
    worker = Worker(celery_env.env, extra_env={"CSL_METRICS_PORT": str(port)}).start()
    try:
        yield worker, port
    finally:
        worker.stop()


def test_a_worker_serves_its_childrens_figures_and_a_producer_counts_its_own(
    cenv: CeleryEnv, metrics_worker: tuple[Worker, int]
) -> None:
    worker, port = metrics_worker
    # This process's metrics: installed once, here or by an earlier test on its registry.
    produced = metrics.install(CollectorRegistry())
    app = cenv.app_module
    queue = worker.queue
    before = samples(_exposition(produced))

    first = app.work.apply_async(("m1", 1.0), queue=queue)
    for _ in range(2):
        assert app.work.apply_async(("m1", 1.0), queue=queue).id == first.id  # refused
    plain = [app.work.apply_async((f"u{i}",), queue=queue) for i in range(4)]
    assert first.get(timeout=30) == "m1"
    assert [r.get(timeout=30) for r in plain] == [f"u{i}" for i in range(4)]
    holder = app.strict.apply_async(("s", UNTIL_OPENED), queue=queue)
    wait_for(lambda: any(s["item"] == "s" for s in started(cenv)), 20, "strict started")
    with pytest.raises(DuplicateTaskError):
        app.strict.apply_async(("s",), queue=queue).get(timeout=30)
    # A copy of the holder's own message (its task id): dropped, and counted.
    app.app.send_task(app.strict.name, ("s",), task_id=holder.id, queue=queue)
    wait_for(lambda: dropped(cenv, holder.id), 20, "copy dropped")
    open_gate(cenv, "s")
    assert holder.get(timeout=30) == "s"
    app.work.apply_async(("k", 30.0), queue=queue)
    wait_for(lambda: any(s["item"] == "k" for s in started(cenv)), 20, "k started")
    [pid] = [s["pid"] for s in started(cenv) if s["item"] == "k"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not cenv.lock_client().exists(*_keys(app, "k")), 10, "dead child release")

    after = samples(_exposition(produced))
    work = f"{APP}.work"
    delta = {
        outcome: value(after, "celery_singleton_lock_dispatches_total", task=work, outcome=outcome)
        - value(before, "celery_singleton_lock_dispatches_total", task=work, outcome=outcome)
        for outcome in ("accepted", "refused")
    }
    assert delta == {"accepted": 6, "refused": 2}  # m1, u0-u3, k; two m1 duplicates
    assert produced is metrics.install()  # once per process

    scraped = samples(
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    )
    leases = {
        (task, event): value(scraped, "celery_singleton_lock_leases_total", task=task, event=event)
        for task in (work, f"{APP}.strict")
        for event in ("acquired", "released", "lost")
    }
    assert leases == {
        (work, "acquired"): 6, (work, "released"): 5, (work, "lost"): 0,  # k was killed
        (f"{APP}.strict", "acquired"): 1, (f"{APP}.strict", "released"): 1,
        (f"{APP}.strict", "lost"): 0,
    }  # fmt: skip
    assert value(
        scraped, "celery_singleton_lock_contentions_total",
        task=f"{APP}.strict", decision="fail",
    ) == 1  # fmt: skip
    assert value(scraped, "celery_singleton_lock_dead_child_releases_total", task=work) == 1
    assert (
        value(
            scraped,
            "celery_singleton_lock_copies_dropped_total",
            task=f"{APP}.strict",
        )
        == 1
    )
    assert value(scraped, "celery_singleton_lock_hold_seconds_count", task=work) == 5
    assert value(scraped, "celery_singleton_lock_wait_seconds_count", task=work) == 6
    # The 1 s task held its lease at least that long: its observation is above 0.5 s.
    assert value(scraped, "celery_singleton_lock_hold_seconds_bucket", task=work, le="0.5") == 4
    assert "celery-singleton-lock metrics on http://127.0.0.1:" in worker.output()
    # The broker ride's self-check as the worker started: counted, passed.
    assert value(scraped, "celery_singleton_lock_ride_checks_total", outcome="passed") == 1


def test_a_rate_shows_each_keys_budget_and_next_slot(
    cenv: CeleryEnv, metrics_worker: tuple[Worker, int]
) -> None:
    worker, port = metrics_worker
    rated = cenv.app_module.rated_pair  # 10/s: a slot 0.1 s away is sent round to, not waited for
    results = [rated.apply_async(("mk", n), queue=worker.queue) for n in range(5)]
    assert [r.get(timeout=30) for r in results] == list(range(5))
    scraped = samples(
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    )
    task, key = rated.name, rated.singleton_options().key.derive(("mk",), {})
    deferred = value(scraped, "celery_singleton_lock_rate_deferrals_total", task=task)
    assert deferred >= 1  # all five reached the worker at once: some waited for a slot
    assert value(scraped, "celery_singleton_lock_rate_remaining", task=task, key=key) == 0
    next_slot = value(
        scraped, "celery_singleton_lock_rate_next_slot_timestamp_seconds", task=task, key=key
    )
    slots = sorted(json.loads(r)["slot"] for r in cenv.checker_client().lrange("rated", 0, -1))
    assert next_slot == pytest.approx(slots[-1] + 0.1, abs=0.01)  # the one after the last run


def _exposition(made: dict[str, Any]) -> str:
    """What this process's metrics expose, whichever registry they were installed on."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    for metric in made.values():
        registry.register(metric)
    return generate_latest(registry).decode()


def _keys(app: Any, item: str) -> list[str]:
    from celery_singleton_lock.lease import LockKeys

    return [LockKeys.build("t", app.work.singleton_options().key.derive((item,), {})).lock]


def test_a_metrics_port_in_use_stops_the_worker_with_one_line(celery_env: CeleryEnv) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = Worker(celery_env.env, extra_env={"CSL_METRICS_PORT": str(port)})
        with pytest.raises(RuntimeError, match="worker exited") as failed:
            worker.start()
    assert "celery-singleton-lock: metrics: [Errno 98] Address already in use" in str(failed.value)
    assert "Traceback" not in str(failed.value)


def test_idempotency_repeats_and_replays_are_counted(
    cenv: CeleryEnv, metrics_worker: tuple[Worker, int]
) -> None:
    worker, port = metrics_worker
    counter = metrics.install(CollectorRegistry())["idempotent"]  # this process's, once

    def counted(outcome: str) -> float:
        return sum(
            sample.value
            for family in counter.collect()
            for sample in family.samples
            if sample.name.endswith("_total")
            and sample.labels == {"task": f"{APP}.charge", "outcome": outcome}
        )

    charge = cenv.app_module.charge
    before = counted("repeat")
    key = f"metrics-{os.getpid()}-{port}"
    first = charge.apply_async(("mi",), idempotency_key=key, queue=worker.queue)
    assert first.get(timeout=30) == "mi"
    for _ in range(3):
        assert charge.apply_async(("mi",), idempotency_key=key, queue=worker.queue).id == first.id
    assert counted("repeat") - before == 3
    # A copy sent around the dispatch: answered in the worker without running.
    copy = charge.app.send_task(
        charge.name, ("mi",), headers={"Idempotency-Key": key}, queue=worker.queue
    )
    assert copy.get(timeout=30) == "mi"
    scraped = samples(
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    )
    replayed = value(
        scraped, "celery_singleton_lock_idempotent_total", task=f"{APP}.charge", outcome="replayed"
    )
    assert replayed == 1


def _scrape(port: int) -> dict[Any, float]:
    return samples(
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    )


HELD = "celery_singleton_lock_leases_held"
OLDEST = "celery_singleton_lock_oldest_lease_timestamp_seconds"


def test_a_held_lease_shows_while_its_run_holds_it_and_not_after(
    cenv: CeleryEnv, metrics_worker: tuple[Worker, int]
) -> None:
    worker, port = metrics_worker
    app, queue = cenv.app_module, worker.queue
    strict, work = f"{APP}.strict", f"{APP}.work"
    # A task this module never calls: its series are there, at 0, from the worker's start.
    first = _scrape(port)
    never = f"{APP}.patient"
    shown = {
        ("celery_singleton_lock_leases_total", (("event", "lost"), ("task", never))): 0.0,
        ("celery_singleton_lock_dispatches_total", (("outcome", "refused"), ("task", never))): 0.0,
        (HELD, (("task", never),)): 0.0,
        (OLDEST, (("task", never),)): math.inf,
        ("celery_singleton_lock_ride_checks_total", (("outcome", "off"),)): 0.0,
    }
    assert {series: first.get(series) for series in shown} == shown

    sent = time.time()
    holder = app.strict.apply_async(("held", UNTIL_OPENED), queue=queue)
    wait_for(lambda: any(s["item"] == "held" for s in started(cenv)), 20, "held started")
    during = _scrape(port)
    assert value(during, HELD, task=strict) == 1
    assert sent - 1 <= value(during, OLDEST, task=strict) <= time.time()
    open_gate(cenv, "held")
    assert holder.get(timeout=30) == "held"
    wait_for(lambda: value(_scrape(port), HELD, task=strict) == 0, 10, "strict let go")
    assert value(_scrape(port), OLDEST, task=strict) == math.inf

    # A retry's message takes the lease over: the first run no longer holds it.
    before = value(
        _scrape(port), "celery_singleton_lock_leases_total", task=work, event="handed_over"
    )
    assert app.work.apply_async(("again", 0.0, "retry"), queue=queue).get(timeout=30) == "again"
    # (its result may be read before its run's end is counted: the release rides its write)
    wait_for(lambda: value(_scrape(port), HELD, task=work) == 0, 10, "the retry let go")
    ended = _scrape(port)
    handed = value(ended, "celery_singleton_lock_leases_total", task=work, event="handed_over")
    assert handed - before == 1

    # A pool child killed while it holds one says nothing: the worker drops what it showed.
    app.work.apply_async(("killed", 30.0), queue=queue)
    wait_for(lambda: any(s["item"] == "killed" for s in started(cenv)), 20, "killed started")
    assert value(_scrape(port), HELD, task=work) == 1
    [pid] = [s["pid"] for s in started(cenv) if s["item"] == "killed"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: value(_scrape(port), HELD, task=work) == 0, 20, "the dead child's dropped")
    assert value(_scrape(port), OLDEST, task=work) == math.inf


def test_a_run_waiting_its_turn_of_a_total_is_counted_from_0(cenv: CeleryEnv) -> None:
    """Kept in its key's line (no event of Celery's, its delivery ended): a contention
    ``waiting_turn``, its series at 0 before, in the worker's own scrape."""
    app, tag, port = cenv.app_module, str(time.monotonic_ns()), free_port()
    blocker, turn, task = f"mg-{tag}", f"mt-{tag}", f"{APP}.export_fair"
    worker = Worker(cenv.env, concurrency=4, extra_env={"CSL_METRICS_PORT": str(port)}).start()
    try:
        counted = "celery_singleton_lock_contentions_total"
        series = (counted, (("decision", "waiting_turn"), ("task", task)))
        assert wait_for(lambda: _scrape(port), 20, "the first scrape").get(series) == 0
        gated = [
            app.export_fair.apply_async((blocker, UNTIL_OPENED), queue=worker.queue)
            for _ in range(2)
        ]
        wait_for(
            lambda: sum(s["item"] == blocker for s in started(cenv)) == 2, 30, "the total full"
        )
        waiting = app.export_fair.apply_async((turn, 0.1), queue=worker.queue)
        wait_for(lambda: _scrape(port).get(series) == 1, 20, "the wait for its turn counted")
        for _ in gated:  # one gate opening per run it holds
            open_gate(cenv, blocker)
        assert waiting.get(timeout=30) == turn
        assert [each.get(timeout=30) for each in gated] == [blocker, blocker]
        assert _scrape(port).get(series) == 1  # its turn came: sent, not counted again
    except BaseException:
        print(worker.output()[-6000:])
        raise
    finally:
        worker.stop()
