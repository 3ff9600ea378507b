"""A lock's history at the lease level: the operations given a ``Record`` (``entry=``) write
their entry in their own round trip, by outcome; ``append`` and ``entries``."""

from __future__ import annotations

import redis

from celery_singleton_lock import Lease, RedisLock
from celery_singleton_lock.lease import HOLD
from celery_singleton_lock.lease.history import Record
from celery_singleton_lock.lease.redis.recording import append, entries


def record(lock: RedisLock, name: str, **events: tuple[str, str, str]) -> Record:
    return Record(lock.keys(name).history, events, {"task": "t", "id": "i1"}, length=5,  # type: ignore[arg-type]
                  ttl_ms=60_000)  # fmt: skip


def test_takes_releases_and_swaps_write_the_event_of_their_outcome(
    lock: RedisLock, raw: redis.Redis
) -> None:
    history = record(lock, "h", take=("accepted", "refused", "replaced"),
                     release=("released", "", "expired"), swap=("replaced", "", ""))  # fmt: skip
    first = lock.try_acquire("h", 30, token="q|1-2|first", take=HOLD, entry=history)
    assert isinstance(first, Lease)
    assert not isinstance(lock.try_acquire("h", 30, token="q|1-3|second", entry=history), Lease)
    assert isinstance(lock.swap("h", first.token, 30, token="q|1-4|third", entry=history), Lease)
    assert lock.release_token("h", "q|1-4|third", entry=history).name == "RELEASED"
    assert lock.release_token("h", "q|1-4|third", entry=history).name == "EXPIRED"
    assert isinstance(lock.try_acquire("h", 30), Lease)  # no entry given: none written
    found = entries(lock, lock.keys("h").history)
    assert [(e.event, e.fields.get("holder")) for e in found][::-1] == [
        ("accepted", None), ("refused", "q|1-2|first"), ("replaced", None),
        ("released", None), ("expired", None),
    ]  # fmt: skip
    assert all(e.fields["task"] == "t" and e.fields["id"] == "i1" for e in found)
    assert 59_000 < raw.pttl(lock.keys("h").history) <= 60_000


def test_a_release_finding_another_holder_records_the_lease_lost(
    lock: RedisLock, raw: redis.Redis
) -> None:
    history = record(lock, "l", release=("released", "lost", "expired"))
    assert isinstance(lock.try_acquire("l", 30, token="x|w@h|1|1-2|mine"), Lease)
    raw.set(lock.keys("l").lock, "x|w@h|2|1-3|theirs")  # it expired and another took it
    assert lock.release_token("l", "x|w@h|1|1-2|mine", entry=history).name == "NOT_OWNER"
    assert [e.event for e in entries(lock, lock.keys("l").history)] == ["lost"]


def test_the_stream_is_capped_and_client_side_entries_join_it(
    lock: RedisLock, raw: redis.Redis
) -> None:
    history = record(lock, "c", take=("started", "contended", ""))
    for n in range(200):
        lease = lock.try_acquire("c", 30, token=f"x|w@h|1|1-{n}|t{n}", entry=history)
        assert isinstance(lease, Lease)
        lock.release(lease)
    append(lock, history, "contended", decision="requeue in 1.0s", holder="someone")
    key = lock.keys("c").history
    assert raw.xlen(key) < 200  # MAXLEN ~ 5: trimmed by whole nodes
    [newest] = entries(lock, key, count=1)
    assert (newest.event, newest.fields["decision"]) == ("contended", "requeue in 1.0s")


def test_the_fast_unscripted_hold_is_not_used_for_a_recorded_take(
    lock: RedisLock, raw: redis.Redis
) -> None:
    history = record(lock, "f", take=("accepted", "refused", ""))
    for _ in range(3):  # the transport's SET NX fast path would write nothing
        lock.try_acquire("f", 30, token="q|1-2|same", take=HOLD, entry=history)
    assert [e.event for e in entries(lock, lock.keys("f").history)] == ["accepted"] * 3


def test_an_entry_the_server_refuses_never_fails_the_operation(
    lock: RedisLock, raw: redis.Redis
) -> None:
    history = record(lock, "w", take=("accepted", "refused", ""))
    raw.set(lock.keys("w").history, "not a stream")  # XADD answers WRONGTYPE
    assert isinstance(lock.try_acquire("w", 30, take=HOLD, entry=history), Lease)
    assert raw.type(lock.keys("w").history) in (b"string", "string")  # left as it was
