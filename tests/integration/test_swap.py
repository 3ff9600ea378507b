"""``swap`` (a holder handed to another, never taken from nobody) and ``unless_replaced``,
on a real redis-server and the in-memory store."""

from __future__ import annotations

import pytest
import redis

from celery_singleton_lock import Contended, Lease, MemoryLock, RedisLock
from celery_singleton_lock.lease import HOLD, TakeOver


@pytest.fixture(name="store", params=["redis", "memory"])
def fixture_store(request: pytest.FixtureRequest, raw: redis.Redis) -> RedisLock | MemoryLock:
    if request.param == "memory":
        return MemoryLock(prefix="sw")
    return RedisLock(raw, prefix="sw")


class TestSwap:
    def test_passes_only_from_the_expected_holder(self, store: RedisLock | MemoryLock) -> None:
        store.try_acquire("a", 30, token="old", take=HOLD)
        assert isinstance(store.swap("a", "someone-else", 30, token="new"), Contended)
        assert store.holder("a") == "old"
        swapped = store.swap("a", "old", 30, token="new")
        assert isinstance(swapped, Lease)
        assert swapped.fence == 0
        assert store.holder("a") == "new"

    def test_never_takes_a_free_lock(self, store: RedisLock | MemoryLock) -> None:
        refused = store.swap("free", "old", 30, token="new")
        assert isinstance(refused, Contended)
        assert refused.holder == ""
        assert store.holder("free") is None

    def test_a_replaced_token_is_refused_even_once_the_lock_is_free(
        self, store: RedisLock | MemoryLock
    ) -> None:
        store.try_acquire("r", 30, token="old", take=HOLD)
        newer = store.swap("r", "old", 30, token="new", record="old-as-queued")
        assert isinstance(newer, Lease)
        store.release(newer)  # the replacement ran and let go
        refused = store.try_acquire(
            "r", 30, token="late", take=TakeOver(unless_replaced="old-as-queued")
        )
        assert isinstance(refused, Contended)
        assert refused.replaced
        assert store.holder("r") is None
        fine = store.try_acquire(
            "r", 30, token="late", take=TakeOver(unless_replaced="never-replaced")
        )
        assert isinstance(fine, Lease)

    def test_the_record_expires_with_the_hold(self, raw: redis.Redis) -> None:
        store = RedisLock(raw, prefix="sw")
        store.try_acquire("e", 30, token="old", take=HOLD)
        store.swap("e", "old", 5, token="new")
        assert 0 < raw.pttl(store.keys("e").replaced) <= 5000
