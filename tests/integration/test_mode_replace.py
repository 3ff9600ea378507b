"""``on_duplicate="replace"``: at dispatch (the broker's queue read directly) and in a worker."""

from __future__ import annotations

import pytest
import redis

from celery_singleton_lock.tokens import TOKEN_HEADER

from ..conftest import CeleryEnv
from ..support.modes import (
    QUEUE,
    held,
    messages,
    name_of,
    of,
    storm,
)
from ..support.runs import UNTIL_OPENED, open_gate, runs, started, wait_for
from ..support.workers import Worker


class TestReplaceDispatch:
    def test_later_calls_take_the_queued_calls_place_under_its_id(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        latest = cenv.app_module.latest
        first = latest.apply_async(("r1", "v1"), queue=QUEUE)
        later = [latest.apply_async(("r1", f"v{n}"), queue=QUEUE) for n in range(2, 6)]
        assert {r.id for r in later} == {first.id}
        sent = messages(queue, QUEUE)
        assert [m["id"] for m in sent] == [first.id] * 5
        assert [m["args"][1] for m in sent] == ["v5", "v4", "v3", "v2", "v1"]  # LPUSH order
        hold = cenv.lock_client().get(f"t:{{{name_of(latest, 'r1', 'v1')}}}:pending")
        assert hold.decode() == sent[0][TOKEN_HEADER], "the hold is the newest message's"

    def test_a_running_call_is_never_replaced(self, cenv: CeleryEnv, queue: redis.Redis) -> None:
        latest, store = cenv.app_module.latest_queued, cenv.app_module.latest_queued
        key = name_of(latest, "r2", "v1")
        lock = store.singleton_context.store
        running = lock.try_acquire(key, 10, token="x|h|1|n|the-running-one")
        assert latest.apply_async(("r2", "v2"), queue=QUEUE).id == "the-running-one"
        assert queue.llen(QUEUE) == 0
        lock.release(running)


class TestReplaceInAWorker:
    def test_the_pending_run_has_the_latest_arguments(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        latest = cenv.app_module.latest
        first = latest.apply_async(("r3", "v0", UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: started(cenv), 10, "first run")
        ids = storm(latest, "r3", worker.queue, calls=5, extra=("storm",))
        final = latest.apply_async(("r3", "final"), queue=worker.queue)
        open_gate(cenv, "r3")
        assert ids == {final.id} != {first.id}
        assert final.get(timeout=20) == "final"
        records = of(runs(cenv), "r3")
        assert [(r["id"], r["version"]) for r in records] == [
            (first.id, "v0"),
            (final.id, "final"),
        ], "replaced messages were dropped, not run"
        assert final.state == "SUCCESS"
        # The replaced messages (the final call's id) are dropped as they arrive: once
        # none is queued or in the worker, none can change the state any more.
        broker = cenv.broker.client()
        wait_for(
            lambda: broker.llen(worker.queue) == 0 and worker.idle(), 30, "no copy left anywhere"
        )
        assert latest.AsyncResult(final.id).result == "final"
        wait_for(lambda: not held(cenv), 3, "keys freed")

    def test_a_queued_call_takes_the_latest_arguments(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        latest = cenv.app_module.latest_queued
        first = latest.apply_async(("r4", "v1"), queue=worker.queue, countdown=1.0)
        second = latest.apply_async(("r4", "v2"), queue=worker.queue, countdown=1.0)
        assert second.id == first.id
        assert first.get(timeout=20) == "v2"
        assert [r["version"] for r in of(runs(cenv), "r4")] == ["v2"]
        wait_for(lambda: not held(cenv), 3, "keys freed")


class TestReplacedMessagesComingBack:
    """A worker killed with a queued message and its replacement in its prefetch: its
    reservation lapses, kombu restores both messages, and only the newest may run."""

    @pytest.mark.parametrize("task_name", ["latest", "latest_queued"])
    def test_a_replaced_message_never_takes_a_lapsed_hold_from_its_replacement(
        self, cenv: CeleryEnv, task_name: str
    ) -> None:
        task = getattr(cenv.app_module, task_name)
        queue = f"lapsed-{task_name}"
        first = task.apply_async(("r5", "v1"), queue=queue)
        assert task.apply_async(("r5", "v2"), queue=queue).id == first.id
        suffix = ":pending" if task_name == "latest" else ""
        # The dead worker's reservation of the replacement lapsed (its ttl ran out).
        assert cenv.lock_client().delete(f"t:{{{name_of(task, 'r5', 'v1')}}}{suffix}") == 1
        worker = Worker(cenv.env, queue=queue).start()
        try:
            assert first.get(timeout=20) == "v2"
            assert [r["version"] for r in of(runs(cenv), "r5")] == ["v2"]
            wait_for(lambda: not held(cenv), 5, "keys freed")
        finally:
            worker.stop()
