"""What Celery's own event state (Flower's, ``celery events``') makes of the decisions'
events among Celery's own: the status a held-back call shows, and that Celery's later
events still win (``Told.task_event_type``)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.events.state import State

from celery_singleton_lock import signals
from celery_singleton_lock.contrib import events
from celery_singleton_lock.policies import Fail, Requeue

from .test_decision_events import Recorder, Sender

_clock = itertools.count(1)


class Monitor:
    """Celery's ``State``, fed our events as they would arrive, among Celery's own."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.state = State()

    def celery(self, type_: str, uuid: str, **fields: Any) -> None:
        self._feed(type_, uuid=uuid, **fields)

    def ours(self) -> None:
        """What the library sent since the last call."""
        for type_, fields in self.recorder.sent:
            self._feed(type_, **fields)
        self.recorder.sent.clear()

    def _feed(self, type_: str, **fields: Any) -> None:
        now = time.time()
        fields.setdefault("hostname", "w1@host")
        event = dict(fields, type=type_, timestamp=now, local_received=now, clock=next(_clock))
        self.state.event(event)

    def status(self, uuid: str) -> tuple[str, object]:
        task = self.state.tasks[uuid]
        return task.state, getattr(task, "result", None)


@pytest.fixture(name="watched")
def fixture_watched(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Sender, Monitor]]:
    app = Celery("status", set_as_current=False)
    recorder = Recorder()
    monkeypatch.setattr(app, "events", recorder)
    events.uninstall()
    app.conf.task_send_sent_event = True
    events.follow(app)
    events.install(app)  # and a worker with -E
    try:
        yield Sender(app), Monitor(recorder)
    finally:
        events.uninstall()


def test_a_requeued_call_shows_why_then_runs_as_started(
    watched: tuple[Sender, Monitor],
) -> None:
    sender, monitor = watched
    monitor.celery("task-received", "t2", name=sender.name)
    monitor.celery("task-started", "t2")
    signals.send(
        signals.execution_contended, sender, "k", task_id="t2", holder_id="t1", decision=Requeue(2)
    )
    monitor.ours()
    assert monitor.status("t2") == ("STARTED", "'k' is held by t1: requeue in 2.00s")
    # Its message sent again, delivered, run: Celery's own states, as without us.
    monitor.celery("task-received", "t2", name=sender.name)
    monitor.celery("task-started", "t2")
    assert monitor.status("t2")[0] == "STARTED"
    monitor.celery("task-succeeded", "t2", result="'done'")
    assert monitor.status("t2") == ("SUCCESS", "'done'")


def test_a_deferred_call_revoked_shows_revoked(watched: tuple[Sender, Monitor]) -> None:
    sender, monitor = watched
    signals.send(
        signals.dispatch_deferred, sender, "k", task_id="t3", slot=9.0, delay=5.0, remaining=0
    )
    monitor.ours()
    assert monitor.status("t3") == (
        "PENDING",
        "'k''s rate: deferred 5.000s to its slot at dispatch",
    )
    monitor.celery("task-revoked", "t3")
    assert monitor.status("t3")[0] == "REVOKED"
    for waits in (signals.waiting_turn, signals.lease_lost):  # nothing brings it back
        signals.send(waits, sender, "k", task_id="t3", fence=1)
        monitor.ours()
        assert monitor.status("t3")[0] == "REVOKED"


def test_a_call_whose_story_ends_shows_its_decision(watched: tuple[Sender, Monitor]) -> None:
    sender, monitor = watched
    signals.send(signals.duplicate_refused, sender, "k", task_id="t4", holder_id="t1")
    signals.send(signals.dispatch_rate_limited, sender, "k", task_id="t5", retry_after=1.0)
    monitor.ours()
    assert monitor.status("t4") == ("SINGLETON-REFUSED", "refused at dispatch: 'k' is held by t1")
    assert monitor.status("t5")[0] == "SINGLETON-RATE-LIMITED"
    monitor.celery("task-started", "t6")
    signals.send(
        signals.execution_contended,
        sender,
        "k",
        task_id="t6",
        holder_id="t1",
        decision=Fail("held"),
    )
    monitor.ours()
    assert monitor.status("t6")[0] == "SINGLETON-CONTENDED"


def test_a_dropped_copy_leaves_its_running_holder_started(
    watched: tuple[Sender, Monitor],
) -> None:
    sender, monitor = watched
    monitor.celery("task-started", "t1")
    signals.send(signals.copy_dropped, sender, "k", task_id="t1", holder_state="running")
    monitor.ours()
    assert monitor.status("t1") == ("STARTED", None)


def test_opentelemetry_without_its_api_is_not_available(tmp_path: Path) -> None:
    """An ``opentelemetry`` namespace package (another distribution's) without
    ``opentelemetry-api``: nothing is connected, and a singleton task is still defined."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    kept = tmp_path / "site"
    kept.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith("opentelemetry"):
            (kept / entry.name).symlink_to(entry)
    (kept / "opentelemetry" / "semconv").mkdir(parents=True)  # a namespace, no trace
    (kept / "opentelemetry" / "semconv" / "__init__.py").write_text("")
    root = Path(__file__).resolve().parents[2]
    script = (
        f"import sys; sys.path[:0] = [{str(root)!r}, {str(kept)!r}]\n"
        "import opentelemetry.semconv\n"
        "from celery import Celery\n"
        "from celery_singleton_lock import singleton_task\n"
        "from celery_singleton_lock.contrib import tracing\n"
        "app = Celery('no-otel', set_as_current=False)\n"
        "def report(item): return item\n"
        "singleton_task(app=app, shared=False, name='t.x')(report).bind(app)\n"
        "print(tracing.available(), tracing.install())\n"
    )
    ran = subprocess.run(
        [sys.executable, "-S", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["False", "False"]
