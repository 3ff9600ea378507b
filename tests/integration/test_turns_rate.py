"""A rate in front of a waiting room (``rate.lua``, ``turn_take.lua``), on a real
redis-server: a call kept waiting for its turn is not charged for the start it did not
make, unless a later start built on it; sent on its turn, it starts as the runs that
started leave room, never before."""

from __future__ import annotations

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.lease.limits.rates import Rate, Rates, Slot, parse_rate, rates_of
from celery_singleton_lock.lease.limits.turns import Kept, Turns, Waiter, turns_of

TOTAL = "task#total"
KEY = "fair:flood"
# An interval far longer than a round trip: a start it counts is plain to see.
RATE = parse_rate("2/s")


@pytest.fixture(name="parts")
def fixture_parts(raw: redis.Redis) -> tuple[RedisLock, Turns, Rates]:
    store = RedisLock(raw, prefix="tr")
    turns = turns_of(store)
    assert turns is not None
    return store, turns, rates_of(store)


def take(turns: Turns, ident: str, slot: Slot | None = None, *, stamp: int = 0) -> object:
    waiter = Waiter(ident, f"msg-{ident}".encode(), 1.0, stamp)
    charge = None if slot is None else slot.charge
    return turns.take(
        TOTAL, 1, KEY, waiter, widest=2, cap=None, token=f"x|{ident}", ttl=30, charge=charge
    ).taken


def start(rates: Rates, rate: Rate = RATE, *, near: float = 0.05) -> Slot:
    return rates.ask(KEY, rate, "start", near=near)


def test_a_kept_call_s_start_is_given_back(parts: tuple[RedisLock, Turns, Rates]) -> None:
    store, turns, rates = parts
    assert isinstance(take(turns, "run:0", start(rates)), tuple), "the total's one slot"
    counted = start(rates, near=1.0)  # the next start, an interval on: kept waiting
    assert counted.now
    assert counted.wait > 0.4
    assert counted.charge is not None
    before = store.client.get(counted.charge.key)
    assert isinstance(take(turns, "kept:0", counted), Kept)
    after = store.client.get(counted.charge.key)
    assert after is not None
    assert after.decode() == counted.charge.before != before.decode()
    again = start(rates, near=1.0)
    assert abs(again.at - counted.at) < 0.01, "its start free again: not charged twice"


def test_a_start_built_on_a_kept_call_s_keeps_it(parts: tuple[RedisLock, Turns, Rates]) -> None:
    _, turns, rates = parts
    assert isinstance(take(turns, "run:0", start(rates)), tuple)
    kept = start(rates, near=1.0)
    later = start(rates, near=2.0)  # another worker's start, after the kept one's
    assert later.at - kept.at == pytest.approx(RATE.interval, abs=0.01)
    assert isinstance(take(turns, "kept:0", kept), Kept)
    # Given back, the later start would share its instant with the next: over the rate.
    nxt = start(rates, near=2.0)
    assert nxt.at - later.at == pytest.approx(RATE.interval, abs=0.01), "both still counted"


def test_a_call_on_its_turn_starts_at_the_rate_not_behind_the_schedule(
    parts: tuple[RedisLock, Turns, Rates],
) -> None:
    store, turns, rates = parts
    running = take(turns, "run:0", start(rates))
    assert isinstance(running, tuple)
    # Calls deferred to slots far on (a flood): the schedule is held 3 s ahead.
    deferred = [rates.ask(KEY, RATE, "reserve") for _ in range(6)]
    first = deferred[0]
    due = rates.ask(KEY, RATE, "due", at=first.at, grace=0.5, near=5.0)
    assert due.now
    assert due.at == pytest.approx(first.at, abs=0.001)
    assert isinstance(take(turns, "kept:1", due), Kept), "it started on its slot, and waits"
    # Its turn comes (run:0 ends); sent on it, it asks the gate as a late run does.
    handed = turns.hand_out(TOTAL, 1, ending=running[1])
    store.release(running[0])
    assert [h.ident for h in handed] == ["kept:1"]
    turned = rates.ask(KEY, RATE, "due", at=0.0, grace=0.0, near=0.05 + RATE.interval + 0.1)
    assert turned.now, turned
    assert turned.at == pytest.approx(first.at, abs=0.001), "on its slot, not after the 6"
    taken = take(turns, "kept:1", turned, stamp=handed[0].stamp)
    assert isinstance(taken, tuple), "it runs on its turn"
    # The gate counted that one start: the next due slot is pushed past it, never closer.
    nxt = rates.ask(KEY, RATE, "due", at=deferred[1].at, grace=0.5, near=5.0)
    assert nxt.at - turned.at == pytest.approx(RATE.interval, abs=0.001)
