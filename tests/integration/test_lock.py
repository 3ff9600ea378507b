"""The lease against a real redis-server: ownership, outcomes, fencing, key layout, bad input."""

from __future__ import annotations

import itertools
import pickle
import threading
import time
from datetime import timedelta

import pytest
import redis
from redis.crc import key_slot

from celery_singleton_lock import (
    ConfigurationError,
    Contended,
    ExtendResult,
    Lease,
    LockLostError,
    LockNotAcquiredError,
    LockStoreUnavailableError,
    MemoryLock,
    RedisLock,
    ReleaseResult,
)
from celery_singleton_lock.lease import TakeOver

from ..support.runs import wait_for
from ..support.servers import RedisServer


def held(result: Lease | Contended) -> Lease:
    assert isinstance(result, Lease), result
    return result


def wait_until_gone(raw: redis.Redis, key: str, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while raw.exists(key):
        assert time.monotonic() < deadline, f"{key} did not expire"
        time.sleep(0.005)


class TestAcquire:
    def test_first_acquire_wins_and_second_sees_holder_and_ttl(self, lock: RedisLock) -> None:
        first = held(lock.try_acquire("job", ttl=10, token="owner-1"))
        second = lock.try_acquire("job", ttl=10)
        assert isinstance(second, Contended)
        assert second.holder == "owner-1"
        assert second.retry_after is not None
        assert 9.0 < second.retry_after <= 10.0
        assert first.token == "owner-1"
        assert lock.holder("job") == "owner-1"

    def test_lease_expiry_estimate_is_server_ttl_minus_round_trip_and_drift(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        from celery_singleton_lock.lease.lease import valid_until

        before = time.monotonic()
        lease = held(lock.try_acquire("job", ttl=2))
        after = time.monotonic()
        # Counted from the send, less 1 % and 2 ms for a clock slower than the server's.
        assert valid_until(before, 2) <= lease.expires_at <= valid_until(after, 2)
        assert lease.expires_at == pytest.approx(after + 2 - 0.022, abs=0.01)
        assert 1900 < raw.pttl(lease.key) <= 2000

    def test_durations_accept_timedelta(self, lock: RedisLock, raw: redis.Redis) -> None:
        lease = held(lock.try_acquire("job", ttl=timedelta(milliseconds=1500)))
        assert lease.ttl == 1.5
        assert 1400 < raw.pttl(lease.key) <= 1500

    def test_non_blocking_acquire_raises_naming_the_holder(self, lock: RedisLock) -> None:
        held(lock.try_acquire("job", ttl=10, token="owner-1"))
        with pytest.raises(LockNotAcquiredError) as caught:
            lock.acquire("job", ttl=10, blocking=False)
        assert caught.value.holder == "owner-1"
        assert "owner-1" in str(caught.value)
        assert caught.value.key == "test:{job}"

    def test_lock_frees_itself_when_ttl_runs_out(self, lock: RedisLock) -> None:
        held(lock.try_acquire("job", ttl=0.05))
        time.sleep(0.1)
        held(lock.try_acquire("job", ttl=1))

    def test_foreign_value_is_an_unknown_holder_until_its_ttl(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        key = lock.keys("job").lock
        raw.hset(key, "not", "ours")  # wrong type: GET would raise WRONGTYPE
        raw.pexpire(key, 100)
        contended = lock.try_acquire("job", ttl=1)
        assert isinstance(contended, Contended)
        assert contended.holder == ""
        assert "unknown owner" in str(contended.error())
        wait_until_gone(raw, key)
        held(lock.try_acquire("job", ttl=1))

    def test_foreign_key_without_ttl_reports_no_retry_after(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        raw.set(lock.keys("job").lock, "garbage")
        contended = lock.try_acquire("job", ttl=1)
        assert isinstance(contended, Contended)
        assert contended.holder == "garbage"
        assert contended.retry_after is None


class TestOwnership:
    def test_release_by_owner_deletes_and_reports_released(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        lease = held(lock.try_acquire("job", ttl=10))
        assert lock.release(lease) is ReleaseResult.RELEASED
        assert not raw.exists(lease.key)

    def test_release_and_extend_by_non_owner_fail_and_change_nothing(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        owner = held(lock.try_acquire("job", ttl=10, token="owner"))
        impostor = Lease.granted(
            owner.name, owner.key, "impostor", fence=owner.fence, ttl=100, sent_at=0
        )
        pttl_before = raw.pttl(owner.key)
        assert lock.release(impostor) is ReleaseResult.NOT_OWNER
        assert lock.extend(impostor, ttl=100) is ExtendResult.NOT_OWNER
        assert raw.get(owner.key) == b"owner"
        assert raw.pttl(owner.key) <= pttl_before
        assert impostor.lost
        with pytest.raises(LockLostError, match="another owner holds it"):
            impostor.check()

    def test_late_release_of_expired_lease_does_not_delete_successor(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        stale = held(lock.try_acquire("job", ttl=0.05, token="stale"))
        wait_until_gone(raw, stale.key)
        successor = held(lock.try_acquire("job", ttl=10, token="successor"))
        assert lock.release(stale) is ReleaseResult.NOT_OWNER
        assert lock.extend(stale) is ExtendResult.NOT_OWNER
        assert raw.get(successor.key) == b"successor"
        assert successor.fence > stale.fence

    def test_release_and_extend_of_expired_lease_report_expired(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        lease = held(lock.try_acquire("job", ttl=0.05))
        wait_until_gone(raw, lease.key)
        assert lock.extend(lease) is ExtendResult.EXPIRED
        assert lease.lost
        assert lock.release(lease) is ReleaseResult.EXPIRED

    def test_extend_resets_ttl_and_expiry_estimate(self, lock: RedisLock, raw: redis.Redis) -> None:
        lease = held(lock.try_acquire("job", ttl=1))
        old_estimate = lease.expires_at
        assert lock.extend(lease, ttl=30) is ExtendResult.EXTENDED
        assert 29000 < raw.pttl(lease.key) <= 30000
        assert lease.expires_at > old_estimate + 28
        lease.check()

    def test_lease_released_from_another_thread(self, lock: RedisLock, raw: redis.Redis) -> None:
        lease = held(lock.try_acquire("job", ttl=10))
        results: list[ReleaseResult] = []
        worker = threading.Thread(target=lambda: results.append(lock.release(lease)))
        worker.start()
        worker.join(5)
        assert results == [ReleaseResult.RELEASED]
        assert not raw.exists(lease.key)

    def test_pickled_lease_releases_in_another_client(
        self, lock: RedisLock, raw: redis.Redis, redis_server: RedisServer
    ) -> None:
        lease = held(lock.try_acquire("job", ttl=10))
        lease.on_lost(lambda _: None)  # callbacks stay behind; identity travels
        copy = pickle.loads(pickle.dumps(lease))
        assert copy == lease
        other = RedisLock(redis_server.client(), prefix="test")
        assert other.release(copy) is ReleaseResult.RELEASED
        assert not raw.exists(lease.key)

    def test_lease_is_immutable(self, lock: RedisLock) -> None:
        lease = held(lock.try_acquire("job", ttl=10))
        with pytest.raises(AttributeError):
            lease.token = "mine now"  # type: ignore[misc]


class TestTransportFailure:
    def test_failed_release_keeps_the_token_for_a_retry(self) -> None:
        server = RedisServer().start()
        try:
            lock = RedisLock(server.client(socket_timeout=0.3), prefix="test")
            lease = held(lock.try_acquire("job", ttl=30))
            server.pause()  # the release times out in transport, the server keeps the key
            try:
                with pytest.raises(LockStoreUnavailableError, match="TimeoutError"):
                    lock.release(lease)
            finally:
                server.resume()
            assert lease.token
            assert not lease.lost
            assert lock.release(lease) is ReleaseResult.RELEASED
            assert server.client().dbsize() <= 1  # only the fence key is left
        finally:
            server.cleanup()


class TestFencing:
    def test_fences_strictly_increase_across_acquisitions(self, lock: RedisLock) -> None:
        fences = []
        for _ in range(200):
            lease = held(lock.try_acquire("job", ttl=10))
            fences.append(lease.fence)
            lock.release(lease)
        assert all(a < b for a, b in itertools.pairwise(fences))

    def test_fence_survives_its_state_expiring(self, lock: RedisLock, raw: redis.Redis) -> None:
        first = held(lock.try_acquire("job", ttl=0.05))
        lock.release(first)
        wait_until_gone(raw, lock.keys("job").fence)
        second = held(lock.try_acquire("job", ttl=0.05))
        assert second.fence > first.fence

    def test_fence_increases_across_a_redis_restart_without_persistence(self) -> None:
        server = RedisServer().start()
        try:
            client = server.client(retry_on_error=[redis.ConnectionError])
            lock = RedisLock(client, prefix="test")
            before = held(lock.try_acquire("job", ttl=30))
            server.restart()  # every key is gone, scripts too (NOSCRIPT -> reload)
            after = held(lock.try_acquire("job", ttl=30))
            assert after.fence > before.fence
        finally:
            server.cleanup()

    def test_fence_state_is_bounded_one_key_per_recently_held_lock(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        for i in range(50):
            lock.release(held(lock.try_acquire(f"job-{i}", ttl=0.1)))
        wait_for(lambda: list(raw.scan_iter("test:*")) == [], 5, "every fence key expired")

    def test_fence_counter_ahead_of_the_clock_is_still_exceeded(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        # A fence key far in the "future" (clock stepped back) is built upon, not ignored.
        future = 3 * 10**15  # ~2065 in microseconds; well below 2**53 (Lua numbers)
        raw.set(lock.keys("job").fence, future, px=10_000)
        assert held(lock.try_acquire("job", ttl=1)).fence == future + 1


class TestKeyLayout:
    def test_all_keys_of_a_lock_share_one_cluster_slot(self, lock: RedisLock) -> None:
        for name in ["job", "a}b", "}", "{x}", "tenant:7:{order}", "ключ", "*?[x]\\"]:
            keys = lock.keys(name)
            slots = {
                key_slot(k.encode()) for k in (keys.lock, keys.fence, keys.signal, keys.waiters)
            }
            assert len(slots) == 1, (name, keys)

    def test_user_data_cannot_escape_the_prefix_or_glob(self, lock: RedisLock) -> None:
        keys = lock.keys("x}:*:{evil")
        assert keys.lock.startswith("test:{")
        assert keys.lock.count("{") == 1
        assert keys.lock.count("}") == 1
        assert not set("*?[]\\ ") & set(keys.lock)

    def test_distinct_names_never_share_keys(self, lock: RedisLock) -> None:
        names = ["a%7Db", "a}b", "a b", "a%20b", "a*", "a%2A"]
        assert len({lock.keys(n).lock for n in names}) == len(names)

    def test_prefix_namespaces_locks(self, client: redis.Redis) -> None:
        one = RedisLock(client, prefix="one")
        two = RedisLock(client, prefix="two")
        held(one.try_acquire("job", ttl=10))
        held(two.try_acquire("job", ttl=10))


class TestBadInput:
    @pytest.mark.parametrize(
        ("ttl", "message"),
        [
            (0, "must be positive"),
            (-1, "must be positive"),
            ("10", "number of seconds"),
            (None, "number of seconds"),
            (True, "number of seconds"),
            (float("nan"), "finite"),
            (float("inf"), "finite"),
            (86401, "longer than a day"),
            (timedelta(days=2), "longer than a day"),
        ],
    )
    def test_bad_ttl_is_refused_before_anything_is_written(
        self, lock: RedisLock, raw: redis.Redis, ttl: object, message: str
    ) -> None:
        with pytest.raises(ConfigurationError, match=message):
            lock.try_acquire("job", ttl=ttl)
        with pytest.raises(ConfigurationError, match=message):
            lock.acquire("job", ttl=ttl)
        assert raw.dbsize() == 0

    def test_long_ttl_allowed_when_asked(self, client: redis.Redis) -> None:
        lock = RedisLock(client, prefix="test", allow_long_ttl=True)
        assert held(lock.try_acquire("job", ttl=timedelta(days=2))).ttl == 2 * 86400

    @pytest.mark.parametrize(
        ("name", "message"),
        [
            ("", "must not be empty"),
            (None, "must be a str"),
            (7, "must be a str"),
            (b"job", "must be a str"),
            ("x" * 2000, "hash long names"),
        ],
    )
    def test_bad_name_is_refused_before_anything_is_written(
        self, lock: RedisLock, raw: redis.Redis, name: object, message: str
    ) -> None:
        with pytest.raises(ConfigurationError, match=message):
            lock.try_acquire(name, ttl=1)  # type: ignore[arg-type]
        assert raw.dbsize() == 0

    @pytest.mark.parametrize("prefix", ["", "a{b", "a}b", "a*", "a b", None])
    def test_bad_prefix_is_refused(self, client: redis.Redis, prefix: object) -> None:
        with pytest.raises(ConfigurationError, match="prefix"):
            RedisLock(client, prefix=prefix)  # type: ignore[arg-type]

    @pytest.mark.parametrize("token", ["", 5, "t" * 300])
    def test_bad_token_is_refused(self, lock: RedisLock, raw: redis.Redis, token: object) -> None:
        with pytest.raises(ConfigurationError, match="token"):
            lock.try_acquire("job", ttl=1, token=token)  # type: ignore[arg-type]
        assert raw.dbsize() == 0

    def test_socket_timeout_shorter_than_blocking_wait_says_what_to_change(
        self, redis_server: RedisServer, raw: redis.Redis
    ) -> None:
        lock = RedisLock(redis_server.client(socket_timeout=2), prefix="test")
        with pytest.raises(ConfigurationError, match="socket_timeout=2s") as caught:
            lock.acquire("job", ttl=1, timeout=5)
        assert "larger socket_timeout" in str(caught.value)
        assert "wait='spin'" in str(caught.value)
        with pytest.raises(ConfigurationError, match="forever"):
            lock.acquire("job", ttl=1)
        assert raw.dbsize() == 0
        # A wait that fits the socket timeout, and spinning, are fine.
        lock.release(lock.acquire("job", ttl=1, timeout=1))
        lock.release(lock.acquire("job", ttl=1, timeout=5, wait="spin"))

    def test_unknown_wait_mode_is_refused(self, lock: RedisLock, raw: redis.Redis) -> None:
        with pytest.raises(ConfigurationError, match="'push' or 'spin'"):
            lock.acquire("job", ttl=1, wait="poll")  # type: ignore[arg-type]
        assert raw.dbsize() == 0

    def test_async_client_is_refused_by_sync_lock(self, redis_server: RedisServer) -> None:
        import redis.asyncio

        with pytest.raises(ConfigurationError, match="AsyncRedisLock"):
            RedisLock(redis.asyncio.Redis.from_url(redis_server.url))  # type: ignore[arg-type]


class TestMisuse:
    """Wrong arguments get the library's own errors, naming what to pass instead."""

    @pytest.fixture(name="store", params=["redis", "memory"])
    def fixture_store(self, request: pytest.FixtureRequest, lock: RedisLock) -> object:
        return lock if request.param == "redis" else MemoryLock(prefix="test")

    def test_release_and_extend_of_something_else_than_a_lease(self, store: RedisLock) -> None:
        for call in (store.release, store.extend):
            with pytest.raises(ConfigurationError, match="takes the Lease an acquire returned"):
                call(None)  # type: ignore[arg-type]

    def test_a_url_where_a_client_belongs_names_from_url(self) -> None:
        with pytest.raises(ConfigurationError, match=r"RedisLock.from_url\(url\)"):
            RedisLock("redis://127.0.0.1:6379/0")

    def test_check_after_ones_own_release_raises(self, store: RedisLock) -> None:
        lease = held(store.try_acquire("mine", ttl=10))
        lease.check()
        assert store.release(lease) is ReleaseResult.RELEASED
        with pytest.raises(LockLostError, match="its holder released it"):
            lease.check()
        assert not lease.lost

    def test_a_second_release_is_no_loss_on_either_store(self, store: RedisLock) -> None:
        lease = held(store.try_acquire("twice", ttl=10))
        assert store.release(lease) is ReleaseResult.RELEASED
        assert store.release(lease) is ReleaseResult.EXPIRED
        assert not lease.lost

    def test_a_first_release_of_an_expired_lease_is_a_loss_on_either_store(
        self, store: RedisLock
    ) -> None:
        lease = held(store.try_acquire("short", ttl=0.05))
        time.sleep(0.1)
        assert store.release(lease) is ReleaseResult.EXPIRED
        assert lease.lost


class TestHold:
    def test_hold_releases_on_exception(self, lock: RedisLock, raw: redis.Redis) -> None:
        seen: list[Lease] = []

        def body() -> None:
            with lock.hold("job", ttl=5) as lease:
                seen.append(lease)
                assert raw.exists(lease.key)
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            body()
        assert not raw.exists(seen[0].key)


class TestTakeOverAndRelease:
    def test_holder_of_replace_token_hands_the_lock_over_with_a_new_fence(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        queued = held(lock.try_acquire("job", ttl=60, token="queued"))
        running = held(
            lock.try_acquire("job", ttl=5, token="running", take=TakeOver(replace="queued"))
        )
        assert running.fence > queued.fence
        assert raw.get(running.key) == b"running"
        assert 4000 < raw.pttl(running.key) <= 5000
        assert lock.release(queued) is ReleaseResult.NOT_OWNER

    def test_replace_does_not_take_over_someone_elses_lock(self, lock: RedisLock) -> None:
        held(lock.try_acquire("job", ttl=60, token="first-execution"))
        second = lock.try_acquire(
            "job", ttl=5, token="redelivered", take=TakeOver(replace="queued")
        )
        assert isinstance(second, Contended)
        assert second.holder == "first-execution"

    def test_replace_acquires_a_free_lock(self, lock: RedisLock) -> None:
        assert (
            held(lock.try_acquire("job", ttl=5, token="t", take=TakeOver(replace="gone"))).token
            == "t"
        )

    def test_release_token(self, lock: RedisLock, raw: redis.Redis) -> None:
        held(lock.try_acquire("job", ttl=60, token="known"))
        assert lock.release_token("job", "other") is ReleaseResult.NOT_OWNER
        assert lock.release_token("job", "known") is ReleaseResult.RELEASED
        assert lock.release_token("job", "known") is ReleaseResult.EXPIRED
        assert not raw.exists("test:{job}")

    def test_release_matching_needs_prefix_and_suffix(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        held(lock.try_acquire("job", ttl=60, token="x|host|42|abcdef|task-1"))
        assert lock.release_matching("job", "x|host|4|", "|task-1") is ReleaseResult.NOT_OWNER
        assert lock.release_matching("job", "x|host|42|", "|task-2") is ReleaseResult.NOT_OWNER
        assert lock.release_matching("job", "x|host|42|", "|task-1") is ReleaseResult.RELEASED
        assert not raw.exists("test:{job}")
        with pytest.raises(ConfigurationError):
            lock.release_matching("job", "")
