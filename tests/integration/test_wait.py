"""Blocking acquire: push wake-ups, FIFO, TTL-capped waits and the spin fallback."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import pytest
import redis

from celery_singleton_lock import Lease, LockNotAcquiredError, RedisLock


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def blocked_clients(raw: redis.Redis) -> int:
    return int(raw.info("clients")["blocked_clients"])


class TestPushWakeUp:
    def test_waiter_acquires_within_milliseconds_of_release(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        latencies = []
        for _ in range(30):
            holder = lock.acquire("job", ttl=30, blocking=False)
            acquired_at: list[float] = []

            def waiter(acquired_at: list[float] = acquired_at) -> None:
                lease = lock.acquire("job", ttl=30, timeout=10)
                acquired_at.append(time.perf_counter())
                lock.release(lease)

            thread = threading.Thread(target=waiter)
            thread.start()
            wait_for(lambda: blocked_clients(raw) == 1)
            released_at = time.perf_counter()
            lock.release(holder)
            thread.join(10)
            assert acquired_at, "waiter did not acquire"
            latencies.append(acquired_at[0] - released_at)
        median = statistics.median(latencies)
        print(
            f"\nwake-up latency over {len(latencies)} hand-offs: median {median * 1000:.2f} ms, "
            f"max {max(latencies) * 1000:.2f} ms"
        )
        # The holder's TTL is 30 s: anything but a push wake-up would take that long.
        assert median < 0.25

    def test_waiters_are_woken_in_fifo_order(self, lock: RedisLock, raw: redis.Redis) -> None:
        holder = lock.acquire("job", ttl=30, blocking=False)
        order: list[int] = []
        threads = []
        for i in range(4):

            def waiter(i: int = i) -> None:
                lease = lock.acquire("job", ttl=30, timeout=20)
                order.append(i)
                lock.release(lease)

            thread = threading.Thread(target=waiter)
            thread.start()
            threads.append(thread)
            wait_for(lambda n=i + 1: blocked_clients(raw) == n)
        lock.release(holder)
        for thread in threads:
            thread.join(20)
        assert order == [0, 1, 2, 3]

    def test_holder_that_dies_without_releasing_costs_at_most_its_ttl(
        self, lock: RedisLock
    ) -> None:
        lock.acquire("job", ttl=0.5, blocking=False)  # never released
        started = time.monotonic()
        lease = lock.acquire("job", ttl=5, timeout=10)
        waited = time.monotonic() - started
        assert isinstance(lease, Lease)
        assert 0.3 < waited < 2.0

    def test_timeout_raises_naming_the_holder(self, lock: RedisLock) -> None:
        lock.acquire("job", ttl=30, blocking=False, token="busy-owner")
        started = time.monotonic()
        with pytest.raises(LockNotAcquiredError) as caught:
            lock.acquire("job", ttl=5, timeout=0.3)
        assert 0.25 < time.monotonic() - started < 2.0
        assert caught.value.holder == "busy-owner"
        assert caught.value.retry_after is not None

    def test_no_wake_up_is_lost_under_rapid_hand_offs(self, lock: RedisLock) -> None:
        # Every hand-off leaves only a sliver between a waiter's failed try and its BLPOP;
        # a lost wake-up would show as a wait of the holder's full 30 s TTL.
        rounds = 100
        waits: list[float] = []
        errors: list[BaseException] = []

        def contender() -> None:
            try:
                for _ in range(rounds):
                    started = time.monotonic()
                    lease = lock.acquire("job", ttl=30, timeout=20)
                    waits.append(time.monotonic() - started)
                    lock.release(lease)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=contender) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        assert len(waits) == 3 * rounds
        assert max(waits) < 5.0

    def test_uncontended_release_writes_no_signal_keys(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        lock.release(lock.acquire("job", ttl=5))
        keys = lock.keys("job")
        assert not raw.exists(keys.signal, keys.waiters)


class TestSpin:
    def test_spin_waiter_acquires_after_release_without_blocking_a_connection(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        holder = lock.acquire("job", ttl=30, blocking=False)
        timer = threading.Timer(0.2, lock.release, args=(holder,))
        timer.start()
        started = time.monotonic()
        lease = lock.acquire("job", ttl=5, timeout=5, wait="spin")
        timer.join()
        assert time.monotonic() - started < 2.0
        assert blocked_clients(raw) == 0
        assert not raw.exists(lock.keys("job").waiters)
        lock.release(lease)

    def test_spin_respects_the_deadline(self, lock: RedisLock) -> None:
        lock.acquire("job", ttl=30, blocking=False)
        started = time.monotonic()
        with pytest.raises(LockNotAcquiredError):
            lock.acquire("job", ttl=5, timeout=0.3, wait="spin")
        assert time.monotonic() - started < 1.5


class TestFrozenServer:
    """A server that stops answering (SIGSTOP here; a partition drops the answer the same
    way), mid-wait or before a try's answer: the waiting client has no socket timeout,
    yet every kind of push wait ends by its own timeout plus ``GRACE`` as an outage, and
    a try unanswered within ``GRACE`` ends it the same way, never for ever."""

    @pytest.mark.parametrize("frozen", ["mid-wait", "before the first answer"])
    @pytest.mark.parametrize("kind", ["lock", "slots", "asyncio"])
    def test_a_wait_ends_when_the_server_freezes(self, kind: str, frozen: str) -> None:
        import asyncio

        from celery_singleton_lock import LockStoreUnavailableError
        from celery_singleton_lock.lease import client_from_url
        from celery_singleton_lock.lease.redis.waits import GRACE

        from ..support.servers import RedisServer

        server = RedisServer().start()
        try:
            holder = RedisLock(server.client(), prefix="t")
            holder.acquire("job", ttl=30, blocking=False)
            holder.slots.try_acquire("job-n", 1, 30)
            waiting = client_from_url(server.url, {"socket_timeout": None})
            # Connected first: a sync client's handshake on a new connection has no
            # bound of its own (the asyncio one's is in its first try's).
            waiting.ping()
            freezer = threading.Timer(0.3 if frozen == "mid-wait" else 0.0, server.pause)
            freezer.start()
            if frozen != "mid-wait":
                freezer.join()
            began = time.monotonic()
            waits: dict[str, Callable[[], object]] = {
                "lock": lambda: RedisLock(waiting, prefix="t").acquire("job", 30, timeout=1.0),
                "slots": lambda: RedisLock(waiting, prefix="t").slots.acquire(
                    "job-n", 1, 30, timeout=1.0
                ),
                "asyncio": lambda: asyncio.run(self._wait_async(server.url)),
            }
            with pytest.raises(LockStoreUnavailableError, match="unanswered"):
                waits[kind]()
            took = time.monotonic() - began
        finally:
            freezer.cancel()
            server.resume()
            server.cleanup()
        assert took <= 1.0 + GRACE + 0.5

    @staticmethod
    async def _wait_async(url: str) -> None:
        import redis.asyncio

        from celery_singleton_lock.lease import AsyncRedisLock

        client = redis.asyncio.Redis.from_url(url)
        try:
            await AsyncRedisLock(client, prefix="t").acquire("job", ttl=30, timeout=1.0)
        finally:
            await client.aclose()
