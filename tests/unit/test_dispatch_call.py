"""One call at dispatch (``publish.call``): what a task reads once is read again when the
app's lock settings are replaced. No server: broker and lock store in memory."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_singleton_lock import DuplicateTaskError, singleton_task
from celery_singleton_lock.config.stores import LockStores


def job(x: int) -> int:
    return x


@pytest.fixture(name="app")
def app_fixture() -> Celery:
    app = Celery("call", set_as_current=False)
    app.conf.update(broker_url="memory://", singleton_lock_url="memory://")
    return app


class TestTaskFacts:
    def test_a_duplicate_is_refused_by_the_hold_of_the_first_call(self, app: Celery) -> None:
        task = singleton_task(app=app, name="call.job", shared=False, on_duplicate="raise")(job)
        task.delay(1)
        with pytest.raises(DuplicateTaskError):
            task.delay(1)

    def test_a_duplicate_gets_the_holder_s_result_by_default(self, app: Celery) -> None:
        task = singleton_task(app=app, name="call.job", shared=False)(job)
        first = task.delay(1)
        assert task.delay(1).id == first.id

    def test_a_throttled_call_raises_with_the_window_s_reason(self, app: Celery) -> None:
        options = {"throttle": 60, "on_duplicate": "raise"}
        task = singleton_task(app=app, name="call.job", shared=False, **options)(job)
        first = task.delay(1)
        with pytest.raises(DuplicateTaskError, match=r"was accepted less than 60s ago") as caught:
            task.delay(1)
        assert caught.value.task_id == first.id

    def test_a_dispatch_after_the_lock_settings_change_holds_in_the_new_store(
        self, app: Celery
    ) -> None:
        task = singleton_task(app=app, name="call.job", shared=False, on_duplicate="raise")(job)
        first = task.delay(1)
        app.conf.update(singleton_lock_prefix="moved")
        LockStores.forget(app)  # a new store, empty: the first call's hold is not in it
        second = task.delay(1)
        assert second.id != first.id
        with pytest.raises(DuplicateTaskError):
            task.delay(1)
