"""The decisions' one table, and what each receiver builds: nothing while events are off."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import signals, singleton_task
from celery_singleton_lock.contrib import decisions, events, tracing
from celery_singleton_lock.policies import Requeue


class Recorder:
    """Stands for Celery's dispatcher: what it would have sent, and how often it was built."""

    def __init__(self) -> None:
        self.built = 0
        self.sent: list[tuple[str, dict[str, Any]]] = []

    @contextlib.contextmanager
    def default_dispatcher(self, hostname: str | None = None) -> Iterator[Recorder]:
        self.built += 1
        yield self

    def send(self, type_: str, **fields: Any) -> None:
        self.sent.append((type_, fields))


class Sender:
    """A task as the signals' receivers read it: its app and name."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.name = "tasks.report"


@pytest.fixture(name="recorded")
def fixture_recorded(monkeypatch: pytest.MonkeyPatch) -> tuple[Sender, Recorder]:
    app = Celery("events", set_as_current=False)
    recorder = Recorder()
    monkeypatch.setattr(app, "events", recorder)
    events.uninstall()  # what other tests' apps connected
    return Sender(app), recorder


def _sends(sender: Sender) -> None:
    """The producer's app sends task-sent events, as read when its tasks are bound."""
    sender.app.conf.task_send_sent_event = True
    assert events.follow(sender.app)


class TestTheTable:
    def test_each_decision_has_its_event_its_span_event_and_its_signal(self) -> None:
        told = {t.what: t for t in decisions.DECISIONS}
        assert set(told) >= {"refused", "contended", "deferred", "copy-dropped", "lease-lost"}
        assert told["copy-dropped"].event_type == "singleton-copy-dropped"
        assert told["copy-dropped"].task_event_type({}) is None  # its uuid is its holder's
        assert told["refused"].task_event_type({}) == "task-singleton-refused"
        assert told["lease-lost"].task_event_type({}) == decisions.GOES_ON_TWIN
        assert told["copy-dropped"].span_event == "singleton.copy_dropped"
        assert told["lease-lost"].signal is signals.lease_lost
        assert told["attached"].signal is signals.call_attached
        assert told["attached"].event_type == "singleton-attached"
        at_dispatch = [t.what for t in decisions.DECISIONS if t.at_dispatch]
        assert at_dispatch == ["refused", "deferred", "rate-limited", "backpressured", "attached"]

    def test_a_contention_says_the_holder_and_what_the_call_does_next(self) -> None:
        [contended] = [t for t in decisions.DECISIONS if t.what == "contended"]
        fields = contended.fields(
            {"name": "report:7", "task_id": "t2", "holder_id": "t1", "decision": Requeue(2.5)}
        )
        assert fields == {
            "uuid": "t2",
            "key": "report:7",
            "holder": "t1",
            "delay": 2.5,
            "then": "requeue",
            "reason": "'report:7' is held by t1: requeue in 2.50s",
        }

    def test_a_rate_slot_given_now_is_no_deferral(self) -> None:
        [deferred] = [t for t in decisions.DECISIONS if t.signal is signals.rate_asked]
        assert deferred.fields({"name": "k", "task_id": "t", "deferred": False}) is None

    def test_span_attributes_name_the_key_and_the_holder(self) -> None:
        said = tracing.attributes({"uuid": "t2", "key": "k", "holder": "t1", "delay": 1.5})
        assert said == {
            "singleton.task_id": "t2",
            "singleton.key": "k",
            "singleton.holder_id": "t1",
            "singleton.delay": 1.5,
        }


