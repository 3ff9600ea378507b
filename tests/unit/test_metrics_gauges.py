"""The metrics' series shown at 0 from a task's binding, and the gauges of the running leases
held now, read from prometheus_client's own objects after real signals and eager runs on the
``memory://`` lock store (a worker's, scraped, in tests/integration/test_metrics.py)."""

from __future__ import annotations

import math
import os
import time
from typing import Any

from celery import Celery
from prometheus_client import CollectorRegistry

from celery_singleton_lock import signals, singleton_task
from celery_singleton_lock.contrib import metrics, metrics_files
from celery_singleton_lock.contrib.leases_held import NONE_HELD, LeasesHeld


def figure(short: str, name: str, **labels: str) -> float | None:
    """The value of one sample of the installed metric ``short``; None if there is none."""
    made: Any = metrics.install(CollectorRegistry())[short]
    for family in made.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def nothing() -> None:
    """A task's body that does nothing."""


def eager_app(name: str) -> Celery:
    app = Celery(name, set_as_current=False)
    app.conf.update(task_always_eager=True, singleton_lock_url="memory://")
    return app


class TestShownAtZero:
    def test_a_bound_tasks_series_are_there_before_anything_is_counted(self) -> None:
        metrics.install(CollectorRegistry())
        app = eager_app("gauges-zero")
        task = singleton_task(app=app, name="gauges.never_called", shared=False)(nothing)
        assert task.name == "gauges.never_called"
        leases = "celery_singleton_lock_leases_total"
        dispatches = "celery_singleton_lock_dispatches_total"
        for event in ("acquired", "released", "lost", "handed_over"):
            assert figure("leases", leases, task=task.name, event=event) == 0
        for outcome in ("accepted", "refused", "attached"):
            assert figure("dispatches", dispatches, task=task.name, outcome=outcome) == 0
        contentions = "celery_singleton_lock_contentions_total"
        for decision in ("requeue", "wait", "skip", "fail"):
            assert figure("contentions", contentions, task=task.name, decision=decision) == 0
        for short, name in (
            ("copies", "celery_singleton_lock_copies_dropped_total"),
            ("dead", "celery_singleton_lock_dead_child_releases_total"),
        ):
            assert figure(short, name, task=task.name) == 0
        answered = "celery_singleton_lock_attached_answered_total"
        for state in ("SUCCESS", "FAILURE"):
            assert figure("answered", answered, task=task.name, state=state) == 0
        idempotent = "celery_singleton_lock_idempotent_total"
        for outcome in ("repeat", "replayed"):
            assert figure("idempotent", idempotent, task=task.name, outcome=outcome) == 0
        assert figure("held", "celery_singleton_lock_leases_held", task=task.name) == 0
        oldest = figure(
            "oldest", "celery_singleton_lock_oldest_lease_timestamp_seconds", task=task.name
        )
        assert oldest == math.inf


class TestLeasesHeldNow:
    def test_a_run_shows_its_lease_while_it_holds_it_and_not_after(self) -> None:
        metrics.install(CollectorRegistry())
        app = eager_app("gauges-run")
        seen: list[tuple[float | None, float | None]] = []
        name = "gauges.run"

        def body() -> None:
            seen.append(
                (
                    figure("held", "celery_singleton_lock_leases_held", task=name),
                    figure(
                        "oldest", "celery_singleton_lock_oldest_lease_timestamp_seconds", task=name
                    ),
                )
            )

        task = singleton_task(app=app, name=name, shared=False)(body)
        before = time.time()
        task.delay().get()
        [(held, oldest)] = seen
        assert held == 1
        assert oldest is not None
        assert before <= oldest <= time.time()
        assert figure("held", "celery_singleton_lock_leases_held", task=name) == 0
        oldest_after = figure(
            "oldest", "celery_singleton_lock_oldest_lease_timestamp_seconds", task=name
        )
        assert oldest_after == math.inf

    def test_a_lost_lease_released_at_its_runs_end_ends_once(self) -> None:
        metrics.install(CollectorRegistry())
        app = eager_app("gauges-lost")
        task = singleton_task(app=app, name="gauges.lost", shared=False)(nothing)
        held = "celery_singleton_lock_leases_held"
        for task_id in ("r1", "r2"):
            signals.send(signals.lease_acquired, task, "k", task_id=task_id, fence=1, waited=0.0)
        assert figure("held", held, task=task.name) == 2
        signals.send(signals.lease_lost, task, "k", task_id="r1", fence=1)
        signals.send(signals.lease_released, task, "k", task_id="r1", held=1.0)
        assert figure("held", held, task=task.name) == 1
        signals.send(signals.lease_handed_over, task, "k", task_id="r2", held=1.0)
        assert figure("held", held, task=task.name) == 0
        handed = figure(
            "leases", "celery_singleton_lock_leases_total", task=task.name, event="handed_over"
        )
        assert handed == 1

    def test_a_run_without_a_lease_is_not_counted_as_holding_one(self) -> None:
        metrics.install(CollectorRegistry())
        app = eager_app("gauges-unlocked")
        task = singleton_task(app=app, name="gauges.unlocked", shared=False)(nothing)
        signals.send(
            signals.lease_acquired, task, "k", task_id="u", fence=0, waited=0.0, unlocked=True
        )
        assert figure("held", "celery_singleton_lock_leases_held", task=task.name) == 0


class TestTheBookkeeping:
    def test_the_oldest_take_is_the_smallest_of_those_held(self) -> None:
        held = LeasesHeld()
        assert held.figures("t") == (0, NONE_HELD)
        assert held.taken("t", "a", 10.0) == (1, 10.0)
        assert held.taken("t", "b", 5.0) == (2, 5.0)
        assert held.taken("u", "c", 1.0) == (1, 1.0)
        assert held.ended("t", "b") == (1, 10.0)
        assert held.ended("t", "b") is None  # ended before: nothing changes
        assert held.ended("t", "a") == (0, NONE_HELD)
        assert held.ended("t", "elsewhere") is None


class TestAProcessGone:
    def test_a_child_dead_and_not_yet_reaped_is_gone_and_so_is_one_reaped(self) -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        try:
            # Dead at once, unreaped until waitpid below: a zombie, told from /proc.
            deadline = time.monotonic() + 10
            while metrics_files.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not metrics_files.alive(pid)
        finally:
            os.waitpid(pid, 0)
        assert not metrics_files.alive(pid)
        assert metrics_files.alive(os.getpid())
