from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from celery_singleton_lock import RedisLock

from .support.servers import DbView, RedisServer
from .support.workers import Worker


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


def redis_version(client: redis.Redis) -> tuple[int, int]:
    major, minor = str(client.info("server")["redis_version"]).split(".")[:2]
    return int(major), int(minor)


@pytest.fixture(name="redis7")
def fixture_redis7(raw: redis.Redis) -> None:
    """Skip on a server older than Redis 7.0 (the version matrix runs 6.2)."""
    if redis_version(raw) < (7, 0):
        pytest.skip("needs Redis >= 7.0 (SET with both NX and GET); this server is older")


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


# The Celery tests' lock store: database 1 of the broker's server, the production default
# on a Redis broker (the hold rides the push, the take the unacked pipeline), unless
# CSL_LOCK_SERVER=separate gives it a server of its own (a matrix combination does).
SAME_SERVER = os.environ.get("CSL_LOCK_SERVER", "broker") != "separate"
# For a test that counts the lock store's round trips apart from the broker's.
separate_lock_server = pytest.mark.skipif(
    SAME_SERVER, reason="counts the lock store's round trips apart from the broker's"
)


@dataclass
class CeleryEnv:
    """Servers for the Celery tests: broker/backend, lock store, checker, and the app."""

    broker: RedisServer
    lock: RedisServer
    checker: RedisServer
    env: dict[str, str]
    app_module: Any

    def lock_client(self) -> redis.Redis:
        return self.lock.client()

    def checker_client(self) -> redis.Redis:
        return self.checker.client()


@pytest.fixture(name="celery_env", scope="session")
def fixture_celery_env(checker_server: RedisServer) -> Iterator[CeleryEnv]:
    broker = RedisServer().start()
    lock: Any = DbView(broker, 1) if SAME_SERVER else RedisServer().start()
    env = {
        "CSL_BROKER_URL": broker.url,
        "CSL_LOCK_URL": lock.url,
        "CSL_CHECK_URL": checker_server.url,
    }
    # The app module reads its configuration from the environment at import.
    os.environ.update(env)
    module = importlib.import_module("tests.support.celery_app")
    try:
        yield CeleryEnv(broker, lock, checker_server, env, module)
    finally:
        broker.cleanup()
        lock.cleanup()


@pytest.fixture(name="worker", scope="session")
def fixture_worker(celery_env: CeleryEnv) -> Iterator[Worker]:
    """The shared worker (concurrency 2) for tests that do not kill it: prefork, or the
    pool ``CSL_SHARED_POOL`` names (to run a file's tests on gevent, threads, ...)."""
    worker = Worker(celery_env.env, pool=os.environ.get("CSL_SHARED_POOL", "prefork")).start()
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(autouse=True)
def _settled_pool(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the shared worker, wait for its pool to replace any child the
    test killed (or a time limit or revoke ended), so the next test has both."""
    yield
    if "worker" in request.fixturenames:
        request.getfixturevalue("worker").settle()


@pytest.fixture(name="cenv")
def fixture_cenv(celery_env: CeleryEnv) -> CeleryEnv:
    """The Celery environment with an empty lock store and checker.

    A lock store of its own also forgets its scripts, as after a restart: every test
    then runs the first call of each script on a server that answers NOSCRIPT. Not the
    broker's server: kombu's own timers run their scripts there (the restore mutex's
    release), and a flush under them is no restart (tests that flush it say so).
    """
    for server in (celery_env.lock, celery_env.checker):
        if server.process is None:
            server.start()
        client = server.client()
        if isinstance(server, DbView):
            client.flushdb()  # the broker's queues stay
        else:
            client.flushall()
        if server is celery_env.lock and not isinstance(server, DbView):
            client.script_flush()
        client.close()
    return celery_env
