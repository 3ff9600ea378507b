"""The fast paths: dispatch overlapping the lock's round trip, and lean script calls.

Against real Redis servers; no worker is needed, the broker's queue is read directly.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.signals import before_task_publish

from celery_singleton_lock import Contended, Lease, RedisLock
from celery_singleton_lock.task import KEY_HEADER, TOKEN_HEADER

from .conftest import CeleryEnv

QUEUE = "dispatch-path"


@pytest.fixture(name="queue")
def fixture_queue(cenv: CeleryEnv) -> Iterator[redis.Redis]:
    broker = cenv.broker.client()
    broker.delete(QUEUE)
    yield broker
    broker.delete(QUEUE)


def published(broker: redis.Redis) -> int:
    return int(broker.llen(QUEUE))


class TestOverlappedDispatch:
    def test_unique_is_published_with_its_hold_and_duplicates_are_not(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        first = work.apply_async(("p1",), queue=QUEUE)
        again = [work.apply_async(("p1",), queue=QUEUE) for _ in range(20)]
        assert {r.id for r in again} == {first.id}
        assert published(queue) == 1
        holder = cenv.lock_client().get(f"t:{{{work.singleton_options().key.derive(('p1',))}}}")
        assert holder is not None
        assert holder.decode().endswith(first.id)

    def test_a_before_task_publish_receiver_never_hears_of_a_refused_duplicate(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        heard: list[str] = []

        def receiver(headers: dict[str, Any] | None = None, **_: Any) -> None:
            heard.append((headers or {}).get("id", ""))

        work = cenv.app_module.work
        before_task_publish.connect(receiver, weak=False)
        try:
            first = work.apply_async(("p2",), queue=QUEUE)
            for _ in range(5):
                assert work.apply_async(("p2",), queue=QUEUE).id == first.id
        finally:
            before_task_publish.disconnect(receiver)
        assert heard == [first.id]
        assert published(queue) == 1

    def test_a_message_celery_refuses_to_build_gives_its_hold_back(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        with pytest.raises(ValueError, match="invalid literal"):  # parsed after the send
            work.apply_async(("p3",), queue=QUEUE, expires="not-a-date")
        assert published(queue) == 0
        assert cenv.lock_client().keys("t:*") == []
        assert work.apply_async(("p3",), queue=QUEUE) is not None
        assert published(queue) == 1

    def test_headers_carry_key_and_token_of_the_granted_hold(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        work.apply_async(("p4",), queue=QUEUE)
        message = queue.lrange(QUEUE, 0, -1)[0]
        headers = json.loads(message)["headers"]
        key = headers[KEY_HEADER]
        assert cenv.lock_client().get(f"t:{{{key}}}").decode() == headers[TOKEN_HEADER]

    def test_concurrent_dispatchers_publish_one_message_per_key(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        barrier = threading.Barrier(6)
        errors: list[BaseException] = []

        def dispatch() -> None:
            try:
                barrier.wait(5)
                for i in range(30):
                    work.apply_async((f"c{i % 5}",), queue=QUEUE)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=dispatch) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors
        assert published(queue) == 5


class TestLeanCalls:
    def test_acquire_by_the_holders_own_token_is_granted_again(self, lock: RedisLock) -> None:
        first = lock.try_acquire("own", 10, token="tok-1")
        assert isinstance(first, Lease)
        again = lock.try_acquire("own", 10, token="tok-1")
        assert isinstance(again, Lease)
        assert again.fence > first.fence
        assert isinstance(lock.try_acquire("own", 10, token="tok-2"), Contended)

    def test_unfenced_hold_has_fence_zero_and_writes_no_fence_key(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        hold = lock.try_acquire("quiet", 10, fenced=False)
        assert isinstance(hold, Lease)
        assert hold.fence == 0
        assert raw.exists(lock.keys("quiet").fence) == 0

    def test_script_flushed_from_the_server_is_reloaded(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        assert isinstance(lock.try_acquire("flushed-1", 10), Lease)
        raw.script_flush()
        lease = lock.try_acquire("flushed-2", 10)
        assert isinstance(lease, Lease)
        raw.script_flush()
        assert lock.release(lease).name == "RELEASED"

    def test_killed_connection_is_replaced_and_the_call_retried(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        assert isinstance(lock.try_acquire("killed-1", 10), Lease)
        raw.client_kill_filter(_type="normal", skipme=True)
        lease = lock.try_acquire("killed-2", 10)
        assert isinstance(lease, Lease)
        assert raw.get(lease.key) is not None

    def test_begin_then_outcome_overlaps_other_calls_on_the_same_thread(
        self, lock: RedisLock
    ) -> None:
        pending = lock.begin_try_acquire("nested-1", 10)
        # The thread's own connection waits on that reply; this call borrows another.
        inner = lock.try_acquire("nested-2", 10)
        outcome = pending.outcome()
        assert isinstance(outcome, Lease)
        assert isinstance(inner, Lease)
        assert pending.outcome() is outcome

    def test_presumed_lease_of_an_unfenced_hold_renews_and_releases(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        pending = lock.begin_try_acquire("presumed", 10, fenced=False)
        lease = pending.presumed()
        assert lease is not None
        assert lease.token == pending.outcome().token  # type: ignore[union-attr]
        assert lock.extend(lease).name == "EXTENDED"
        assert lock.release(lease).name == "RELEASED"
        assert raw.exists(lease.key) == 0

    def test_presumed_needs_an_unfenced_acquire(self, lock: RedisLock) -> None:
        pending = lock.begin_try_acquire("fenced", 10)
        with pytest.raises(RuntimeError):
            pending.presumed()
        pending.outcome()
