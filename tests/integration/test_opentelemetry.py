"""OpenTelemetry: the decisions as span events on the caller's span at dispatch (the SDK's
in-memory exporter, here) and on the run's span in a real worker (its spans exported to a
file); the metrics through the metrics API, named as the Prometheus ones."""

from __future__ import annotations

import re
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_singleton_lock import BackpressureError, DuplicateTaskError, RateLimitedError
from celery_singleton_lock.contrib import metrics, telemetry
from celery_singleton_lock.lease import LockKeys

from ..conftest import CeleryEnv
from ..support.monitors import Seen
from ..support.runs import UNTIL_OPENED, open_gate, started, wait_for
from ..support.spans import read_spans
from ..support.workers import Worker

pytestmark = pytest.mark.slow


@pytest.fixture(name="exported", scope="module")
def fixture_exported() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process: OpenTelemetry's rule
    return exporter


@pytest.fixture(name="tracing_worker", scope="module")
def fixture_tracing_worker(celery_env: CeleryEnv) -> Iterator[tuple[Worker, str]]:
    path = str(Path(tempfile.mkdtemp(prefix="csl-spans-")) / "spans.jsonl")
    worker = Worker(celery_env.env, extra_env={"CSL_OTEL_SPANS": path}).start()
    try:
        yield worker, path
    finally:
        worker.stop()


def test_a_refusal_is_an_event_on_the_callers_span(
    cenv: CeleryEnv, worker: Worker, exported: InMemorySpanExporter
) -> None:
    work = cenv.app_module.work
    tracer = trace.get_tracer("tests")
    first = work.apply_async(("ot", 0.5), queue=worker.queue)
    with tracer.start_as_current_span("POST /reports"):
        assert work.apply_async(("ot", 0.5), queue=worker.queue).id == first.id
    first.get(timeout=30)
    [span] = [s for s in exported.get_finished_spans() if s.name == "POST /reports"]
    [event] = span.events
    assert event.name == "singleton.refused"
    attributes = dict(event.attributes or {})
    key = work.singleton_options().key.derive(("ot",), {})
    assert attributes["singleton.key"] == key
    assert attributes["singleton.holder_id"] == first.id
    assert attributes["singleton.reason"] == f"refused at dispatch: {key!r} is held by {first.id}"
    assert set(attributes) == documented("singleton.refused")


def documented(event: str) -> set[str]:
    """The attributes docs/operations.md's trace shows on ``event``."""
    page = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    [line] = [line for line in page.splitlines() if f"event {event} " in line]
    return set(re.findall(r"(singleton\.[a-z_]+)=", line))


def test_a_rates_deferral_and_refusal_at_dispatch_are_events_on_the_callers_span(
    cenv: CeleryEnv, worker: Worker, exported: InMemorySpanExporter
) -> None:
    app, tracer = cenv.app_module, trace.get_tracer("tests")
    slow, checked = app.delayed_slowly, app.rate_checked
    first = slow.apply_async(("ot-dl", 1), queue=worker.queue)
    with tracer.start_as_current_span("POST /slow"):
        later = slow.apply_async(("ot-dl", 2), queue=worker.queue)
    refused = 0
    with tracer.start_as_current_span("POST /checked"):
        for n in range(6):  # 10/s, two back to back: one of these is over it
            try:
                checked.apply_async(("ot-rl", n), queue=worker.queue)
            except RateLimitedError:
                refused += 1
                break
    assert refused == 1
    [span] = [s for s in exported.get_finished_spans() if s.name == "POST /slow"]
    [event] = span.events
    assert event.name == "singleton.deferred"
    attributes = dict(event.attributes or {})
    assert attributes["singleton.task_id"] == later.id
    assert attributes["singleton.key"] == slow.singleton_options().key.derive(("ot-dl",), {})
    assert 0 < float(attributes["singleton.delay"]) <= 2.5  # type: ignore[arg-type]
    [span] = [s for s in exported.get_finished_spans() if s.name == "POST /checked"]
    [event] = span.events
    assert event.name == "singleton.rate_limited"
    attributes = dict(event.attributes or {})
    assert attributes["singleton.key"] == checked.singleton_options().key.derive(("ot-rl",), {})
    assert float(attributes["singleton.retry_after"]) > 0  # type: ignore[arg-type]
    assert [first.get(timeout=30), later.get(timeout=30)] == [1, 2]


