"""``RedisLock.holdings()``: every lock under the prefix, in batches, on bytes and decoded
clients (and, in the version matrix, every redis-py and RESP version)."""

from __future__ import annotations

import redis

from celery_singleton_lock import Lease, MemoryLock, RedisLock
from celery_singleton_lock.lease import companion, slot


def test_every_kind_of_lock_is_listed_and_bookkeeping_is_not(
    lock: RedisLock, raw: redis.Redis
) -> None:
    plain = lock.try_acquire("a b{c}", 30, token="x|w@h|1|1-2|t1")
    assert isinstance(plain, Lease)
    assert isinstance(lock.try_acquire(companion("p", "pending"), 30, token="q|1-2|t2"), Lease)
    assert isinstance(lock.slots.try_acquire("s", 3, 30, token="x|w@h|2|1-2|t3"), Lease)
    raw.set("test:{unfenced}", "foreign")  # no expiry, not our token
    raw.set("elsewhere:{x}", "x|w@h|1|1-2|t9", px=30_000)  # another prefix
    found = {(h.name, h.role): h for h in lock.holdings(batch=2)}
    assert set(found) == {("a b{c}", None), ("p", "pending"), ("s", "slot1"), ("unfenced", None)}
    assert found[("a b{c}", None)].fence == plain.fence
    assert found[("a b{c}", None)].token == "x|w@h|1|1-2|t1"
    assert 29 < (found[("a b{c}", None)].ttl or 0) <= 30
    assert found[("p", "pending")].fence is None
    assert found[("s", "slot1")].full_name == slot("s", 1)
    assert found[("unfenced", None)].ttl is None


def test_a_lock_released_between_the_scan_and_the_read_is_left_out(lock: RedisLock) -> None:
    leases = [lock.try_acquire(f"n{i}", 30) for i in range(5)]
    listing = lock.holdings(batch=1000)
    for lease in leases:
        assert isinstance(lease, Lease)
        lock.release(lease)
    assert list(listing) == []  # read lazily: nothing was held by the time of the read


def test_the_memory_store_lists_the_same_way() -> None:
    store = MemoryLock(prefix="m")
    lease = store.try_acquire("one", 30, token="x|w@h|1|1-2|t1")
    assert isinstance(lease, Lease)
    [held] = store.holdings()
    assert (held.name, held.role, held.token, held.fence) == ("one", None, lease.token, lease.fence)


def test_values_this_library_did_not_write_never_break_the_listing(
    lock: RedisLock, raw: redis.Redis
) -> None:
    raw.hset("test:{a hash}", "f", "v")  # not a string: no lock of ours
    raw.set("test:{bytes}", b'\xff\xfe not utf-8 \n "quoted" |', px=30_000)
    assert isinstance(lock.try_acquire("ours", 30, token="x|w@h|1|1-2|t1"), Lease)
    found = {h.name: h for h in lock.holdings(batch=1000)}
    assert set(found) == {"bytes", "ours"}
    assert found["bytes"].token == '?? not utf-8 \n "quoted" |'
    assert found["bytes"].fence is None
    assert (found["ours"].fence or 0) > 10**15


def test_one_lock_s_holds_are_read_alone_in_one_round_trip(lock: RedisLock) -> None:
    from celery_singleton_lock.lease import Rate, rates_of

    assert isinstance(lock.try_acquire("f", 30, token="x|w@h|1|1-2|t1"), Lease)
    assert isinstance(lock.try_acquire(companion("f", "pending"), 30, token="q|1-2|t2"), Lease)
    assert isinstance(lock.slots.try_acquire("f", 100, 30, token="x|w@h|2|1-2|t3"), Lease)
    rates_of(lock).ask("f", Rate(1, 60.0), "reserve")
    assert isinstance(lock.try_acquire("f2", 30), Lease)  # another lock: not its family
    found = {(h.name, h.role) for h in lock.holdings(of="f")}
    assert found == {("f", None), ("f", "pending"), ("f", "slot1"), ("f", "rate")}
    assert list(lock.holdings(of="nothing")) == []
    memory = MemoryLock(prefix="m")
    assert isinstance(memory.try_acquire("f", 30), Lease)
    assert isinstance(memory.try_acquire("g", 30), Lease)
    assert [h.name for h in memory.holdings(of="f")] == ["f"]
