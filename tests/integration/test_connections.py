"""The lock store's connections stay few, whatever the number of threads or greenlets calling.

Each producer runs in its own process (green modes patch the standard library), on a
private broker and lock store; what it saw comes back as one JSON line.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_singleton_lock import Lease, LockStoreConfigurationError, RedisLock
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.lease import client_from_url

from ..conftest import CeleryEnv, separate_lock_server
from ..support.servers import RedisServer
from ..support.workers import Worker

ROOT = Path(__file__).resolve().parent.parent.parent
# Connections a producer may hold on the lock store at once: the dispatches of one wave
# overlap, and each exchange holds one connection only while its answer is read.
BOUND = 25
COUNT = int(os.environ.get("CSL_PRODUCER_COUNT", "300"))


@pytest.fixture(name="pair", scope="module")
def fixture_pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    broker, store = RedisServer().start(), RedisServer().start()
    try:
        yield broker, store
    finally:
        broker.cleanup()
        store.cleanup()


def produce(mode: str, count: int, pair: tuple[RedisServer, RedisServer]) -> dict[str, object]:
    broker, store = pair
    store.client().flushall()
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.producers", mode, str(count), broker.url, store.url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    print(result)  # the counts, for the test log
    return result


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["threads", "gevent", "eventlet"])
def test_every_call_from_a_new_thread_or_greenlet_succeeds_on_few_connections(
    mode: str, pair: tuple[RedisServer, RedisServer]
) -> None:
    if mode != "threads" and importlib.util.find_spec(mode) is None:
        pytest.skip(f"{mode} is not installed")  # looked up, not imported into this process
    result = produce(mode, COUNT, pair)
    assert result["errors"] == []
    assert result["ok"] == COUNT
    assert isinstance(result["peak_clients"], int)
    assert result["peak_clients"] <= BOUND
    _, store = pair
    assert len(list(store.client().scan_iter("singleton_lock:*"))) == COUNT  # one hold each


class TestOneProcess:
    def test_threads_that_end_leave_no_connection_checked_out(self, lock: RedisLock) -> None:
        def one(n: int) -> None:
            lease = lock.try_acquire(f"t-{n}", 10)
            assert isinstance(lease, Lease)
            lock.release_nowait(lease)  # answered later, by whichever call comes next

        for wave in range(5):
            threads = [threading.Thread(target=one, args=(wave * 50 + n,)) for n in range(50)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(10)
        lock.pipelining.read_owed()
        pool = lock.client.connection_pool
        # None is kept by a thread; one by the transport, for the next call.
        assert pool._in_use_connections == set(lock.pipelining._idle or ())  # type: ignore[attr-defined]
        # At most one per thread running at once (50), never one per thread ever (250).
        assert len(pool._available_connections) <= 50  # type: ignore[attr-defined]

    def test_threads_dispatching_their_first_call_at_once_share_one_store(
        self, redis_server: RedisServer
    ) -> None:
        # Each store has its own connection pool: two built at once would double the bound.
        app = Celery("first-use", set_as_current=False)
        app.conf.singleton_lock_url = redis_server.url
        backend = LockStores.for_app(app)
        start = threading.Barrier(30)
        seen: list[object] = []

        def first() -> None:
            start.wait(10)
            seen.append(backend.lock)

        threads = [threading.Thread(target=first) for _ in range(30)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(seen) == 30
        assert len({id(store) for store in seen}) == 1

    def test_a_full_client_pool_is_a_configuration_error(self, raw: redis.Redis) -> None:
        kwargs = raw.connection_pool.connection_kwargs
        client = redis.Redis(host=kwargs["host"], port=kwargs["port"], max_connections=1)
        lock = RedisLock(client, prefix="test")
        waiting = lock.begin_try_acquire("first", 10)  # holds the only connection
        with pytest.raises(LockStoreConfigurationError, match="max_connections"):
            lock.try_acquire("second", 10)
        assert isinstance(waiting.outcome(), Lease)


@pytest.mark.slow
@separate_lock_server  # on the broker's server, CLIENT LIST counts Celery's connections too
@pytest.mark.parametrize("pool", ["prefork", "threads", "gevent", "eventlet", "solo"])
def test_a_worker_keeps_its_lock_store_connections_bounded_over_many_tasks(
    pool: str, cenv: CeleryEnv
) -> None:
    """Every pool, green ones included: connections do not grow with the task count."""
    tasks = int(os.environ.get("CSL_WORKER_TASKS", "300"))
    store = cenv.lock_client()
    # Other tests' workers may be connected too: count only what this test opens.
    before = {c["id"] for c in store.client_list()}
    worker = Worker(cenv.env, pool=pool, concurrency=1 if pool == "solo" else 2).start()
    try:
        work = cenv.app_module.work
        results = [work.apply_async((f"{pool}-{n}",), queue=worker.queue) for n in range(tasks)]
        for result in results:
            result.get(timeout=120)
        # Celery 5.3's AsyncResult.__del__ unsubscribes from the result backend: let it
        # while the servers are up, not at interpreter exit (it would retry for ever).
        del results, result
        gc.collect()
        clients = [
            c
            for c in store.client_list()
            if c["id"] not in before and c.get("cmd") != "client|list"
        ]
        print({"pool": pool, "tasks": tasks, "lock_store_clients": len(clients)})
        # The producer (this process) and the worker's processes: a few each, however
        # many tasks ran.
        assert len(clients) <= 12
    finally:
        worker.stop()


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("form", ["unix://{path}?db=1", "redis+socket://{path}?virtual_host=1"])
def test_a_unix_socket_lock_store_connects_in_either_form_and_protocol(
    form: str, protocol: int
) -> None:
    """redis-py's own form and kombu's; RESP3 included (redis-py 7 and 8 would refuse a
    socket's connection for want of a host to send maintenance notifications to)."""
    server = RedisServer("--unixsocket", "SOCKET", "--unixsocketperm", "700")
    path = server.dir / "redis.sock"
    server.extra_args = [str(path) if a == "SOCKET" else a for a in server.extra_args]
    server.start()
    try:
        url = form.format(path=path)
        # As a task's lock store is built (a bounded pool), and as RedisLock.from_url does.
        bounded = RedisLock(client_from_url(url, {"protocol": protocol}, bounded=True), prefix="s")
        bounded.release(bounded.acquire("job", ttl=5))
        lock = RedisLock.from_url(url, prefix="sock", protocol=protocol)
        lease = lock.acquire("job", ttl=5)
        assert redis.Redis(unix_socket_path=str(path), db=1).exists(lease.key)
        lock.release(lease)
    finally:
        server.cleanup()
