"""A hypothesis state machine: acquire / release / extend / expire against a one-line model.

The model is who holds the lock (a token or nobody) and the last fence handed out; the
real lock runs on a real redis-server. Expiry is forced with PEXPIRE 1 so runs stay fast.
"""

from __future__ import annotations

import time

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

from celery_singleton_lock import Contended, ExtendResult, Lease, RedisLock, ReleaseResult

OWNERS = st.sampled_from(["a", "b", "c"])


def machine_for(client: redis.Redis) -> type[RuleBasedStateMachine]:
    class LeaseMachine(RuleBasedStateMachine):
        @initialize()
        def start(self) -> None:
            client.flushall()
            self.lock = RedisLock(client, prefix="sm")
            self.holder: str | None = None  # the model: which owner holds the lock
            self.last_fence = 0
            self.leases: dict[str, Lease] = {}  # each owner's latest lease handle

        @rule(owner=OWNERS)
        def acquire(self, owner: str) -> None:
            result = self.lock.try_acquire(
                "k", ttl=60, token=f"{owner}-{len(self.leases)}-{time.monotonic_ns()}"
            )
            if self.holder is None:
                assert isinstance(result, Lease)
                assert result.fence > self.last_fence
                self.last_fence = result.fence
                self.holder = owner
                self.leases[owner] = result
            else:
                assert isinstance(result, Contended)
                assert result.holder == self.leases[self.holder].token

        @rule(owner=OWNERS)
        def release(self, owner: str) -> None:
            lease = self.leases.get(owner)
            if lease is None:
                return
            result = self.lock.release(lease)
            if self.holder == owner and self.leases[owner] is lease:
                assert result is ReleaseResult.RELEASED
                self.holder = None
            elif self.holder is None:
                assert result is ReleaseResult.EXPIRED
            else:
                assert result is ReleaseResult.NOT_OWNER

        @rule(owner=OWNERS)
        def extend(self, owner: str) -> None:
            lease = self.leases.get(owner)
            if lease is None:
                return
            result = self.lock.extend(lease, ttl=60)
            if self.holder == owner:
                assert result is ExtendResult.EXTENDED
            elif self.holder is None:
                assert result is ExtendResult.EXPIRED
            else:
                assert result is ExtendResult.NOT_OWNER

        @rule()
        def expire(self) -> None:
            key = self.lock.keys("k").lock
            client.pexpire(key, 1)
            deadline = time.monotonic() + 2
            while client.exists(key):
                assert time.monotonic() < deadline
                time.sleep(0.001)
            self.holder = None

        @invariant()
        def store_matches_model(self) -> None:
            if not hasattr(self, "lock"):
                return
            stored = self.lock.holder("k")
            expected = None if self.holder is None else self.leases[self.holder].token
            assert stored == expected

    return LeaseMachine


class TestStateMachine:
    def test_lease_behaves_like_its_model(self, client: redis.Redis) -> None:
        run_state_machine_as_test(
            machine_for(client),
            settings=settings(
                max_examples=40,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
