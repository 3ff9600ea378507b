"""The calls held back at dispatch (a rate's deferral and refusal, ``max_pending``'s) and at
execution (a turn of a total, a pause) counted in the metrics, shown at 0 from a task's
binding; and ``max_pending``'s refusal told as a decision (a producer's events, read from
a dispatcher that records; a real one in tests/integration/test_events.py)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry

from celery_singleton_lock import signals, singleton_task
from celery_singleton_lock.contrib import decisions, events, metrics

from .test_decision_events import Recorder, Sender
from .test_metrics_gauges import eager_app, figure, nothing

DISPATCHES = "celery_singleton_lock_dispatches_total"
CONTENTIONS = "celery_singleton_lock_contentions_total"
DEFERRALS = "celery_singleton_lock_rate_deferrals_total"


def bound(app_name: str, task_name: str) -> Any:
    metrics.install(CollectorRegistry())
    return singleton_task(app=eager_app(app_name), name=task_name, shared=False)(nothing)


class TestCounted:
    def test_their_series_are_there_at_0_from_the_binding(self) -> None:
        task = bound("held-back-zero", "held_back.never_called")
        for outcome in ("rate_limited", "backpressured"):
            assert figure("dispatches", DISPATCHES, task=task.name, outcome=outcome) == 0
        for decision in ("waiting_turn", "paused"):
            assert figure("contentions", CONTENTIONS, task=task.name, decision=decision) == 0
        assert figure("deferrals", DEFERRALS, task=task.name) == 0

    def test_a_rates_refusal_and_max_pendings_are_dispatch_outcomes(self) -> None:
        task = bound("held-back-dispatch", "held_back.dispatch")
        signals.send(signals.dispatch_rate_limited, task, "k", task_id="a", retry_after=1.0)
        signals.send(
            signals.dispatch_rate_limited, task, "k", task_id="b", retry_after=1.0, paused=True
        )
        signals.send(
            signals.dispatch_backpressured,
            task,
            "k",
            task_id="c",
            waiting=5,
            cap=5,
            retry_after=0.05,
        )
        limited = figure("dispatches", DISPATCHES, task=task.name, outcome="rate_limited")
        assert limited == 2  # a pause's refusal is a rate's too (its event says paused)
        pressed = figure("dispatches", DISPATCHES, task=task.name, outcome="backpressured")
        assert pressed == 1
        assert figure("dispatches", DISPATCHES, task=task.name, outcome="accepted") == 0

    def test_a_deferral_at_dispatch_counts_as_a_runs_does(self) -> None:
        task = bound("held-back-deferred", "held_back.deferred")
        signals.send(
            signals.dispatch_deferred, task, "k", task_id="d1", slot=50.0, delay=2.0, remaining=0
        )
        assert figure("deferrals", DEFERRALS, task=task.name) == 1
        # Its run, on its slot: given it now, no second deferral.
        signals.send(
            signals.rate_asked,
            task,
            "k",
            task_id="d1",
            slot=50.0,
            delay=0.0,
            deferred=False,
            remaining=0,
            next_slot=52.0,
        )
        assert figure("deferrals", DEFERRALS, task=task.name) == 1
        signals.send(
            signals.rate_asked,
            task,
            "k",
            task_id="d2",
            slot=54.0,
            delay=2.0,
            deferred=True,
            remaining=0,
            next_slot=56.0,
        )
        assert figure("deferrals", DEFERRALS, task=task.name) == 2

    def test_a_run_waiting_its_turn_and_a_paused_one_are_contentions(self) -> None:
        task = bound("held-back-run", "held_back.run")
        signals.send(signals.waiting_turn, task, "fair:a", task_id="w1")
        signals.send(signals.waiting_turn, task, "fair:a", task_id="w2")
        signals.send(
            signals.call_paused,
            task,
            "fair:b",
            task_id="p1",
            target="fair:b",
            paused_at=1.0,
            by="ops",
            recheck=1.0,
        )
        waiting = figure("contentions", CONTENTIONS, task=task.name, decision="waiting_turn")
        assert waiting == 2
        assert figure("contentions", CONTENTIONS, task=task.name, decision="paused") == 1


class TestMaxPendingsRefusal:
    def test_its_decision_says_how_many_wait_the_cap_and_when_to_try_again(self) -> None:
        [told] = [t for t in decisions.DECISIONS if t.signal is signals.dispatch_backpressured]
        assert (told.what, told.at_dispatch) == ("backpressured", True)
        assert told.event_type == "singleton-backpressured"
        assert told.span_event == "singleton.backpressured"
        fields = told.fields(
            {"name": "capped:7", "task_id": "t9", "waiting": 5, "cap": 5, "retry_after": 0.05}
        )
        assert fields == {
            "uuid": "t9",
            "key": "capped:7",
            "waiting": 5,
            "cap": 5,
            "retry_after": 0.05,
            "reason": "refused at dispatch: 'capped:7' has 5 calls waiting, as many as "
            "max_pending=5 allows; try again in 0.050s",
        }
        # Nothing was sent: the call's story ends here, its status says so.
        assert told.task_event_type(fields) == "task-singleton-backpressured"

    def test_a_producer_with_sent_events_sends_it_and_its_twin(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        app = Celery("held-back-events", set_as_current=False)
        recorder = Recorder()
        monkeypatch.setattr(app, "events", recorder)
        events.uninstall()  # what other tests' apps connected
        sender = Sender(app)
        try:
            signals.send(
                signals.dispatch_backpressured, sender, "k", task_id="t1", waiting=3, cap=3
            )
            assert recorder.sent == []  # events off: nothing
            app.conf.task_send_sent_event = True
            assert events.follow(app)
            signals.send(
                signals.dispatch_backpressured,
                sender,
                "k",
                task_id="t2",
                waiting=3,
                cap=3,
                retry_after=1.0,
            )
        finally:
            events.uninstall()
        assert [type_ for type_, _ in recorder.sent] == [
            "singleton-backpressured",
            "task-singleton-backpressured",
        ]
        said = recorder.sent[0][1]
        assert {k: said[k] for k in ("uuid", "key", "waiting", "cap", "retry_after")} == {
            "uuid": "t2",
            "key": "k",
            "waiting": 3,
            "cap": 3,
            "retry_after": 1.0,
        }
        assert (said["name"], said["singleton"]) == ("tasks.report", "backpressured")
        assert said["result"].startswith("refused at dispatch: 'k' has 3 calls waiting")