def _fill(cenv: CeleryEnv, item: str, parked: str) -> list[Any]:
    """``capped_delayed``'s 3 places of ``item`` taken by calls nobody consumes (the
    first's slot now, two deferred to theirs)."""
    capped = cenv.app_module.capped_delayed  # 1/m, "delay", at most 3 waiting
    return [capped.apply_async((item, n), queue=parked) for n in range(3)]


def test_max_pendings_refusal_is_an_event_on_the_callers_span(
    cenv: CeleryEnv, exported: InMemorySpanExporter
) -> None:
    capped, tracer = cenv.app_module.capped_delayed, trace.get_tracer("tests")
    tag = uuid.uuid4().hex[:6]
    item, parked = f"ot-bp-{tag}", f"parked-ot-{tag}"
    try:
        _fill(cenv, item, parked)
        with tracer.start_as_current_span("POST /capped"), pytest.raises(BackpressureError):
            capped.apply_async((item, 3), queue=parked, task_id=f"ot-bp-{tag}-refused")
    finally:
        cenv.broker.client().delete(parked)
    [span] = [s for s in exported.get_finished_spans() if s.name == "POST /capped"]
    [event] = span.events
    assert event.name == "singleton.backpressured"
    attributes = dict(event.attributes or {})
    assert attributes["singleton.task_id"] == f"ot-bp-{tag}-refused"
    assert attributes["singleton.key"] == capped.singleton_options().key.derive((item,), {})
    assert (attributes["singleton.waiting"], attributes["singleton.cap"]) == (3, 3)
    assert float(attributes["singleton.retry_after"]) > 0  # type: ignore[arg-type]


def test_without_a_span_nothing_is_recorded(
    cenv: CeleryEnv, worker: Worker, exported: InMemorySpanExporter
) -> None:
    work = cenv.app_module.work
    exported.clear()
    first = work.apply_async(("ot-none", 0.2), queue=worker.queue)
    assert work.apply_async(("ot-none", 0.2), queue=worker.queue).id == first.id
    first.get(timeout=30)
    assert exported.get_finished_spans() == ()


def _run_span(spans: list[dict[str, Any]], task_id: str) -> dict[str, Any] | None:
    for span in spans:
        attributes = span.get("attributes", {})
        if span["name"].startswith("run/") and task_id in attributes.values():
            return span
    return None


def test_a_runs_span_has_its_fence_and_its_contention(
    cenv: CeleryEnv, tracing_worker: tuple[Worker, str]
) -> None:
    worker, path = tracing_worker
    strict = cenv.app_module.strict
    key = strict.singleton_options().key.derive(("ot-run",), {})
    holder = strict.apply_async(("ot-run", UNTIL_OPENED), queue=worker.queue)
    wait_for(lambda: any(s["item"] == "ot-run" for s in started(cenv)), 20, "holder started")
    contended = strict.apply_async(("ot-run",), queue=worker.queue)
    with pytest.raises(DuplicateTaskError):
        contended.get(timeout=30)
    open_gate(cenv, "ot-run")
    holder.get(timeout=30)

    ran = wait_for(lambda: _run_span(read_spans(path), holder.id), 20, "the holder's span")
    assert ran["attributes"]["singleton.key"] == key
    assert isinstance(ran["attributes"]["singleton.fence"], int)
    assert ran["events"] == []
    refused = wait_for(lambda: _run_span(read_spans(path), contended.id), 20, "its span")
    # Besides the instrumentation's own (the failure's exception event).
    [event] = [e for e in refused["events"] if e["name"].startswith("singleton.")]
    assert event["name"] == "singleton.contended"
    assert event["attributes"]["singleton.key"] == key
    assert event["attributes"]["singleton.holder_id"] == holder.id
    assert event["attributes"]["singleton.then"] == "fail"
    assert set(event["attributes"]) == documented("singleton.contended")
    assert "singleton.fence" not in refused["attributes"]  # it never took the lease


