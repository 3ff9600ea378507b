"""What the core asks of the broker ride (``broker.ride``): chosen once an app, and,
where nothing rides, each lock operation the lock store's own call (a held call's publish
answered None: its hold takes a round trip of its own). No server: the lock store is in
memory."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context

from celery_singleton_lock import singleton_task
from celery_singleton_lock.broker import versions
from celery_singleton_lock.broker.ride import BROKER_RIDE, NO_RIDE, lock_ride
from celery_singleton_lock.context import TaskContext
from celery_singleton_lock.lease import HOLD, Lease, Server
from celery_singleton_lock.modes.stages import Replacing
from celery_singleton_lock.publish.call import Dispatch, TaskFacts

SERVER = Server(("127.0.0.1", 6379), 0)


def app_with(**settings: Any) -> Celery:
    app = Celery("seam", set_as_current=False)
    app.conf.update(broker_url="memory://", singleton_lock_url="memory://", **settings)
    return app


def job(x: int) -> int:
    return x


def context_of(app: Celery) -> TaskContext:
    task = singleton_task(app=app, name="seam.job", shared=False)(job)
    context: TaskContext = task.singleton_context
    return context


def dispatch_of(app: Celery) -> Dispatch:
    """A call of the task as ``apply_async`` builds it, its hold planned."""
    task = singleton_task(app=app, name="seam.job", shared=False)(job)
    facts = TaskFacts(app, task.name, task.singleton_options())
    call = Dispatch(
        task, facts, (1,), {}, {}, None, None, None, None, None, task.apply_async,
        bypass=False, redrive=False,
    )  # fmt: skip
    call.lock_name = "seam.job:1"
    call.plan_hold(0.0)
    return call


def replacing_of(call: Dispatch) -> Replacing:
    return Replacing(
        holder=call.token,
        record=call.token,
        task_id=call.new_task_id(),
        token="q|other",
        ttl=call.ttl,
        options={},
        headers={},
    )


class TestChoice:
    @pytest.mark.skipif(not versions.TESTED_HERE, reason="kombu or Celery outside the range")
    def test_an_app_that_rides_is_answered_by_the_broker_ride(self) -> None:
        assert lock_ride(app_with()) is BROKER_RIDE

    def test_an_app_with_the_ride_off_takes_round_trips_of_its_own(self) -> None:
        assert lock_ride(app_with(singleton_lock_ride_broker=False)) is NO_RIDE

    def test_a_task_s_dispatches_ask_the_app_s_ride(self) -> None:
        app = app_with(singleton_lock_ride_broker=False)
        assert dispatch_of(app).facts.ride is NO_RIDE


class TestNoRide:
    def test_nothing_rides_a_publish_or_a_receipt(self) -> None:
        context = context_of(app_with())
        assert NO_RIDE.pushes_for(context) is None
        call = dispatch_of(app_with())
        assert NO_RIDE.publish_held(call, swaps=False) is None
        assert NO_RIDE.replace_held(call, replacing_of(call)) is None
        taken = NO_RIDE.take_on_receipt(context, SERVER, "k", token="t", take=HOLD, entry=None)
        assert taken is None

    def test_a_run_s_release_is_the_store_s_own_call(self) -> None:
        app = app_with()
        task = singleton_task(app=app, name="seam.job", shared=False)(job)
        context = task.singleton_context
        lease = context.store.try_acquire("k", 30)
        assert isinstance(lease, Lease)
        request = Context(id="run-1", is_eager=False, callbacks=None, chain=None, chord=None)
        NO_RIDE.release_at_end(task, request, context, lease, ride=True)
        assert context.store.holder("k") is None


class TestBrokerRide:
    def test_a_store_no_broker_shares_rides_nothing(self) -> None:
        context = context_of(app_with())
        assert BROKER_RIDE.pushes_for(context) is None
        taken = BROKER_RIDE.take_on_receipt(context, SERVER, "k", token="t", take=HOLD, entry=None)
        assert taken is None

    def test_a_held_call_on_a_store_no_broker_shares_takes_its_own_round_trip(self) -> None:
        call = dispatch_of(app_with())
        assert BROKER_RIDE.publish_held(call, swaps=True) is None
        assert not call.rides
        assert BROKER_RIDE.replace_held(call, replacing_of(call)) is None
        assert call.facts.store.holder(call.hold) is None  # nothing taken by the ride
