"""Offers to a lock's holder (``lease.offers``): a later call's arguments left for the
execution that waits for the key, kept only while that holder holds its hold, taken once,
per holder; ASCII on the wire, so a client that decodes replies reads them too."""

from __future__ import annotations

from datetime import datetime

import pytest
import redis

from celery_singleton_lock import MemoryLock, RedisLock, Redlock
from celery_singleton_lock.lease import HOLD, Lease
from celery_singleton_lock.lease.offers import offers_of
from celery_singleton_lock.modes import arguments

from ..support.runs import wait_for
from ..support.servers import RedisServer


def held(outcome: object) -> Lease:
    assert isinstance(outcome, Lease), outcome
    return outcome


@pytest.fixture(name="store", params=["redis", "decoded", "memory"])
def fixture_store(request: pytest.FixtureRequest, redis_server: RedisServer) -> object:
    if request.param == "memory":
        return MemoryLock()
    client = redis.Redis.from_url(redis_server.url, decode_responses=request.param == "decoded")
    return RedisLock(client, prefix=f"offers-{request.param}")


def test_an_offer_is_kept_only_for_the_holder_and_taken_once(store: object) -> None:
    offers = offers_of(store)
    assert offers is not None
    first = held(store.try_acquire("k", 30, token="x|h|1|n1|id1", take=HOLD))  # type: ignore[attr-defined]
    value = arguments.dump("json", ("v2",), {"when": datetime(2026, 1, 1)})
    assert offers.offer("k", first.token, value).kept
    newer = arguments.dump("json", ("v3",), {})
    assert offers.offer("k", first.token, newer).kept  # the newest replaces it
    refused = offers.offer("k", "x|h|1|n0|id0", value)
    assert (refused.kept, refused.holder) == (False, first.token)
    store.release(first)  # type: ignore[attr-defined]
    gone = offers.offer("k", first.token, value)
    assert (gone.kept, gone.holder) == (False, "")  # let go: the call meets the free hold
    taken = offers.take("k", first.token)
    assert taken is not None
    assert arguments.load(taken, ["json"]) == (["v3"], {})
    assert offers.take("k", first.token) is None  # once


def test_an_offer_to_a_later_holder_leaves_one_not_yet_taken(store: object) -> None:
    offers = offers_of(store)
    assert offers is not None
    first = held(store.try_acquire("p", 30, token="x|h|1|a|id1", take=HOLD))  # type: ignore[attr-defined]
    assert offers.offer("p", first.token, arguments.dump("json", ("for-a",), {})).kept
    store.release(first)  # type: ignore[attr-defined]
    second = held(store.try_acquire("p", 30, token="x|h|2|b|id2", take=HOLD))  # type: ignore[attr-defined]
    assert offers.offer("p", second.token, arguments.dump("json", ("for-b",), {})).kept
    a, b = offers.take("p", first.token), offers.take("p", second.token)
    assert a is not None
    assert b is not None
    assert arguments.load(a, ["json"])[0] == ["for-a"]
    assert arguments.load(b, ["json"])[0] == ["for-b"]


def test_any_serializer_travels_and_the_app_s_accept_content_is_kept() -> None:
    value = arguments.dump("pickle", ({1, 2},), {"at": datetime(2026, 1, 1)})
    assert value.isascii()
    assert arguments.load(value, ["json", "pickle"]) == ([{1, 2}], {"at": datetime(2026, 1, 1)})
    with pytest.raises(Exception, match="untrusted content"):
        arguments.load(value, ["json"])


def test_a_redlock_keeps_no_offers() -> None:
    assert offers_of(Redlock.from_url("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")) is None


def test_an_offer_lives_a_ttl_past_its_lock_renewed_with_it(redis_server: RedisServer) -> None:
    # A holder that dies without taking its offer must leave no key behind for long.
    client = redis.Redis.from_url(redis_server.url)
    store = RedisLock(client, prefix="offers-ttl")
    offers = offers_of(store)
    assert offers is not None
    lease = held(store.try_acquire("d", 5, token="x|h|1|d|id1", take=HOLD))
    assert offers.offer("d", lease.token, arguments.dump("json", ("v",), {})).kept
    lock_key, offer_key = store.keys("d").lock, store.keys("d").offer
    # As long again as the lock: read just after the holder let go, or a late renewal.
    assert 5_000 < client.pttl(offer_key) <= 10_000  # the lock's ttl is 5 s
    store.extend(lease, 60)
    assert client.pttl(offer_key) > 60_000  # renewed with the lock
    store.extend(lease, 0.2)  # the holder stops renewing: the offers go a ttl later
    wait_for(lambda: not client.exists(lock_key), 5, "the lock to expire")
    wait_for(lambda: not client.exists(offer_key), 2, "its offers a ttl after it")
