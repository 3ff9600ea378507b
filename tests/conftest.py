from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from celery_singleton_lock import RedisLock

from .servers import RedisServer


@pytest.fixture(name="redis_server", scope="session")
def fixture_redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(name="checker_server", scope="session")
def fixture_checker_server() -> Iterator[RedisServer]:
    """A second server, outside the lock store, where tests record what they observed."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(name="raw")
def fixture_raw(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain client on a flushed lock store, for looking at keys behind the lock's back."""
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture(name="client", params=[False, True], ids=["bytes", "decoded"])
def fixture_client(
    request: pytest.FixtureRequest, raw: redis.Redis, redis_server: RedisServer
) -> Iterator[redis.Redis]:
    client = redis_server.client(decode_responses=request.param)
    yield client
    client.close()


@pytest.fixture(name="lock")
def fixture_lock(client: redis.Redis) -> RedisLock:
    return RedisLock(client, prefix="test")
