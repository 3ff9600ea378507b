"""What a publish hands down to the channel that puts its message (``broker.publishing``):
on the connection's transport, for that publish alone, taken once. No server: kombu makes
a connection's transport object without connecting."""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery

from celery_singleton_lock import broker
from celery_singleton_lock.broker.pushes import Push
from celery_singleton_lock.broker.state import Outgoing
from celery_singleton_lock.broker.transit import Note
from celery_singleton_lock.lease import Server


@dataclass
class Hold:
    """A ``state.HoldWithPush``: what the channel would take with the message of ``task_id``."""

    task_id: str

    def put(self, server: Server | None, push: Push | None) -> bool:
        return False


@dataclass
class Notes:
    """A ``state.NoteSource``."""

    task_id: str

    def note(self, member: str) -> Note | None:
        return None


def riding_app() -> Celery:
    app = Celery("state", set_as_current=False)
    app.conf.broker_url = "redis://127.0.0.1:1/0"
    assert broker.install(app)
    return app


class TestOutgoing:
    def test_each_is_taken_once_and_only_by_its_own_message(self) -> None:
        hold, notes = Hold("t-1"), Notes("t-1")
        outgoing = Outgoing(hold=hold, notes=notes)
        assert outgoing.take_hold("another") is None  # a message of another task id
        assert outgoing.take_hold("t-1") is hold
        assert outgoing.take_hold("t-1") is None  # a second queue bound: kombu's own put
        assert outgoing.take_note_source("t-1") is notes
        assert outgoing.take_note_source("t-1") is None
        assert not outgoing.rides()


class TestPublishing:
    def test_the_publishing_connection_s_transport_carries_it_for_that_publish(self) -> None:
        app = riding_app()
        hold = Hold("t-2")
        with app.connection_for_write() as connection:
            outgoing = connection.transport.outgoing
            with broker.publishing(connection, hold=hold):
                assert outgoing.hold is hold
                with app.connection_for_write() as other:  # another producer's
                    assert not other.transport.outgoing.rides()
            assert not outgoing.rides()

    def test_a_publish_inside_a_publish_hands_back_only_what_it_set(self) -> None:
        app = riding_app()
        hold, notes = Hold("t-3"), Notes("t-3")
        with app.connection_for_write() as connection:
            outgoing = connection.transport.outgoing
            with broker.publishing(connection, hold=hold):
                with broker.publishing(connection, notes=notes):
                    assert (outgoing.hold, outgoing.notes) == (hold, notes)
                    assert outgoing.take_hold("t-3") is hold  # the channel put it
                # The hold taken inside is not set back: a retried put pushes plainly.
                assert (outgoing.hold, outgoing.notes) == (None, None)

    def test_nothing_rides_a_publish_of_an_app_that_does_not_ride(self) -> None:
        app = Celery("plain", set_as_current=False)
        app.conf.broker_url = "redis://127.0.0.1:1/0"
        with (
            app.connection_for_write() as connection,
            broker.publishing(connection, hold=Hold("t-4")),
        ):
            assert not hasattr(connection.transport, "outgoing")  # kombu's own
