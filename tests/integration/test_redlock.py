"""Redlock over 3 and 5 redis-server processes started here: the algorithm, its fences,
its configuration, and the Celery integration through ``singleton_lock_url``. Masters
killed, frozen, restarted empty or with a stepped clock: tests/chaos/test_redlock.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from celery_singleton_lock import (
    ConfigurationError,
    Contended,
    LockStoreUnavailableError,
    Redlock,
    ReleaseResult,
)
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.lease import rates_of
from celery_singleton_lock.lease.redis.urls import redlock_masters
from celery_singleton_lock.lease.redlock import masters as redlock_module

from ..conftest import CeleryEnv
from ..support.apps import app_with, lock_url
from ..support.redlock import held, masters, store, url_of
from ..support.runs import assert_no_overlap, runs, wait_for
from ..support.servers import RedisServer
from ..support.workers import Worker

pytestmark = pytest.mark.slow

APP = "tests.support.celery_app"


class TestConfiguration:
    def test_the_url_names_every_master_and_hides_the_password(self) -> None:
        assert redlock_masters("redlock://:s3cret@h1:7000,h2,[::1]:7002/2?protocol=3") == [
            "redis://:s3cret@h1:7000/2?protocol=3",
            "redis://:s3cret@h2:6379/2?protocol=3",
            "redis://:s3cret@[::1]:7002/2?protocol=3",
        ]
        assert redlock_masters("redlocks://a:1,b:2,c:3")[0] == "rediss://a:1"
        lock = Redlock.from_url("redlock://:s3cret@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        assert "s3cret" not in repr(lock)
        assert "s3cret" not in lock.where

    def test_too_few_masters_replicas_and_rates_are_refused_with_what_to_write(self) -> None:
        with pytest.raises(ConfigurationError, match=r"at least 3 .*redlock://host1"):
            Redlock.from_url("redlock://127.0.0.1:1,127.0.0.1:2")
        app = app_with(
            singleton_lock_url="redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
            singleton_lock_replicas=1,
        )
        with pytest.raises(ConfigurationError, match="remove singleton_lock_replicas"):
            LockStores.for_app(app).lock  # noqa: B018
        lock = Redlock.from_url("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        with pytest.raises(ConfigurationError, match="standalone, Sentinel or Cluster"):
            rates_of(lock)


def test_a_master_that_may_evict_keys_is_named_at_worker_start() -> None:
    with masters(3, RedisServer("--maxmemory-policy", "allkeys-lru")) as servers:
        servers[1].kill()  # one master down: the others are still checked
        app = app_with(singleton_lock_url=url_of(servers))
        assert LockStores.for_app(app).eviction_policy() == "allkeys-lru"


@pytest.mark.parametrize("count", [3, 5])
def test_a_majority_holds_one_lease_and_fences_rise_across_holders(count: int) -> None:
    with masters(count) as servers:
        lock = store(servers)
        # Connected first: a try waits a quarter of its ttl for the masters (1.25 s
        # here), new connections' set-up included, which a loaded machine can exceed.
        assert lock.holder("job") is None
        first = held(lock.try_acquire("job", 5))
        other = lock.try_acquire("job", 5)
        assert isinstance(other, Contended)
        assert other.holder == first.token
        assert lock.holder("job") == first.token
        assert [h.token for h in lock.holdings()] == [first.token]
        assert 0 < first.remaining() <= 5 * 0.99
        assert lock.release(first) is ReleaseResult.RELEASED
        fences = [first.fence]
        for _ in range(5):
            lease = held(lock.try_acquire("job", 5))
            fences.append(lease.fence)
            lock.release(lease)
        assert fences == sorted(set(fences))
        # Every master has the last fence (or its own greater one, from a grant that
        # came after the majority's): any later majority builds on it.
        key = lock.keys("job").fence
        assert all(int(s.client().get(key)) >= fences[-1] for s in servers)
        assert lock.holder("job") is None
        # Limit 2: two slots, each a Redlock lease of its own; a third waits.
        slots = [held(lock.slots.try_acquire("lim", 2, 5)) for _ in range(2)]
        assert isinstance(lock.slots.try_acquire("lim", 2, 5), Contended)
        lock.release(slots[0])
        held(lock.slots.try_acquire("lim", 2, 5))


def test_a_grant_that_lands_after_its_failed_try_was_given_back_undoes_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A try decides without waiting for a frozen master, so its take there can land
    after the give-back (whose own turn in that master's pool may come too late to be
    sent). It must not hold that master for the ttl: the caller's next try would meet
    its own leftover as the holder (a Celery delivery then took itself for a running
    copy of its task and was dropped: a lost call, seen on a loaded machine)."""
    monkeypatch.setattr(redlock_module, "ANSWER_WAIT", 1.0)  # the deadlines, not the point
    with masters(3) as servers:
        # A socket timeout past the freeze: calls to the frozen master stay in flight.
        lock = Redlock.from_url(url_of(servers), prefix="rl", socket_timeout=30)
        frozen = servers[2]
        key = lock.keys("late").lock
        servers[0].client().set(key, "someone-else", px=60_000)
        frozen.pause()
        try:
            # Three of the frozen master's four pool threads stuck on reads of its own...
            readers = [threading.Thread(target=lock.holder, args=("other",)) for _ in range(3)]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join(10)
            # ...the take on the fourth, so the give-back waits past its deadline, unsent.
            outcome = lock.try_acquire("late", 30)
            assert isinstance(outcome, Contended)
            assert outcome.holder == "someone-else"  # never the try's own token
        finally:
            frozen.resume()
        frozen_client = frozen.client()
        wait_for(lambda: frozen_client.get(key) is None, 5, "the late grant undone")
        assert servers[1].client().get(key) is None  # the grant the try did count: given back


