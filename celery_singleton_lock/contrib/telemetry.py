"""The library's metrics through OpenTelemetry's metrics API, with the Prometheus ones' names.

Call ``install()`` once where you set your ``MeterProvider`` (a worker: in
``worker_process_init``): each of ``metrics.METRICS`` becomes an instrument of the meter
``celery_singleton_lock``, its labels attributes. Beside ``metrics.install()``, or alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigurationError
from .metrics import BUCKETS, METRICS, Backend, Metric, add_backend

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

METER = "celery_singleton_lock"


class _Instrument:
    """One of ``METRICS`` as an OpenTelemetry instrument, labelled as Prometheus's are."""

    def __init__(self, metric: Metric, instrument: Any) -> None:
        self.metric = metric
        self.instrument = instrument

    def labels(self, *values: str) -> _Point:
        return _Point(self.instrument, dict(zip(self.metric.labels, values, strict=True)))


class _Point:
    def __init__(self, instrument: Any, attributes: dict[str, str]) -> None:
        self.instrument = instrument
        self.attributes = attributes

    def inc(self, amount: float = 1) -> None:
        self.instrument.add(amount, self.attributes)

    def observe(self, amount: float) -> None:
        self.instrument.record(amount, self.attributes)

    def set(self, value: float) -> None:
        self.instrument.set(value, self.attributes)


def install(provider: MeterProvider | None = None) -> bool:
    """Count the library's signals into OpenTelemetry instruments (once per process),
    of ``provider``'s meter or the global one's. Returns whether they were made now."""
    try:
        from opentelemetry import metrics as otel  # noqa: PLC0415  (an optional extra)
    except ImportError:
        raise ConfigurationError(
            "OpenTelemetry metrics need opentelemetry-api: "
            "pip install 'celery-singleton-lock[otel]'"
        ) from None
    meter = (provider or otel.get_meter_provider()).get_meter(METER)
    made: dict[str, Backend] = {}
    for metric in METRICS:
        if metric.kind == "counter":
            instrument: Any = meter.create_counter(metric.name, description=metric.text)
        elif metric.kind == "histogram":
            instrument = meter.create_histogram(
                metric.name,
                unit="s",
                description=metric.text,
                explicit_bucket_boundaries_advisory=list(BUCKETS),
            )
        else:
            instrument = meter.create_gauge(metric.name, description=metric.text)
        made[metric.short] = _Instrument(metric, instrument)
    return add_backend("opentelemetry", made)