class TestAProducer:
    def test_without_sent_events_a_refusal_builds_no_dispatcher(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        signals.send(signals.duplicate_refused, sender, "k", task_id="t2", holder_id="t1")
        assert recorder.built == 0

    def test_with_sent_events_a_refusal_is_sent_with_its_fields(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        _sends(sender)
        signals.send(signals.duplicate_refused, sender, "k", task_id="t2", holder_id="t1")
        [(type_, fields), (twin, twin_fields)] = recorder.sent
        assert (type_, twin) == ("singleton-refused", "task-singleton-refused")
        assert twin_fields == fields
        assert fields["singleton"] == "refused"
        assert {k: fields[k] for k in ("uuid", "key", "holder", "name")} == {
            "uuid": "t2",
            "key": "k",
            "holder": "t1",
            "name": "tasks.report",
        }
        assert fields["result"] == "refused at dispatch: 'k' is held by t1"

    def test_with_sent_events_a_canvas_member_attached_is_sent_with_its_holder(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        _sends(sender)
        signals.send(signals.call_attached, sender, "k", task_id="t3", holder_id="t1")
        [(type_, fields), (twin, _)] = recorder.sent
        # It runs (or is answered) later: its status stays Celery's (test_decision_status).
        assert (type_, twin) == ("singleton-attached", "task-pending")
        assert {k: fields[k] for k in ("uuid", "key", "holder")} == {
            "uuid": "t3",
            "key": "k",
            "holder": "t1",
        }

    def test_a_call_refused_before_it_had_an_id_is_given_one(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        _sends(sender)
        signals.send(signals.duplicate_refused, sender, "k", task_id=None, holder_id="t1")
        [(_, fields), (_, twin)] = recorder.sent
        assert isinstance(fields["uuid"], str)
        assert fields["uuid"]
        assert twin["uuid"] == fields["uuid"]  # both name the same call

    def test_a_producer_sends_no_worker_decision(self, recorded: tuple[Sender, Recorder]) -> None:
        """A run's decisions are sent by a worker with -E only (its receivers are
        connected at worker_init): a producer's setting does not send them."""
        sender, recorder = recorded
        _sends(sender)
        signals.send(
            signals.execution_contended, sender, "k", task_id="t", holder_id="h", decision=None
        )
        signals.send(signals.lease_lost, sender, "k", task_id="t", fence=3)
        assert recorder.built == 0


def _connected(signal: Any) -> set[object]:
    """The events' receivers connected to ``signal`` (by their dispatch ids)."""
    return {
        lookup[0]
        for lookup, _ in signal.receivers
        if str(lookup[0]).startswith("celery_singleton_lock.event.")
    }


class TestEventsOff:
    """A producer without sent events connects nothing: a refusal calls no receiver of
    ours (the bench's section 2 measures it: ``this`` against ``this_no_receivers``)."""

    def test_a_producer_without_sent_events_connects_no_receiver(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        assert events.follow(sender.app) is False
        assert _connected(signals.duplicate_refused) == set()
        assert _connected(signals.call_attached) == set()
        signals.send(signals.duplicate_refused, sender, "k", task_id="t2", holder_id="t1")
        assert recorder.built == 0

    def test_binding_a_singleton_task_reads_the_setting(self) -> None:
        events.uninstall()
        quiet = Celery("quiet", set_as_current=False)
        singleton_task(app=quiet, shared=False, name="t.quiet")(_report).bind(quiet)
        assert _connected(signals.duplicate_refused) == set()
        loud = Celery("loud", set_as_current=False)
        loud.conf.task_send_sent_event = True
        singleton_task(app=loud, shared=False, name="t.loud")(_report).bind(loud)
        assert _connected(signals.duplicate_refused) == {"celery_singleton_lock.event.refused"}
        events.uninstall()

    def test_a_change_at_run_time_is_followed_once_read_again(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        app = sender.app
        events.follow(app)
        app.conf.task_send_sent_event = True
        signals.send(signals.duplicate_refused, sender, "k", task_id="t2", holder_id="t1")
        assert recorder.built == 0  # not read again yet: nothing connected
        assert events.follow(app) is True
        signals.send(signals.duplicate_refused, sender, "k", task_id="t2", holder_id="t1")
        assert recorder.built == 1
        app.conf.task_send_sent_event = False
        assert events.follow(app) is False
        assert _connected(signals.duplicate_refused) == set()

    def test_only_the_apps_that_send_send(self, recorded: tuple[Sender, Recorder]) -> None:
        sender, recorder = recorded
        _sends(sender)
        other = Sender(Celery("other", set_as_current=False))
        other_recorder = Recorder()
        other.app.events = other_recorder  # type: ignore[assignment]
        events.follow(other.app)
        signals.send(signals.duplicate_refused, other, "k", task_id="t2", holder_id="t1")
        signals.send(signals.duplicate_refused, sender, "k", task_id="t3", holder_id="t1")
        assert (other_recorder.built, recorder.built) == (0, 1)

    def test_a_worker_with_events_keeps_its_receivers(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, _ = recorded
        events.install(sender.app)
        try:
            events.follow(sender.app)  # a producer's app without sent events, in the worker
            assert "celery_singleton_lock.event.lease-lost" in _connected(signals.lease_lost)
        finally:
            events.uninstall()


def _report(item: str) -> str:
    return item


class TestAWorker:
    def test_only_the_app_whose_worker_sends_events_sends(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        """Two apps in one process, one a worker with -E: the other's runs send nothing."""
        sender, recorder = recorded
        other = Sender(Celery("other", set_as_current=False))
        other_recorder = Recorder()
        other.app.events = other_recorder  # type: ignore[assignment]
        events.install(sender.app)
        try:
            for each in (sender, other):
                signals.send(signals.lease_lost, each, "k", task_id="t", fence=3)
            assert (recorder.built, other_recorder.built) == (1, 0)
        finally:
            events.uninstall()

    def test_a_call_waiting_its_turn_and_a_paused_one_are_told(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        events.install(sender.app)
        try:
            signals.send(signals.waiting_turn, sender, "k", task_id="t1")
            signals.send(
                signals.call_paused,
                sender,
                "k",
                task_id="t2",
                target="tasks.report",
                paused_at=100.0,
                by="ops",
                recheck=1.0,
            )
        finally:
            events.uninstall()
        types = [type_ for type_, _ in recorder.sent]
        assert types == [
            "singleton-waiting-turn",
            decisions.GOES_ON_TWIN,
            "singleton-paused",
            decisions.GOES_ON_TWIN,
        ]
        turn, paused = recorder.sent[0][1], recorder.sent[2][1]
        assert (turn["uuid"], turn["key"]) == ("t1", "k")
        assert "waits for its turn" in str(turn["result"])
        assert {k: paused[k] for k in ("uuid", "key", "target", "paused_at", "by")} == {
            "uuid": "t2",
            "key": "k",
            "target": "tasks.report",
            "paused_at": 100.0,
            "by": "ops",
        }
        assert paused["result"] == (
            "'k' is paused by an operator ('tasks.report', ops): kept waiting until it is resumed"
        )

    def test_a_dropped_copy_has_no_twin_under_its_holders_id(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        events.install(sender.app)
        try:
            signals.send(signals.copy_dropped, sender, "k", task_id="h", holder_state="running")
        finally:
            events.uninstall()
        assert [type_ for type_, _ in recorder.sent] == ["singleton-copy-dropped"]


class Consumer:
    """A worker's consumer as ``follow_consumer`` reads it: its event dispatcher's groups
    (Celery's ``enable_events`` adds "task", ``disable_events`` takes it away)."""

    def __init__(self, *groups: str) -> None:
        self.event_dispatcher = type("Dispatcher", (), {"enabled": True, "groups": set(groups)})()


class TestAWorkerWithoutE:
    def test_it_follows_enable_and_disable_events(self, recorded: tuple[Sender, Recorder]) -> None:
        sender, recorder = recorded
        events.watch_remote(sender.app)
        try:
            events.follow_consumer(Consumer("worker"))
            assert _connected(signals.lease_lost) == set()
            events.follow_consumer(Consumer("worker", "task"))  # enable_events
            assert _connected(signals.lease_lost) == {"celery_singleton_lock.event.lease-lost"}
            signals.send(signals.lease_lost, sender, "k", task_id="t", fence=3)
            assert recorder.built == 1
            events.follow_consumer(Consumer("worker"))  # disable_events
            assert _connected(signals.lease_lost) == set()
        finally:
            events.uninstall()

    def test_a_producer_in_it_keeps_its_receivers_when_events_are_disabled(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        _sends(sender)
        events.watch_remote(sender.app)
        try:
            events.follow_consumer(Consumer("worker", "task"))
            events.follow_consumer(Consumer("worker"))
            assert _connected(signals.duplicate_refused) == {"celery_singleton_lock.event.refused"}
            assert _connected(signals.lease_lost) == set()
            signals.send(signals.duplicate_refused, sender, "k", task_id="t2", holder_id="t1")
            assert recorder.built == 1
        finally:
            events.uninstall()

    def test_a_pool_process_forked_before_enable_events_follows_it(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, _ = recorded
        events.watch_remote(sender.app)  # at worker_init, before the pool forks
        fork = multiprocessing.get_context("fork")
        go, answer = fork.Event(), fork.SimpleQueue()

        def pool_process() -> None:
            go.wait(10)
            events.follow_remote()  # as its next run starts
            answer.put(sorted(map(str, _connected(signals.lease_lost))))

        child = fork.Process(target=pool_process, daemon=True)
        child.start()
        try:
            events.follow_consumer(Consumer("worker", "task"))  # the main process, later
            go.set()
            child.join(10)
            assert answer.get() == ["celery_singleton_lock.event.lease-lost"]
        finally:
            if child.is_alive():
                child.kill()
            events.uninstall()


class TestARateAtDispatch:
    def test_a_deferral_and_a_refusal_are_sent_by_a_producer_with_sent_events(
        self, recorded: tuple[Sender, Recorder]
    ) -> None:
        sender, recorder = recorded
        _sends(sender)
        signals.send(
            signals.dispatch_deferred, sender, "k", task_id="t1", slot=50.0, delay=2.0, remaining=0
        )
        signals.send(
            signals.dispatch_rate_limited, sender, "k", task_id="t2", retry_after=0.5, paused=False
        )
        types = [type_ for type_, _ in recorder.sent]
        assert types == [
            "singleton-deferred",
            decisions.GOES_ON_TWIN,
            "singleton-rate-limited",
            "task-singleton-rate-limited",  # nothing was sent: its story ends here
        ]
        deferred, limited = recorder.sent[0][1], recorder.sent[2][1]
        assert {k: deferred[k] for k in ("uuid", "key", "slot", "delay", "remaining")} == {
            "uuid": "t1",
            "key": "k",
            "slot": 50.0,
            "delay": 2.0,
            "remaining": 0,
        }
        assert deferred["result"] == "'k''s rate: deferred 2.000s to its slot at dispatch"
        assert (limited["uuid"], limited["retry_after"], limited["paused"]) == ("t2", 0.5, False)
        assert limited["result"] == (
            "refused at dispatch: 'k' is over its rate; try again in 0.500s"
        )