@pytest.fixture(name="redlock_env")
def fixture_redlock_env(cenv: CeleryEnv) -> Iterator[tuple[CeleryEnv, list[RedisServer]]]:
    with masters(3) as servers, lock_url(cenv, url_of(servers)) as env:
        yield env, servers


def test_celery_end_to_end_on_a_redlock(redlock_env: tuple[CeleryEnv, list[RedisServer]]) -> None:
    cenv, servers = redlock_env
    worker = Worker(cenv.env, extra_env={"CSL_LOCK_URL": url_of(servers)}).start()
    try:
        work = cenv.app_module.work
        first = work.apply_async(("r", 1.0), queue=worker.queue)
        second = work.apply_async(("r", 1.0), queue=worker.queue)
        assert second.id == first.id  # deduplicated at dispatch, on a majority
        assert first.get(timeout=30) == "r"
        app = cenv.app_module.app
        servers[0].kill()  # one master down: everything still runs, one at a time
        copies = [app.send_task(f"{APP}.work", ("o", 0.3), queue=worker.queue) for _ in range(3)]
        for result in copies:
            assert result.get(timeout=60) == "o"
        records = [r for r in runs(cenv) if r["item"] == "o"]
        assert len(records) == 3
        assert_no_overlap(records)  # excluded at execution, fences increasing
        servers[1].kill()  # a majority gone: dispatch is the outage path (fail_closed here)
        with pytest.raises(LockStoreUnavailableError):
            work.apply_async(("down", 0.1), queue=worker.queue)
        for server in servers[1:2]:
            server.start()
        wait_for(
            lambda: (
                not any(
                    k
                    for s in servers[1:]
                    for k in redis.Redis(port=s.port).scan_iter("t:*")
                    if not k.endswith(b":fence")
                )
            ),
            5,
            "every lock released",
        )
    finally:
        worker.stop()


@pytest.mark.parametrize(
    "pool",
    [
        # (the green pools in CI's one-offs: the inner loop runs the default shape)
        pytest.param("gevent", marks=pytest.mark.oneoff),
        pytest.param("eventlet", marks=pytest.mark.oneoff),
        "threads",
    ],
)
def test_every_pool_keeps_copies_apart_on_a_redlock(
    redlock_env: tuple[CeleryEnv, list[RedisServer]], pool: str
) -> None:
    """The masters are asked at once from a thread pool per master: under gevent and
    eventlet those threads are green, as Celery patches them."""
    cenv, servers = redlock_env
    worker = Worker(cenv.env, pool=pool, concurrency=4,
                    extra_env={"CSL_LOCK_URL": url_of(servers)}).start()  # fmt: skip
    try:
        app = cenv.app_module.app
        copies = [app.send_task(f"{APP}.swarm", (f"p-{pool}", 0.05), queue=worker.queue)
                  for _ in range(6)]  # fmt: skip
        assert [r.get(timeout=60) for r in copies] == [f"p-{pool}"] * 6
        records = [r for r in runs(cenv) if r["item"] == f"p-{pool}"]
        assert len(records) == 6
        assert_no_overlap(records)
    finally:
        worker.stop()