def test_a_lease_lost_while_the_run_goes_on_is_an_event_on_its_span(cenv: CeleryEnv) -> None:
    # Renewal (every third of the short ttl) finds the lease gone, in its own thread: the
    # span event still lands on the run's span. Task events tell the test when.
    path = str(Path(tempfile.mkdtemp(prefix="csl-spans-")) / "spans.jsonl")
    extra = {"CSL_OTEL_SPANS": path, "CSL_TASK_EVENTS": "1", "CSL_TTL": "3"}
    strict = cenv.app_module.strict
    key = strict.singleton_options().key.derive(("ot-lost",), {})
    worker = Worker(cenv.env, extra_env=extra).start()
    try:
        with Seen(cenv.app_module.app) as seen:
            holder = strict.apply_async(("ot-lost", UNTIL_OPENED), queue=worker.queue)
            wait_for(lambda: any(s["item"] == "ot-lost" for s in started(cenv)), 20, "started")
            cenv.lock_client().delete(LockKeys.build("t", key).lock)  # (the test app's prefix)
            seen.wait("singleton-lease-lost", uuid=holder.id)
        open_gate(cenv, "ot-lost")
        holder.get(timeout=30, propagate=False)
        ran = wait_for(lambda: _run_span(read_spans(path), holder.id), 20, "the holder's span")
    finally:
        worker.stop()
    [event] = [e for e in ran["events"] if e["name"].startswith("singleton.")]
    assert event["name"] == "singleton.lease_lost"
    assert event["attributes"]["singleton.key"] == key
    assert event["attributes"]["singleton.fence"] == ran["attributes"]["singleton.fence"]


def _points(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[Any, ...]], Any]:
    """Each data point of the library's meter, by its metric's name and its attributes."""
    data = reader.get_metrics_data()
    assert data is not None
    return {
        (metric.name, tuple(sorted(dict(point.attributes or {}).items()))): point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        if scope.scope.name == telemetry.METER
        for metric in scope.metrics
        for point in metric.data.data_points
    }


def test_the_metrics_go_through_opentelemetry_with_the_prometheus_names(
    cenv: CeleryEnv, worker: Worker
) -> None:
    reader = InMemoryMetricReader()
    assert telemetry.install(MeterProvider(metric_readers=[reader]))
    work = cenv.app_module.work
    first = work.apply_async(("ot-m", 0.2), queue=worker.queue)
    for _ in range(2):
        assert work.apply_async(("ot-m", 0.2), queue=worker.queue).id == first.id
    first.get(timeout=30)
    found = _points(reader)
    labels = (("outcome", "refused"), ("task", work.name))
    assert found["celery_singleton_lock_dispatches", labels].value == 2
    accepted = (("outcome", "accepted"), ("task", work.name))
    assert found["celery_singleton_lock_dispatches", accepted].value == 1
    made = {name for name, _ in found}
    assert made <= {metric.name for metric in metrics.METRICS}
    # The calls held back: max_pending's refusal and a rate's deferrals at dispatch
    # counted; a turn's and a pause's there at 0 before any.
    capped, tag = cenv.app_module.capped_delayed, uuid.uuid4().hex[:6]
    item, parked = f"ot-m-bp-{tag}", f"parked-otm-{tag}"
    try:
        _fill(cenv, item, parked)
        with pytest.raises(BackpressureError):
            capped.apply_async((item, 3), queue=parked)
    finally:
        cenv.broker.client().delete(parked)
    points = {at: point.value for at, point in _points(reader).items()}
    dispatches = "celery_singleton_lock_dispatches"
    assert points[dispatches, (("outcome", "backpressured"), ("task", capped.name))] == 1
    assert points[dispatches, (("outcome", "rate_limited"), ("task", capped.name))] == 0
    assert points["celery_singleton_lock_rate_deferrals", (("task", capped.name),)] == 2
    contentions = "celery_singleton_lock_contentions"
    for decision in ("waiting_turn", "paused"):
        assert points[contentions, (("decision", decision), ("task", capped.name))] == 0
    assert not telemetry.install()  # once per process
