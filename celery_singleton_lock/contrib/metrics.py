"""Prometheus metrics from the library's signals (the extra: ``celery-singleton-lock[prometheus]``).

In a producer (a web process) call ``install()`` once: the figures join the process's default
registry. In a worker set ``singleton_lock_metrics_port``: its main process serves them, its
pool children's included. Each is labelled by task name (docs/operations.md lists them).
"""

from __future__ import annotations

import threading
import time
import types
from typing import TYPE_CHECKING, Any, Protocol, Union

from celery.signals import worker_process_init

from ..exceptions import ConfigurationError
from ..signals import (
    attached_answered,
    call_attached,
    call_paused,
    copy_dropped,
    dead_child_released,
    dispatch_accepted,
    dispatch_backpressured,
    dispatch_deferred,
    dispatch_rate_limited,
    duplicate_refused,
    execution_contended,
    idempotent_repeat,
    idempotent_replayed,
    lease_acquired,
    lease_handed_over,
    lease_lost,
    lease_released,
    limits_changed,
    rate_asked,
    ride_checked,
    waiting_turn,
)
from .exported import BUCKETS, METRICS, Metric
from .leases_held import LeasesHeld

_guard = threading.Lock()
_adding = threading.Lock()
if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_Metric = Union["Counter", "Histogram", "Gauge"]


class _Labelled(Protocol):
    def inc(self, amount: float = 1) -> None: ...
    def observe(self, amount: float) -> None: ...
    def set(self, value: float) -> None: ...


class Backend(Protocol):
    """A metric as one exporter keeps it (Prometheus's own objects are one)."""

    def labels(self, *values: str) -> Any: ...


class _Fanout:
    """One metric counted into every exporter installed in this process."""

    def __init__(self) -> None:
        self.backends: list[Backend] = []

    def labels(self, *values: str) -> _Labelled:
        return _Children([backend.labels(*values) for backend in self.backends])


class _Children:
    def __init__(self, children: list[_Labelled]) -> None:
        self.children = children

    def inc(self, amount: float = 1) -> None:
        for child in self.children:
            child.inc(amount)

    def observe(self, amount: float) -> None:
        for child in self.children:
            child.observe(amount)

    def set(self, value: float) -> None:
        for child in self.children:
            child.set(value)


_metrics: dict[str, _Fanout] = {metric.short: _Fanout() for metric in METRICS}
_installed: dict[str, _Metric] = {}
_added: set[str] = set()
_held = LeasesHeld()
_known: set[str] = set()  # the singleton tasks bound in this process
# Each label value known before anything is counted, shown at 0 from the start: a series
# that first appears at 1 is no increase to Prometheus (``increase()``, ``rate()``).
# (``()``: the metric's one series, labelled by task alone.)
_AT_ZERO: dict[str, tuple[tuple[str, ...], ...]] = {
    "dispatches": (
        ("accepted",),
        ("refused",),
        ("rate_limited",),
        ("backpressured",),
        ("attached",),
    ),
    "leases": (("acquired",), ("released",), ("lost",), ("handed_over",)),
    # (the on_contention policies' names, as _contended labels them)
    "contentions": (("requeue",), ("wait",), ("skip",), ("fail",), ("waiting_turn",), ("paused",)),
    "deferrals": ((),),
    "copies": ((),),
    "dead": ((),),
    "answered": (("SUCCESS",), ("FAILURE",)),
    "idempotent": (("repeat",), ("replayed",)),
}
# What a worker's broker ride self-check may say (signals.ride_checked).
RIDE_OUTCOMES = ("passed", "off", "push-refused", "not-run")


def add_backend(what: str, backends: dict[str, Backend]) -> bool:
    """Count into ``backends`` (one per ``METRICS`` entry, by short name) too, once per
    ``what`` per process; the receivers are connected with the first. Returns whether
    they were added now."""
    with _adding:
        if what in _added:
            return False
        _added.add(what)
        for short, backend in backends.items():
            _metrics[short].backends.append(backend)
        if len(_added) == 1:
            for signal, receiver in _RECEIVERS:
                signal.connect(receiver, weak=False)
        for task in sorted(_known):
            _show(task)
        return True


def known(task: str) -> None:
    """A singleton task bound in this process (``SingletonTask.on_bound``): its series
    are shown from now on, at 0 where nothing was counted yet."""
    with _adding:
        if task in _known:
            return
        _known.add(task)
        if _added:
            _show(task)


def _show(task: str) -> None:
    for short, values in _AT_ZERO.items():
        for value in values:
            _metrics[short].labels(task, *value).inc(0)
    _gauges(task, *_held.figures(task))


def _child_started(**_: object) -> None:
    # A forked child's first touch of a metric writes each value it has at 0 in its own
    # files (prometheus_client's multiprocess mode): "none held" is +Inf again at once.
    for task in sorted(_known):
        _gauges(task, *_held.figures(task))


def _gauges(task: str, count: int, oldest: float) -> None:
    _metrics["held"].labels(task).set(count)
    _metrics["oldest"].labels(task).set(oldest)


def prometheus() -> types.ModuleType:
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
        prom = prometheus()
        kwargs = {} if registry is None else {"registry": registry}
        for metric in METRICS:
            if metric.kind == "counter":
                made = prom.Counter(metric.name, metric.text, list(metric.labels), **kwargs)
            elif metric.kind == "histogram":
                made = prom.Histogram(
                    metric.name, metric.text, list(metric.labels), buckets=BUCKETS, **kwargs
                )
            else:
                made = prom.Gauge(
                    metric.name,
                    metric.text,
                    list(metric.labels),
                    multiprocess_mode=metric.across,
                    **kwargs,
                )
            _installed[metric.short] = made
        add_backend("prometheus", dict(_installed))
        return _installed


