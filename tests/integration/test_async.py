"""The asyncio twin: same scripts, same outcomes, push wake-ups and renewal on the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from celery_singleton_lock import (
    AsyncRedisLock,
    ConfigurationError,
    Contended,
    ExtendResult,
    Lease,
    LockLostError,
    LockNotAcquiredError,
    RedisLock,
    ReleaseResult,
)

from ..support.servers import RedisServer


def run_with_lock(
    redis_server: RedisServer, decode: bool, body: Callable[[AsyncRedisLock], Awaitable[Any]]
) -> Any:
    async def main() -> Any:
        client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=decode)
        try:
            return await asyncio.wait_for(body(AsyncRedisLock(client, prefix="test")), 20)
        finally:
            await client.aclose()

    return asyncio.run(main())


@pytest.fixture(name="decode", params=[False, True], ids=["bytes", "decoded"])
def fixture_decode(request: pytest.FixtureRequest, raw: redis.Redis) -> bool:
    return bool(request.param)


class TestAsyncLease:
    def test_outcomes_match_the_sync_lock(self, redis_server: RedisServer, decode: bool) -> None:
        async def body(lock: AsyncRedisLock) -> None:
            first = await lock.try_acquire("job", ttl=10, token="owner")
            assert isinstance(first, Lease)
            second = await lock.try_acquire("job", ttl=10)
            assert isinstance(second, Contended)
            assert second.holder == "owner"
            assert await lock.holder("job") == "owner"
            assert await lock.extend(first, ttl=20) is ExtendResult.EXTENDED
            assert await lock.release(first) is ReleaseResult.RELEASED
            assert await lock.release(first) is ReleaseResult.EXPIRED
            third = await lock.acquire("job", ttl=10, blocking=False)
            assert third.fence > first.fence
            with pytest.raises(LockNotAcquiredError):
                await lock.acquire("job", ttl=10, blocking=False)

        run_with_lock(redis_server, decode, body)

    def test_async_waiter_is_woken_by_a_sync_release(
        self, redis_server: RedisServer, decode: bool
    ) -> None:
        sync_lock = RedisLock(redis_server.client(), prefix="test")
        holder = sync_lock.acquire("job", ttl=30, blocking=False)

        async def body(lock: AsyncRedisLock) -> float:
            loop = asyncio.get_running_loop()
            loop.call_later(0.2, sync_lock.release, holder)
            started = time.monotonic()
            lease = await lock.acquire("job", ttl=5, timeout=10)
            waited = time.monotonic() - started
            await lock.release(lease)
            return waited

        waited = run_with_lock(redis_server, decode, body)
        assert 0.15 < waited < 2.0

    def test_spin_and_timeout(self, redis_server: RedisServer, decode: bool) -> None:
        async def body(lock: AsyncRedisLock) -> None:
            await lock.acquire("job", ttl=30, blocking=False, token="busy")
            with pytest.raises(LockNotAcquiredError) as caught:
                await lock.acquire("job", ttl=5, timeout=0.2, wait="spin")
            assert caught.value.holder == "busy"

        run_with_lock(redis_server, decode, body)

    def test_renewal_keeps_alive_and_reports_loss(
        self, redis_server: RedisServer, decode: bool, raw: redis.Redis
    ) -> None:
        async def body(lock: AsyncRedisLock) -> None:
            lease = await lock.acquire("job", ttl=1.0, renew=True)
            await asyncio.sleep(2.0)
            lease.check()
            lost = asyncio.Event()
            loop = asyncio.get_running_loop()
            lease.on_lost(lambda _: loop.call_soon(lost.set))
            raw.set(lease.key, "thief", px=10_000)
            await asyncio.wait_for(lost.wait(), 2)
            with pytest.raises(LockLostError):
                lease.check()
            renewed = await lock.acquire("other", ttl=0.3, renew=True)
            await lock.release(renewed)  # cancels its renewal task

        run_with_lock(redis_server, decode, body)

    def test_bad_input_is_refused_before_io(
        self, redis_server: RedisServer, raw: redis.Redis
    ) -> None:
        async def body(lock: AsyncRedisLock) -> None:
            with pytest.raises(ConfigurationError):
                await lock.try_acquire("", ttl=1)
            with pytest.raises(ConfigurationError):
                await lock.acquire("job", ttl=0)

        run_with_lock(redis_server, False, body)
        assert raw.dbsize() == 0
        with pytest.raises(ConfigurationError, match="RedisLock"):
            AsyncRedisLock(raw)  # type: ignore[arg-type]
