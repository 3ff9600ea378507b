"""Prometheus metrics from the library's signals (the extra: ``celery-singleton-lock[prometheus]``).

In a producer (a web process) call ``install()`` once: the figures join the process's default
registry. In a worker set ``singleton_lock_metrics_port``: its main process serves them, its
pool children's included. Each is labelled by task name (docs/operations.md lists them).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import types
from typing import TYPE_CHECKING, Union

from ..exceptions import ConfigurationError
from ..signals import (
    attached_answered,
    call_attached,
    copy_dropped,
    dead_child_released,
    dispatch_accepted,
    duplicate_refused,
    execution_contended,
    idempotent_repeat,
    idempotent_replayed,
    lease_acquired,
    lease_lost,
    lease_released,
    limits_changed,
    rate_asked,
)

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
_guard = threading.Lock()
if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_Metric = Union["Counter", "Histogram", "Gauge"]
_counters: dict[str, Counter] = {}
_histograms: dict[str, Histogram] = {}
_gauges: dict[str, Gauge] = {}
_installed: dict[str, _Metric] = {}


def _prometheus() -> types.ModuleType:
    try:
        import prometheus_client  # noqa: PLC0415  (an optional extra)
    except ImportError:
        raise ConfigurationError(
            "metrics need prometheus_client: pip install 'celery-singleton-lock[prometheus]'"
        ) from None
    return prometheus_client


def install(registry: CollectorRegistry | None = None) -> dict[str, _Metric]:
    """Create the metrics (once per process) and count the library's signals into them.

    In a producer, the default registry is the one your existing ``/metrics`` endpoint
    serves."""
    with _guard:
        if _installed:
            return _installed
        prom = _prometheus()
        kwargs = {} if registry is None else {"registry": registry}

        def counter(name: str, text: str, *labels: str) -> Counter:
            made: Counter = prom.Counter(name, text, ["task", *labels], **kwargs)
            return made

        def histogram(name: str, text: str) -> Histogram:
            made: Histogram = prom.Histogram(name, text, ["task"], buckets=BUCKETS, **kwargs)
            return made

        _counters.update(
            dispatches=counter("celery_singleton_lock_dispatches", "Dispatches", "outcome"),
            contentions=counter(
                "celery_singleton_lock_contentions", "Executions contended", "decision"
            ),
            leases=counter("celery_singleton_lock_leases", "Running leases", "event"),
            # Redeliveries and same-id send_task calls of a holder's message, dropped
            # without a result.
            copies=counter(
                "celery_singleton_lock_copies_dropped", "Copies of a holder's message dropped"
            ),
            dead=counter(
                "celery_singleton_lock_dead_child_releases", "Leases of dead children released"
            ),
            # Canvas members attached to their key's holder, ended with its outcome.
            answered=counter(
                "celery_singleton_lock_attached_answered",
                "Attached calls answered with their holder's outcome",
                "state",
            ),
            idempotent=counter(
                "celery_singleton_lock_idempotent",
                "Calls answered by an idempotency key's first call",
                "outcome",
            ),
        )
        _histograms.update(
            wait=histogram("celery_singleton_lock_wait_seconds", "Time to the running lease"),
            hold=histogram("celery_singleton_lock_hold_seconds", "Time the lease was held"),
        )
        # limits.set in this process (a rate, a limit, a pause, a resume, a reset):
        # labelled by what the change applies to, not by task.
        _counters["limits"] = prom.Counter(
            "celery_singleton_lock_limit_changes",
            "Limits changed at run time",
            ["target", "change"],
            **kwargs,
        )
        _counters["deferrals"] = counter(
            "celery_singleton_lock_rate_deferrals", "Runs deferred to a later slot of a rate"
        )
        for short, name, text in (
            ("remaining", "celery_singleton_lock_rate_remaining", "Runs that may start now"),
            (
                "next_slot",
                "celery_singleton_lock_rate_next_slot_timestamp_seconds",
                "When the next run may start",
            ),
        ):
            # The most recent answer wins across a worker's pool children.
            _gauges[short] = prom.Gauge(
                name, text, ["task", "key"], multiprocess_mode="mostrecent", **kwargs
            )
        _installed.update(_counters)
        _installed.update(_histograms)
        _installed.update(_gauges)
        for signal, receiver in _RECEIVERS:
            signal.connect(receiver, weak=False)
        return _installed


def _task(sender: object) -> str:
    return str(getattr(sender, "name", None) or "unknown")


def _accepted(sender: object = None, **_: object) -> None:
    _counters["dispatches"].labels(_task(sender), "accepted").inc()


def _refused(sender: object = None, **_: object) -> None:
    _counters["dispatches"].labels(_task(sender), "refused").inc()


def _contended(sender: object = None, decision: object = None, **_: object) -> None:
    kind = type(decision).__name__.lower() if decision is not None else "unknown"
    _counters["contentions"].labels(_task(sender), kind).inc()


def _acquired(sender: object = None, waited: float = 0.0, **_: object) -> None:
    _counters["leases"].labels(_task(sender), "acquired").inc()
    _histograms["wait"].labels(_task(sender)).observe(waited)


def _released(sender: object = None, held: float = 0.0, **_: object) -> None:
    _counters["leases"].labels(_task(sender), "released").inc()
    _histograms["hold"].labels(_task(sender)).observe(held)


def _lost(sender: object = None, **_: object) -> None:
    _counters["leases"].labels(_task(sender), "lost").inc()


def _copy(sender: object = None, **_: object) -> None:
    _counters["copies"].labels(_task(sender)).inc()


def _dead(sender: object = None, **_: object) -> None:
    _counters["dead"].labels(_task(sender)).inc()


def _attached(sender: object = None, **_: object) -> None:
    _counters["dispatches"].labels(_task(sender), "attached").inc()


def _answered(sender: object = None, state: object = None, **_: object) -> None:
    _counters["answered"].labels(_task(sender), str(state)).inc()


def _repeat(sender: object = None, **_: object) -> None:
    _counters["idempotent"].labels(_task(sender), "repeat").inc()


def _replayed(sender: object = None, **_: object) -> None:
    _counters["idempotent"].labels(_task(sender), "replayed").inc()


def _rate(
    sender: object = None,
    name: str = "",
    deferred: bool = False,
    remaining: int = 0,
    next_slot: float = 0.0,
    **_: object,
) -> None:
    task = _task(sender)
    if deferred:
        _counters["deferrals"].labels(task).inc()
    _gauges["remaining"].labels(task, name).set(remaining)
    _gauges["next_slot"].labels(task, name).set(next_slot)


def _limits(name: str = "", change: str = "", **_: object) -> None:
    _counters["limits"].labels(name, change).inc()


_RECEIVERS = (
    (dispatch_accepted, _accepted),
    (duplicate_refused, _refused),
    (call_attached, _attached),
    (attached_answered, _answered),
    (execution_contended, _contended),
    (lease_acquired, _acquired),
    (lease_released, _released),
    (lease_lost, _lost),
    (copy_dropped, _copy),
    (dead_child_released, _dead),
    (idempotent_repeat, _repeat),
    (idempotent_replayed, _replayed),
    (rate_asked, _rate),
    (limits_changed, _limits),
)


def serve_worker(port: object, addr: object = "127.0.0.1") -> int:
    """In a worker's main process, before its pool starts: count into Prometheus's
    multiprocess files (the children inherit the mode) and serve them all on ``port``.
    The files go in a directory made for the worker unless ``PROMETHEUS_MULTIPROC_DIR``
    names one.

    Returns the port served (a free one when ``port`` is 0).
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigurationError(f"singleton_lock_metrics_port must be a port number, got {port!r}")
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        if "prometheus_client" in sys.modules:
            # Its value class is chosen at import: too late to switch to multiprocess mode.
            raise ConfigurationError(
                "prometheus_client was imported before the worker started its metrics: set "
                "PROMETHEUS_MULTIPROC_DIR to an empty directory in the worker's environment"
            )
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="csl-metrics-")
    prom = _prometheus()
    from prometheus_client import multiprocess  # noqa: PLC0415  (after the mode is set)

    install()
    registry = prom.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    server, _ = prom.start_http_server(port, addr=str(addr), registry=registry)
    served: int = server.server_port
    return served
