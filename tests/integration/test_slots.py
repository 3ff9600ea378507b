"""Counting leases (``lock.slots``): at most ``limit`` holders, fenced across slots, FIFO
wake-ups, and a hypothesis state machine against a model; on a real redis-server (and
the in-memory store for the parts eager tests rely on)."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from redis.crc import key_slot

from celery_singleton_lock import (
    ConfigurationError,
    Contended,
    Lease,
    LockNotAcquiredError,
    MemoryLock,
    RedisLock,
    ReleaseResult,
)
from celery_singleton_lock.lease import slot

from ..support.runs import wait_for


@pytest.fixture(name="store", params=["redis", "memory"])
def fixture_store(request: pytest.FixtureRequest, raw: redis.Redis) -> RedisLock | MemoryLock:
    if request.param == "memory":
        return MemoryLock(prefix="sl")
    return RedisLock(raw, prefix="sl")


class TestSlots:
    def test_at_most_limit_holders_with_fences_increasing_across_slots(
        self, store: RedisLock | MemoryLock
    ) -> None:
        leases = [store.slots.try_acquire("t", 3, 30, token=f"o{i}") for i in range(3)]
        assert all(isinstance(lease, Lease) for lease in leases)
        assert [lease.name for lease in leases] == [slot("t", n) for n in (1, 2, 3)]  # type: ignore[union-attr]
        fences = [lease.fence for lease in leases]  # type: ignore[union-attr]
        assert fences == sorted(set(fences))
        refused = store.slots.try_acquire("t", 3, 30, token="o3")
        assert isinstance(refused, Contended)
        assert refused.holder in {"o0", "o1", "o2"}
        assert refused.retry_after is not None
        assert 0 < refused.retry_after <= 30
        assert store.release(leases[1]) is ReleaseResult.RELEASED  # type: ignore[arg-type]
        again = store.slots.try_acquire("t", 3, 30, token="o4")
        assert isinstance(again, Lease)
        assert again.name == slot("t", 2)
        assert again.fence > max(fences)

    def test_a_retry_of_the_same_token_gets_its_own_slot_back(
        self, store: RedisLock | MemoryLock
    ) -> None:
        first = store.slots.try_acquire("r", 2, 30, token="a")
        second = store.slots.try_acquire("r", 2, 30, token="b")
        assert isinstance(first, Lease)
        assert isinstance(second, Lease)
        store.release(first)
        retried = store.slots.try_acquire("r", 2, 30, token="b")  # slot 1 is free now
        assert isinstance(retried, Lease)
        assert retried.name == second.name, "never two slots for one token"
        assert store.holder(slot("r", 1)) is None

    def test_a_cap_counts_the_slots_above_it(self, store: RedisLock | MemoryLock) -> None:
        # Three slots held, then the limit lowered to 2: nothing starts until fewer run.
        held = [store.slots.try_acquire("low", 3, 30, token=f"t{n}") for n in range(3)]
        assert all(isinstance(lease, Lease) for lease in held)
        assert isinstance(store.slots.try_acquire("low", 3, 30, token="new", cap=2), Contended)
        store.release(held[0])
        assert isinstance(store.slots.try_acquire("low", 3, 30, token="new", cap=2), Contended)
        store.release(held[2])
        got = store.slots.try_acquire("low", 3, 30, token="new", cap=2)
        assert isinstance(got, Lease)
        assert got.name.endswith("slot1")  # the lowest free one
        # Its own slot is its own again whatever the cap (a retry after a lost answer).
        again = store.slots.try_acquire("low", 3, 30, token="new", cap=1)
        assert isinstance(again, Lease)
        assert again.name == got.name

    @pytest.mark.parametrize("limit", [0, -1, 101, True, 2.0, "3"])
    def test_bad_limits_are_refused(self, store: RedisLock | MemoryLock, limit: object) -> None:
        with pytest.raises(ConfigurationError, match="limit must be an int from 1 to 100"):
            store.slots.try_acquire("b", limit, 30)  # type: ignore[arg-type]

    def test_a_slot_is_an_ordinary_lock(self, raw: redis.Redis) -> None:
        store = RedisLock(raw, prefix="sl")
        lease = store.slots.try_acquire("o", 2, 30, token="x|h|7|n|task")
        assert isinstance(lease, Lease)
        assert store.extend(lease, 60).name == "EXTENDED"
        assert 30 < raw.pttl(lease.key) / 1000 <= 60
        # What a worker's main process does for a dead child: release by the token's shape.
        assert store.release_matching(lease.name, "x|h|7|", "|task") is ReleaseResult.RELEASED

    def test_every_key_of_a_counting_lease_is_in_one_cluster_slot(self, raw: redis.Redis) -> None:
        store = RedisLock(raw, prefix="sl")
        names = ["tenant {7}", *(slot("tenant {7}", n) for n in (1, 2, 50))]
        keys = {k for name in names for k in vars(store.keys(name)).values()}
        assert len({key_slot(k.encode()) for k in keys}) == 1
        assert store.keys(slot("x", 3)).fence == store.keys("x").fence

    def test_waiters_are_served_first_come_first_served(self, raw: redis.Redis) -> None:
        store = RedisLock(raw, prefix="sl")
        held: list[object] = [store.slots.try_acquire("f", 2, 30, token=f"h{i}") for i in range(2)]
        order: list[int] = []
        granted: dict[int, Lease] = {}
        errors: list[BaseException] = []

        def waiter(number: int) -> None:
            try:
                granted[number] = store.slots.acquire("f", 2, 30, timeout=20, token=f"w{number}")
                order.append(number)
            except BaseException as error:
                errors.append(error)

        threads, before = [], blocked(raw)
        for number in range(4):
            thread = threading.Thread(target=waiter, args=(number,))
            thread.start()
            threads.append(thread)
            # Each is blocked in BLPOP (queued) before the next arrives.
            queued = before + number + 1
            wait_for(lambda n=queued: blocked(raw) >= n, 10, f"waiter {number} queued")
        for number in range(4):
            # One slot at a time, each only once the last grant was seen: the oldest
            # waiter gets it, however the threads are scheduled.
            store.release(held.pop(0))  # type: ignore[arg-type]
            wait_for(lambda n=number: len(order) == n + 1 or errors, 10, f"grant {number}")
            held.append(granted[order[-1]])
        for thread in threads:
            thread.join(30)
        assert not errors
        assert order == [0, 1, 2, 3]
        for lease in held:
            store.release(lease)  # type: ignore[arg-type]

    def test_a_wait_gives_up_at_its_timeout_naming_a_holder(self, raw: redis.Redis) -> None:
        store = RedisLock(raw, prefix="sl")
        store.slots.try_acquire("g", 1, 30, token="holder")
        began = time.monotonic()
        with pytest.raises(LockNotAcquiredError) as caught:
            store.slots.acquire("g", 1, 30, timeout=0.3, token="late")
        assert 0.25 < time.monotonic() - began < 3
        assert caught.value.holder == "holder"


OWNERS = st.sampled_from(["a", "b", "c", "d"])
LIMIT = 2


def machine_for(client: redis.Redis) -> type[RuleBasedStateMachine]:
    class SlotMachine(RuleBasedStateMachine):
        """The model: which owners hold a slot (at most LIMIT) and the last fence."""

        @initialize()
        def start(self) -> None:
            client.flushall()
            self.lock = RedisLock(client, prefix="ssm")
            self.holders: set[str] = set()
            self.last_fence = 0
            self.leases: dict[str, Lease] = {}

        @rule(owner=OWNERS)
        def acquire(self, owner: str) -> None:
            if owner in self.holders:
                return  # one slot per owner: the Celery layer's tokens are per execution
            token = f"{owner}-{time.monotonic_ns()}"
            result = self.lock.slots.try_acquire("k", LIMIT, ttl=60, token=token)
            if len(self.holders) < LIMIT:
                assert isinstance(result, Lease)
                assert result.fence > self.last_fence
                self.last_fence = result.fence
                self.holders.add(owner)
                self.leases[owner] = result
            else:
                assert isinstance(result, Contended)
                assert result.holder in {self.leases[h].token for h in self.holders}

        @rule(owner=OWNERS)
        def release(self, owner: str) -> None:
            lease = self.leases.get(owner)
            if lease is None:
                return
            result = self.lock.release(lease)
            if owner in self.holders:
                assert result is ReleaseResult.RELEASED
                self.holders.discard(owner)
            else:
                assert result in (ReleaseResult.EXPIRED, ReleaseResult.NOT_OWNER)

        @rule(owner=OWNERS)
        def expire(self, owner: str) -> None:
            if owner not in self.holders:
                return
            key = self.leases[owner].key
            client.pexpire(key, 1)
            deadline = time.monotonic() + 2
            while client.exists(key):
                assert time.monotonic() < deadline
                time.sleep(0.001)
            self.holders.discard(owner)

        @invariant()
        def store_matches_model(self) -> None:
            if not hasattr(self, "lock"):
                return
            stored = {self.lock.holder(slot("k", n)) for n in range(1, LIMIT + 1)} - {None}
            assert stored == {self.leases[h].token for h in self.holders}

    return SlotMachine


class TestSlotStateMachine:
    def test_counting_lease_behaves_like_its_model(self, raw: redis.Redis) -> None:
        run_state_machine_as_test(
            machine_for(raw),
            settings=settings(
                max_examples=40,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


def blocked(raw: redis.Redis) -> int:
    """How many clients of the server are blocked (in BLPOP, here)."""
    return sum("b" in str(client.get("flags", "")) for client in raw.client_list())
