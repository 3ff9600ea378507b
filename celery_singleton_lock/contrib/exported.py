"""The metrics the library exports: each one's names, text, kind and labels (one list, read
by ``metrics`` for Prometheus, ``telemetry`` for OpenTelemetry and the shipped dashboard's
and alert rules' check)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


@dataclass(frozen=True)
class Metric:
    """One metric the library exports, whatever counts it: ``short`` is how the receivers
    name it, ``name`` how Prometheus and OpenTelemetry do (Prometheus adds ``_total`` to a
    counter's samples, ``_bucket``/``_sum``/``_count`` to a histogram's)."""

    short: str
    name: str
    text: str
    kind: Literal["counter", "histogram", "gauge"]
    labels: tuple[str, ...] = ("task",)
    # A gauge's value across a worker's processes (prometheus_client's multiprocess mode):
    # the most recent answer, or over the processes alive now only (a dead child's gone).
    across: str = "mostrecent"


METRICS: tuple[Metric, ...] = (
    Metric("dispatches", "celery_singleton_lock_dispatches", "Dispatches", "counter",
           ("task", "outcome")),
    Metric("contentions", "celery_singleton_lock_contentions", "Executions contended", "counter",
           ("task", "decision")),
    Metric("leases", "celery_singleton_lock_leases", "Running leases", "counter",
           ("task", "event")),
    # Taken and not yet released, lost or handed to a retry; a dead child's are not.
    Metric("held", "celery_singleton_lock_leases_held", "Running leases held now", "gauge",
           across="livesum"),
    Metric("oldest", "celery_singleton_lock_oldest_lease_timestamp_seconds",
           "When the oldest running lease held now was taken (+Inf: none held)", "gauge",
           across="livemin"),
    # Redeliveries and same-id send_task calls of a holder's message, dropped without a result.
    Metric("copies", "celery_singleton_lock_copies_dropped",
           "Copies of a holder's message dropped", "counter"),
    Metric("dead", "celery_singleton_lock_dead_child_releases",
           "Leases of dead children released", "counter"),
    # Canvas members attached to their key's holder, ended with its outcome.
    Metric("answered", "celery_singleton_lock_attached_answered",
           "Attached calls answered with their holder's outcome", "counter", ("task", "state")),
    Metric("idempotent", "celery_singleton_lock_idempotent",
           "Calls answered by an idempotency key's first call", "counter", ("task", "outcome")),
    Metric("wait", "celery_singleton_lock_wait_seconds", "Time to the running lease", "histogram"),
    Metric("hold", "celery_singleton_lock_hold_seconds", "Time the lease was held", "histogram"),
    # limits.set in this process (a rate, a limit, a pause, a resume, a reset): labelled by
    # what the change applies to, not by task.
    Metric("limits", "celery_singleton_lock_limit_changes", "Limits changed at run time",
           "counter", ("target", "change")),
    Metric("deferrals", "celery_singleton_lock_rate_deferrals",
           "Runs deferred to a later slot of a rate", "counter"),
    Metric("remaining", "celery_singleton_lock_rate_remaining", "Runs that may start now",
           "gauge", ("task", "key")),
    Metric("next_slot", "celery_singleton_lock_rate_next_slot_timestamp_seconds",
           "When the next run may start", "gauge", ("task", "key")),
    # Each worker's start: its broker ride's self-check (outcome "off": the ride turned off).
    Metric("ride_checks", "celery_singleton_lock_ride_checks",
           "Broker ride self-checks at worker start", "counter", ("outcome",)),
)  # fmt: skip
