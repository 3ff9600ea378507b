"""``memory://``: a ``RedisLock`` of its own in the process, and what needs one Redis server."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

import pytest
from celery import Celery
from celery.signals import before_task_publish

from celery_singleton_lock import (
    ConfigurationError,
    Lease,
    MemoryLock,
    RedisLock,
    Redlock,
    singleton_task,
)
from celery_singleton_lock.broker.pushes import pushes_of
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.lease import rates_of
from celery_singleton_lock.lease.idempotency import idempotency_keys_of
from celery_singleton_lock.lease.limits.backlog import backlog_of
from celery_singleton_lock.lease.limits.overrides import overrides_of

REDLOCK = "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"  # never connected to here


class TestTheStore:
    def test_it_is_a_redis_lock_whose_helpers_are_the_redis_ones(self) -> None:
        store = MemoryLock()
        assert isinstance(store, RedisLock)
        assert rates_of(store) is rates_of(store)  # made once per store
        assert backlog_of(store).enter("n", "c", 1, 30.0).taken

    def test_no_broker_rides_it_even_beside_a_broker_on_redis_py_s_default_address(
        self,
    ) -> None:
        # Its fakeredis client names localhost:6379 as redis-py's defaults do.
        assert pushes_of(MemoryLock()) is None

    def test_two_stores_keep_apart_and_one_app_has_one(self) -> None:
        one, other = MemoryLock(), MemoryLock()
        assert isinstance(one.try_acquire("job", 30), Lease)
        assert isinstance(other.try_acquire("job", 30), Lease)
        app = Celery("memory-one", set_as_current=False)
        app.conf.update(singleton_lock_url="memory://")
        stores = LockStores.for_app(app)
        assert stores.waiting is stores.lock  # a release wakes the waits of that process

    def test_a_blocked_acquire_on_the_machine_s_clock_sleeps_until_the_release(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = MemoryLock()
        held = store.acquire("job", 30)
        tries: list[float] = []
        moment = store.moment

        def counted() -> float:
            tries.append(time.monotonic())
            return moment()

        monkeypatch.setattr(store, "moment", counted)
        threading.Timer(0.3, store.release, (held,)).start()
        assert isinstance(store.acquire("job", 30, timeout=10), Lease)
        assert len(tries) <= 3  # a try, a wait woken by the release, a try: no spinning
        assert tries[-1] - tries[0] >= 0.25

    def test_a_renewed_lease_has_no_ttl_as_one_kept_until_its_release(self) -> None:
        store = MemoryLock()
        lease = store.try_acquire("job", 30)
        assert isinstance(lease, Lease)
        store.renew(lease)
        assert store.client.pttl(store.keys("job").lock) == -1
        refused = store.try_acquire("job", 30)
        assert not isinstance(refused, Lease)
        assert refused.retry_after is None

    def test_without_fakeredis_it_says_which_extra_to_install(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "celery_singleton_lock.lease.redis.fake", None)
        with pytest.raises(ConfigurationError, match=r"celery-singleton-lock\[memory\]"):
            MemoryLock()


class TestOneServer:
    @pytest.mark.parametrize(
        ("helper", "what"),
        [
            (rates_of, "rate limits need one lock store"),
            (backlog_of, "max_pending need one lock store"),
            (overrides_of, "run-time limits need one lock store"),
            (idempotency_keys_of, "idempotency keys need one lock store"),
        ],
    )
    def test_a_redlock_is_refused_saying_what_to_use(self, helper: object, what: str) -> None:
        with pytest.raises(ConfigurationError, match=rf"{what}.*Redlock of several masters"):
            helper(Redlock.from_url(REDLOCK))  # type: ignore[operator]

    def test_another_store_is_refused_naming_what_it_is(self) -> None:
        with pytest.raises(ConfigurationError, match=r"rate limits need a RedisLock.*object"):
            rates_of(object())

    def test_a_store_s_pushes_go_with_the_store(self) -> None:
        store = RedisLock.from_url("redis://127.0.0.1:1/0")  # never connected to here
        assert pushes_of(store) is pushes_of(store)
        gone = weakref.ref(store)
        del store
        gc.collect()
        assert gone() is None

    @pytest.mark.parametrize("on_limited", ["defer", "delay", "raise"])
    def test_a_rated_task_on_a_redlock_is_refused_before_its_message_is_sent(
        self, on_limited: str
    ) -> None:
        app = Celery(f"rate-redlock-{on_limited}", set_as_current=False)
        app.conf.update(broker_url="memory://", singleton_lock_url=REDLOCK)

        @singleton_task(
            app=app, name=f"redlock.feed.{on_limited}", rate="10/s", on_limited=on_limited
        )
        def feed() -> None:
            pass

        published: list[object] = []

        def note(**_: object) -> None:
            published.append(_)

        before_task_publish.connect(note, weak=False)
        try:
            with pytest.raises(ConfigurationError, match="rate limits need one lock store"):
                feed.delay()
        finally:
            before_task_publish.disconnect(note)
        assert published == []
