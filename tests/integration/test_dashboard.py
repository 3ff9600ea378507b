"""The shipped Grafana dashboard's every query, run on a real Prometheus that scraped a real
prefork worker and a producer through a short run of real calls; its answers drawn as the
docs' figure of the dashboard (docs/img/dashboard.svg, ``dev.py screenshot``)."""

from __future__ import annotations

import math
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from benchmarks.charts import Line, panels
from celery_singleton_lock import DuplicateTaskError
from celery_singleton_lock.contrib import limits, metrics
from celery_singleton_lock.lease import LockKeys

from ..conftest import CeleryEnv
from ..support.dashboard import points, targets
from ..support.prometheus import PROMETHEUS, SCRAPE_INTERVAL, Prometheus
from ..support.runs import UNTIL_OPENED, dropped, open_gate, started, wait_for
from ..support.servers import free_port
from ..support.workers import Worker

APP = "tests.support.celery_app."  # the test tasks' name prefix, cut from the legends

pytestmark = [
    pytest.mark.slow,
    pytest.mark.oneoff,  # Prometheus's server is fetched for the one-offs (dev.py ci)
    pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus: dev.py ci fetches Debian's"),
]

# What each query must show after the run below: "rises" (a value above 0 somewhere), or
# "shows" (a number somewhere): a rate's budget left is rightly 0 after a burst, and its
# next slot less than 0 once it has passed. Every panel must show the run's data.
MUST = {
    ("Dispatches by outcome", "A"): "rises",
    ("Contentions at execution by decision", "A"): "rises",
    ("Running leases", "A"): "rises",
    ("Running leases held now", "A"): "rises",
    ("Time to the running lease (p50, p95)", "A"): "rises",
    ("Time to the running lease (p50, p95)", "B"): "rises",
    ("Time the lease was held (p50, p95)", "A"): "rises",
    ("Time the lease was held (p50, p95)", "B"): "rises",
    ("Time the lease was held (p50, p95)", "C"): "rises",
    ("Copies dropped and dead children's leases released", "A"): "rises",
    ("Copies dropped and dead children's leases released", "B"): "rises",
    ("Idempotency keys", "A"): "rises",
    ("Rates: deferrals and runs that may start now", "A"): "rises",
    ("Rates: deferrals and runs that may start now", "B"): "shows",
    ("Rates: next slot in", "A"): "shows",
    ("Limits changed at run time", "A"): "rises",
    ("Broker ride self-checks, each worker's at its start", "A"): "rises",
    ("Canvas members answered with their holder's outcome", "A"): "rises",
    ("Oldest running lease held: its age", "A"): "rises",
}


class Produced:
    """This process's metrics (a producer's: dispatches, idempotency repeats, limit
    changes), whichever registry they were installed in, for a scrape of their own."""

    def __init__(self) -> None:
        # Its own registry if first: the process's default one is left as it was.
        self.made = metrics.install(CollectorRegistry())

    def collect(self) -> Iterator[Any]:
        for metric in self.made.values():
            yield from metric.collect()


@pytest.fixture(name="served", scope="module")
def fixture_served(celery_env: CeleryEnv) -> Iterator[tuple[Worker, dict[str, str]]]:
    """A prefork worker serving its metrics, and this process's served beside it."""
    port = free_port()
    worker = Worker(celery_env.env, extra_env={"CSL_METRICS_PORT": str(port)}).start()
    registry = CollectorRegistry()
    registry.register(Produced())
    producer, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield (
            worker,
            {
                "worker": f"127.0.0.1:{port}",
                "producer": f"127.0.0.1:{producer.server_port}",
            },
        )
    finally:
        producer.shutdown()
        producer.server_close()
        worker.stop()


def test_every_panel_shows_a_real_prometheus_s_answers(
    cenv: CeleryEnv, served: tuple[Worker, dict[str, str]], tmp_path: Path
) -> None:
    """``python3 scripts/dev.py screenshot`` writes its figure into the docs
    (CSL_DASHBOARD_FIGURE)."""
    worker, scraped = served
    target = Path(os.environ.get("CSL_DASHBOARD_FIGURE") or tmp_path / "dashboard.svg")
    with Prometheus(scraped) as prometheus:
        began = time.time()
        prometheus.wait_scraped(began)
        # Twice, a scrape between: a counter's series first shows at 1, no increase to
        # rate(), and only its next count draws a rise (each panel's first-count caveat).
        for round_ in (1, 2):
            run_the_calls(cenv, worker, f"r{round_}", prometheus)
            prometheus.wait_scraped(time.time(), "a scrape after the calls")
        ended = time.time()
        # Scrapes 3 s past the end: the last steps' rate windows take in the last counts.
        prometheus.wait_scraped(ended + 3 * SCRAPE_INTERVAL)
        answers = ask_every_query(prometheus, began - 2, time.time())
    for (panel, ref), must in MUST.items():
        values = [v for _, __, ys in answers[(panel, ref)] for v in ys if not math.isnan(v)]
        assert values, f"{panel} ({ref}): no data"
        if must == "rises":
            assert max(values) > 0, f"{panel} ({ref}): never above 0"
    assert set(MUST) == set(answers)  # every query of the dashboard is asked above
    # The holder kept its lease a few scrapes long: its age climbed past 2 s.
    ages = answers[("Oldest running lease held: its age", "A")]
    assert max(v for _, __, ys in ages for v in ys if not math.isnan(v)) >= 2
    # A target's first change shows (its series' first sample is 1), counted once.
    changes = answers[("Limits changed at run time", "A")]
    assert sorted(label.rsplit(" ", 1)[1] for label, _, __ in changes) == ["pause", "reset"]
    assert all(values[-1] == 1 for _, __, values in changes)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(draw(answers))
    drawn = target.read_text()
    assert all(panel in drawn for panel, _ in MUST)


