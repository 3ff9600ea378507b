"""Testing tasks that take a lock per request, with celery-singleton-lock's pytest
plugin: the duplicate path, eagerly and on Celery's in-process worker.

``singleton_locks`` (a fixture of the plugin) gives a test an empty lock store and:
``hold(task, *args)`` holds a call's lock as another worker would; ``held()`` and
``clear()`` list and free locks; ``assert_refused`` / ``assert_locked`` check what a
call would meet. ``singleton_clock`` lets the test move the lock store's time by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from celery.exceptions import TimeoutError as ResultTimeout

from celery_singleton_lock import SingletonTask
from example_project import store
from example_project.tasks import callback_request, process_request


@pytest.fixture
def eager(singleton_app: Any) -> Iterator[None]:
    singleton_app.conf.task_always_eager = True
    try:
        yield
    finally:
        singleton_app.conf.task_always_eager = False


@pytest.mark.usefixtures("eager")
def test_a_request_is_processed_once_and_its_lock_given_back(singleton_locks: Any) -> None:
    assert process_request.delay(1).get() == "processed"
    assert process_request.delay(1).get() == "already processed"
    assert singleton_locks.held() == []


@pytest.mark.usefixtures("eager")
def test_a_request_another_worker_holds_is_neither_processed_nor_called_back(
    singleton_locks: Any,
) -> None:
    with singleton_locks.hold(process_request, 2) as holder:
        singleton_locks.assert_locked(process_request, 2)
        singleton_locks.assert_refused(process_request, 2)
        # The callback takes the same lock per request ("request:{request_idx}").
        singleton_locks.assert_refused(callback_request, 2)
        assert process_request.delay(2).id == holder.task_id  # the holder's result
        [row] = singleton_locks.held()
        assert (row.name, row.state, row.task_id) == ("request:2", "running", holder.task_id)
    assert store.state(2) == "pending"  # nothing ran while it was held
    assert process_request.delay(2).get() == "processed"


@pytest.mark.usefixtures("eager")
def test_a_worker_that_died_holding_a_request_frees_it_when_its_ttl_runs_out(
    singleton_locks: Any, singleton_clock: Any
) -> None:
    ttl = process_request.singleton_context.ttl
    with singleton_locks.hold(process_request, 7):  # its worker was killed mid-run
        singleton_clock.advance(ttl - 1)
        singleton_locks.assert_refused(process_request, 7)
        singleton_clock.advance(2)  # no renewal came: the lease ran out
        assert process_request.delay(7).get() == "processed"


def test_the_assertions_say_what_is_held(singleton_locks: Any) -> None:
    with pytest.raises(AssertionError, match="would be accepted: 'request:3' is free"):
        singleton_locks.assert_refused(process_request, 3)
    with (
        singleton_locks.hold(process_request, 4),
        pytest.raises(AssertionError, match=r"held: \['request:4'\]"),
    ):
        singleton_locks.assert_locked(process_request, 3)


def test_on_celerys_in_process_worker_a_copy_waits_for_the_holder(
    singleton_app: Any, singleton_locks: Any
) -> None:
    with start_worker(singleton_app, pool="solo", perform_ping_check=False):
        assert process_request.delay(5).get(timeout=10) == "processed"
        with singleton_locks.hold(process_request, 6) as holder:
            assert process_request.delay(6).id == holder.task_id  # refused at dispatch
            # A copy sent past dispatch meets the lock at execution and requeues.
            copy = singleton_app.send_task("example.process_request", (6,))
            with pytest.raises(ResultTimeout):
                copy.get(timeout=0.5)
            assert store.state(6) == "pending"
        assert copy.get(timeout=20) == "processed"  # it ran once the holder let go


def test_with_celerys_own_celery_app_and_celery_worker_fixtures(
    celery_app: Any, celery_worker: Any, singleton_locks: Any
) -> None:
    @celery_app.task(base=SingletonTask, singleton={"key": ["order_id"]}, name="t.invoice")
    def invoice(order_id: int) -> int:
        return order_id

    celery_worker.reload()  # the worker learns the task defined after it started
    assert invoice.delay(7).get(timeout=10) == 7
    with singleton_locks.hold(invoice, 8) as holder:
        singleton_locks.assert_refused(invoice, 8)
        assert invoice.delay(8).id == holder.task_id
    assert singleton_locks.held() == []
