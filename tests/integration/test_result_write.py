"""A run's result write: a success stored already is left as it is, anything else is
replaced and published.

Celery reads the stored result before each write. In the default shape a run's write
(which carries its release) reads it in its own step (``broker/lua/store_result.lua``);
elsewhere Celery's own read does: the answer must be the same.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
from celery import states

from celery_singleton_lock.broker.results import READ_IN_SCRIPT

from ..conftest import CeleryEnv
from ..support.runs import runs, wait_for
from ..support.workers import Worker


def stored(cenv: CeleryEnv, task_id: str) -> dict[str, Any]:
    """The result stored for ``task_id``, as Celery encoded it."""
    key = cenv.app_module.app.backend.get_key_for_task(task_id)
    value = cenv.broker.client().get(key)
    assert value is not None
    found: dict[str, Any] = json.loads(value)
    return found


def store(cenv: CeleryEnv, task_id: str, status: str, result: object) -> None:
    """A result stored for ``task_id`` as Celery's JSON encodes it."""
    key = cenv.app_module.app.backend.get_key_for_task(task_id)
    meta = {"status": status, "result": result, "traceback": None, "children": []}
    cenv.broker.client().set(key, json.dumps({**meta, "task_id": task_id}))


def lock_held(cenv: CeleryEnv, item: str) -> bool:
    name = cenv.app_module.work.singleton_options().key.derive((item,), {})
    return bool(cenv.lock_client().exists(f"t:{{{name}}}"))


class TestTheResultWrite:
    def test_a_success_stored_already_is_left_as_it_is(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        # A lost worker's copy of a task that ran again finishes last: Celery keeps the
        # success it finds, and so does the write that reads it in its own step.
        work, item, task_id = (
            cenv.app_module.work,
            f"kept-{uuid.uuid4().hex[:8]}",
            str(uuid.uuid4()),
        )
        store(cenv, task_id, states.SUCCESS, "the first run's")
        work.apply_async((item,), task_id=task_id, queue=worker.queue)
        wait_for(lambda: any(r["item"] == item for r in runs(cenv)), 20, "the run")
        # The release goes in the result's write (or after it): once free, it was sent.
        wait_for(lambda: not lock_held(cenv, item), 10, "the key freed")
        assert stored(cenv, task_id)["result"] == "the first run's"
        assert stored(cenv, task_id)["status"] == states.SUCCESS

    def test_anything_else_stored_is_replaced_and_published(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work, item, task_id = cenv.app_module.work, f"new-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
        backend = cenv.app_module.app.backend
        store(cenv, task_id, states.STARTED, {"pid": 1, "hostname": "lost"})
        listener = cenv.broker.client().pubsub()
        listener.subscribe(backend.get_key_for_task(task_id))
        assert wait_for(lambda: listener.get_message(timeout=0.1), 5, "the subscription")
        result = work.apply_async((item,), task_id=task_id, queue=worker.queue)
        assert result.get(timeout=20) == item
        # (the run's STARTED is published first: the test app tracks starts)
        statuses: list[str] = []

        def success_published() -> bool:
            message = listener.get_message(timeout=0.1)
            if message is not None and message["type"] == "message":
                statuses.append(json.loads(message["data"])["status"])
            return states.SUCCESS in statuses

        wait_for(success_published, 5, "the success published")
        listener.close()
        assert stored(cenv, task_id)["result"] == item
        key = backend.get_key_for_task(task_id)
        assert 0 < cenv.broker.client().ttl(key) <= backend.expires  # result_expires kept
        wait_for(lambda: not lock_held(cenv, item), 10, "the key freed")

    @pytest.mark.parametrize(
        ("status", "kept"),
        [(states.SUCCESS, True), (states.STARTED, False)],
        ids=["success", "other"],
    )
    def test_a_stored_value_too_large_to_read_in_the_write_is_read_as_celery_reads_it(
        self, cenv: CeleryEnv, worker: Worker, status: str, kept: bool
    ) -> None:
        # Past what the write's own step reads (store_result.lua's ARGV[3]), Celery's
        # code reads it: a success is kept, anything else replaced, as always.
        work, item, task_id = cenv.app_module.work, f"big-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
        big = "x" * (READ_IN_SCRIPT + 1)
        store(cenv, task_id, status, big)
        result = work.apply_async((item,), task_id=task_id, queue=worker.queue)
        wait_for(lambda: any(r["item"] == item for r in runs(cenv)), 20, "the run")
        wait_for(lambda: not lock_held(cenv, item), 10, "the key freed")
        if kept:
            assert stored(cenv, task_id)["result"] == big
        else:
            assert result.get(timeout=20) == item
            assert stored(cenv, task_id)["status"] == states.SUCCESS


class TestAWait:
    def test_a_result_stored_without_its_message_as_the_wait_starts_is_read_still(
        self, cenv: CeleryEnv
    ) -> None:
        """Celery's consumer subscribes as a wait starts and now and then misses a message
        published just then: the wait reads the stored result again a second later,
        instead of waiting for its timeout. Here the message is never published at all."""
        app = cenv.app_module.app
        task_id = str(uuid.uuid4())
        key = app.backend.get_key_for_task(task_id)
        subscribed = app.backend.result_consumer.subscribed_to

        def store_once_subscribed() -> None:
            wait_for(lambda: key in subscribed, 10, "the wait subscribed")
            store(cenv, task_id, states.SUCCESS, "stored")

        storing = threading.Thread(target=store_once_subscribed, daemon=True)
        storing.start()
        try:
            assert app.AsyncResult(task_id).get(timeout=10) == "stored"
        finally:
            storing.join(timeout=15)