def _task(sender: object) -> str:
    return str(getattr(sender, "name", None) or "unknown")


def _accepted(sender: object = None, **_: object) -> None:
    _metrics["dispatches"].labels(_task(sender), "accepted").inc()


def _refused(sender: object = None, **_: object) -> None:
    _metrics["dispatches"].labels(_task(sender), "refused").inc()


def _rate_limited(sender: object = None, **_: object) -> None:
    _metrics["dispatches"].labels(_task(sender), "rate_limited").inc()


def _backpressured(sender: object = None, **_: object) -> None:
    _metrics["dispatches"].labels(_task(sender), "backpressured").inc()


def _dispatch_deferred(sender: object = None, **_: object) -> None:
    # The same deferral a run's is (one ``singleton-deferred``): its run then starts on its
    # slot without another.
    _metrics["deferrals"].labels(_task(sender)).inc()


def _waiting_turn(sender: object = None, **_: object) -> None:
    _metrics["contentions"].labels(_task(sender), "waiting_turn").inc()


def _paused(sender: object = None, **_: object) -> None:
    _metrics["contentions"].labels(_task(sender), "paused").inc()


def _contended(sender: object = None, decision: object = None, **_: object) -> None:
    kind = type(decision).__name__.lower() if decision is not None else "unknown"
    _metrics["contentions"].labels(_task(sender), kind).inc()


def _acquired(
    sender: object = None,
    task_id: str = "",
    waited: float = 0.0,
    unlocked: bool = False,
    **_: object,
) -> None:
    task = _task(sender)
    _metrics["leases"].labels(task, "acquired").inc()
    _metrics["wait"].labels(task).observe(waited)
    if not unlocked:
        _gauges(task, *_held.taken(task, task_id, time.time()))


def _ended(task: str, task_id: str) -> None:
    figures = _held.ended(task, task_id)
    if figures is not None:
        _gauges(task, *figures)


def _released(sender: object = None, task_id: str = "", held: float = 0.0, **_: object) -> None:
    task = _task(sender)
    _metrics["leases"].labels(task, "released").inc()
    _metrics["hold"].labels(task).observe(held)
    _ended(task, task_id)


def _lost(sender: object = None, task_id: str = "", **_: object) -> None:
    task = _task(sender)
    _metrics["leases"].labels(task, "lost").inc()
    _ended(task, task_id)


def _handed_over(sender: object = None, task_id: str = "", held: float = 0.0, **_: object) -> None:
    task = _task(sender)
    _metrics["leases"].labels(task, "handed_over").inc()
    _metrics["hold"].labels(task).observe(held)
    _ended(task, task_id)


def _copy(sender: object = None, **_: object) -> None:
    _metrics["copies"].labels(_task(sender)).inc()


def _dead(sender: object = None, **_: object) -> None:
    _metrics["dead"].labels(_task(sender)).inc()


def _attached(sender: object = None, **_: object) -> None:
    _metrics["dispatches"].labels(_task(sender), "attached").inc()


def _answered(sender: object = None, state: object = None, **_: object) -> None:
    _metrics["answered"].labels(_task(sender), str(state)).inc()


def _repeat(sender: object = None, **_: object) -> None:
    _metrics["idempotent"].labels(_task(sender), "repeat").inc()


def _replayed(sender: object = None, **_: object) -> None:
    _metrics["idempotent"].labels(_task(sender), "replayed").inc()


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
        _metrics["deferrals"].labels(task).inc()
    _metrics["remaining"].labels(task, name).set(remaining)
    _metrics["next_slot"].labels(task, name).set(next_slot)


def _limits(name: str = "", change: str = "", **_: object) -> None:
    _metrics["limits"].labels(name, change).inc()


def _ride_checked(outcome: str = "", **_: object) -> None:
    _metrics["ride_checks"].labels(outcome).inc()


_RECEIVERS = (
    (dispatch_accepted, _accepted),
    (duplicate_refused, _refused),
    (call_attached, _attached),
    (attached_answered, _answered),
    (dispatch_rate_limited, _rate_limited),
    (dispatch_backpressured, _backpressured),
    (dispatch_deferred, _dispatch_deferred),
    (execution_contended, _contended),
    (waiting_turn, _waiting_turn),
    (call_paused, _paused),
    (lease_acquired, _acquired),
    (lease_released, _released),
    (lease_lost, _lost),
    (lease_handed_over, _handed_over),
    (copy_dropped, _copy),
    (dead_child_released, _dead),
    (idempotent_repeat, _repeat),
    (idempotent_replayed, _replayed),
    (rate_asked, _rate),
    (limits_changed, _limits),
    (ride_checked, _ride_checked),
    (worker_process_init, _child_started),
)


def installed() -> bool:
    """Whether this process made its metrics already."""
    return bool(_installed)


def show_ride_outcomes() -> None:
    """A worker's ride self-check outcomes, at 0 until its check counts one."""
    for outcome in RIDE_OUTCOMES:
        _metrics["ride_checks"].labels(outcome).inc(0)


__all__ = [
    "BUCKETS",
    "METRICS",
    "RIDE_OUTCOMES",
    "Backend",
    "Metric",
    "add_backend",
    "install",
    "installed",
    "known",
    "prometheus",
    "show_ride_outcomes",
]