def run_the_calls(cenv: CeleryEnv, worker: Worker, tag: str, prometheus: Prometheus) -> None:
    """Accepted calls and refused duplicates, a contended run, a copy dropped, a canvas
    member attached to a holder that keeps its lease a few seconds, a rate's deferrals,
    idempotency repeats, a limit changed (once) and a dead pool child's lease."""
    app, queue = cenv.app_module, worker.queue
    first = app.work.apply_async((f"d-{tag}", 0.6), queue=queue)
    for _ in range(2):
        assert app.work.apply_async((f"d-{tag}", 0.6), queue=queue).id == first.id  # refused
    plain = [app.work.apply_async((f"u{i}-{tag}",), queue=queue) for i in range(3)]
    assert first.get(timeout=30) == f"d-{tag}"
    assert [r.get(timeout=30) for r in plain] == [f"u{i}-{tag}" for i in range(3)]

    item = f"s-{tag}"
    holder = app.strict.apply_async((item, UNTIL_OPENED), queue=queue)
    wait_for(lambda: any(s["item"] == item for s in started(cenv)), 20, "strict started")
    with pytest.raises(DuplicateTaskError):  # contended, on_contention="fail"
        app.strict.apply_async((item,), queue=queue).get(timeout=30)
    app.app.send_task(app.strict.name, (item,), task_id=holder.id, queue=queue)
    wait_for(lambda: dropped(cenv, holder.id), 20, "copy dropped")
    open_gate(cenv, item)
    assert holder.get(timeout=30) == item

    # A canvas member (a call with a link) on a held key: attached, then answered.
    item = f"h-{tag}"
    holder = app.work.apply_async((item, UNTIL_OPENED), queue=queue)
    wait_for(lambda: any(s["item"] == item for s in started(cenv)), 20, "holder started")
    linked = app.work.apply_async((item,), queue=queue, link=app.follow.s("L").set(queue=queue))
    # Held a few scrapes long: the held lease and its age show as lines.
    prometheus.wait_scraped(time.time() + 3, "scrapes while held")
    open_gate(cenv, item)
    assert holder.get(timeout=30) == item
    assert linked.get(timeout=30) == item

    rated = app.rated_pair  # 10/s: five at once wait for their slots (deferred)
    assert [r.get(timeout=30) for r in [rated.apply_async((f"mk-{tag}", n), queue=queue)
                                        for n in range(5)]] == list(range(5))  # fmt: skip

    key = f"dashboard-{tag}-{os.getpid()}"
    charged = app.charge.apply_async((f"c-{tag}",), idempotency_key=key, queue=queue)
    assert charged.get(timeout=30) == f"c-{tag}"
    for _ in range(2):
        assert app.charge.apply_async((f"c-{tag}",), idempotency_key=key, queue=queue).id == (
            charged.id
        )

    if tag == "r1":  # once: a target's first change is its series' first sample
        lock_name = rated.singleton_options().key.derive(("dashboard-limits",), {})
        limits.set(app.app, lock_name, paused=True)
        limits.set(app.app, lock_name, reset=True)

    app.work.apply_async((f"k-{tag}", 30.0), queue=queue)
    wait_for(lambda: any(s["item"] == f"k-{tag}" for s in started(cenv)), 20, "k started")
    [pid] = [s["pid"] for s in started(cenv) if s["item"] == f"k-{tag}"]
    os.kill(pid, signal.SIGKILL)
    name = app.work.singleton_options().key.derive((f"k-{tag}",), {})
    lock = LockKeys.build("t", name).lock
    wait_for(lambda: not cenv.lock_client().exists(lock), 10, "dead child release")


def ask_every_query(prometheus: Prometheus, start: float, end: float) -> dict[Any, list[Line]]:
    """Each panel query's answer over the run, as Grafana asks for it (one point a
    second), each series with its legend."""
    answers: dict[Any, list[Line]] = {}
    for asked in targets():
        expr = asked.asked(interval=SCRAPE_INTERVAL, scrape=SCRAPE_INTERVAL, range_s=end - start)
        lines = []
        for series in prometheus.query_range(expr, start, end, SCRAPE_INTERVAL):
            times, values = points(series["values"], SCRAPE_INTERVAL)
            lines.append((asked.label(series["metric"], APP), times, values))
        answers[(asked.panel, asked.ref)] = sorted(lines)
    return answers


def draw(answers: dict[Any, list[Line]]) -> str:
    """The panels in the dashboard's order, each with its queries' lines over the seconds
    from the first answer; a line at 0 throughout is left out (every task of the test
    app has its series from the worker's start), and a lock name's hash cut short."""
    start = min(t for lines in answers.values() for _, times, __ in lines for t in times)
    shown: dict[str, tuple[str, list[Line]]] = {}
    units = {t.panel: t.unit for t in targets()}
    for (panel, _), lines in answers.items():
        drawn = shown.setdefault(panel, (units[panel], []))[1]
        for label, times, values in lines:
            if any(v != 0 for v in values if not math.isnan(v)):
                short = re.sub(r"\b([0-9a-f]{8})[0-9a-f]{24,}\b", r"\1…", label)
                drawn.append((short, [t - start for t in times], values))
    return panels(
        "celery-singleton-lock's Grafana dashboard: its queries answered by a real Prometheus",
        [(panel, unit, lines) for panel, (unit, lines) in shown.items()],
        empty="0 throughout",
    )
