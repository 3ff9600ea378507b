"""Each store rule as one table, run alike on ``memory://`` and on a real redis-server.

``memory://`` runs the same Lua scripts in-process (fakeredis): a row that answers
otherwise there than on the server is a rule with two implementations.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis

from celery_singleton_lock import Contended, Lease, MemoryLock, RedisLock
from celery_singleton_lock.lease import HOLD, Rate, TakeOver, rates_of
from celery_singleton_lock.lease.idempotency import idempotency_keys_of
from celery_singleton_lock.lease.limits.backlog import backlog_of
from celery_singleton_lock.lease.limits.overrides import Override, overrides_of
from celery_singleton_lock.lease.offers import offers_of

WINDOW_MS = 60_000


def shown(outcome: object) -> object:
    """An outcome as the table writes it: what it is and, where it says, who holds."""
    if isinstance(outcome, Lease):
        return "lease"
    if isinstance(outcome, Contended):
        return f"held by {outcome.holder}" if outcome.holder else "refused"
    return outcome


def lease(outcome: object) -> Lease:
    assert isinstance(outcome, Lease), outcome
    return outcome


def lock_rules(store: RedisLock) -> list[object]:
    first = lease(store.try_acquire("job", 30, token="a", take=TakeOver(fenced=True)))
    seen = [shown(store.try_acquire("job", 30, token="b")), store.holder("job")]
    seen.append(store.extend(first).name)
    seen.append(store.release_token("job", "b").name)  # the owner check
    seen.append(store.release(first).name)
    seen.append(store.release_token("job", "a").name)  # gone already
    second = lease(store.try_acquire("job", 30, token="c", take=TakeOver(fenced=True)))
    seen.append(second.fence > first.fence)  # fences only grow
    return seen


def expiry_rules(store: RedisLock) -> list[object]:
    store.try_acquire("short", 0.05, token="a")
    time.sleep(0.1)  # real time on both: the memory store counts on the machine's clock here
    return [store.holder("short"), shown(store.try_acquire("short", 30, token="b"))]


def takeover_rules(store: RedisLock) -> list[object]:
    held = lease(store.try_acquire("q", 30, token="q|n1|id1", take=HOLD))
    seen = [shown(store.swap("q", "q|other", 30, token="q|n2|id1"))]
    seen.append(shown(store.swap("q", held.token, 30, token="q|n2|id1")))
    seen.append(
        shown(store.try_acquire("q", 30, token="x", take=TakeOver(unless_replaced="q|n1|id1")))
    )
    seen.append(shown(store.try_acquire("q", 30, token="x", take=TakeOver(replace="q|n2|id1"))))
    seen.append(store.release_matching("q", "q|", "").name)  # not its shape
    seen.append(store.release_matching("q", "x", "").name)
    return seen


def slot_rules(store: RedisLock) -> list[object]:
    slots = store.slots
    one, two = (lease(slots.try_acquire("pool", 2, 30, token=t)) for t in ("a", "b"))
    seen = [one.name == two.name, shown(slots.try_acquire("pool", 2, 30, token="c"))]
    seen.append(shown(slots.try_acquire("pool", 2, 30, token="a")))  # its own slot again
    store.release(one)
    seen.append(shown(slots.try_acquire("pool", 2, 30, token="c", cap=1)))  # a lowered limit
    seen.append(shown(slots.try_acquire("pool", 2, 30, token="c")))
    return seen


def rate_rules(store: RedisLock) -> list[object]:
    rates, rate = rates_of(store), Rate(2, 60.0, burst=2)
    seen: list[object] = [rates.ask("feed", rate).state for _ in range(3)]
    peek = rates.ask("feed", rate, "peek")
    seen += [peek.remaining, 29.0 < peek.wait <= 30.0]
    reserved = rates.ask("feed", rate, "reserve")
    seen += [reserved.state, 29.0 < reserved.wait <= 30.0]
    seen.append(rates.ask("feed", rate, "reserve").wait > reserved.wait)  # never one slot twice
    return seen


def backlog_rules(store: RedisLock) -> list[object]:
    backlog = backlog_of(store)
    places = [backlog.enter("line", call, 2, 30.0) for call in ("a", "b", "c")]
    seen: list[object] = [(p.taken, p.waiting, p.retry_after > 29.0) for p in places]
    seen.append(backlog.enter("line", "a", 2, 30.0).taken)  # its own place, kept
    backlog.leave("line", "a")
    seen += [backlog.enter("line", "c", 2, 30.0).taken, backlog.waiting("line")]
    return seen


def override_rules(store: RedisLock) -> list[object]:
    overrides = overrides_of(store)
    overrides.save(Override("report", limit=3))
    overrides.save(Override("report:{n}", paused=True, paused_at=1.0))
    found = overrides.find("report(1)", ["report:{n}", "report"], fresh=True)
    assert found is not None
    seen: list[object] = [found.limit, found.paused, sorted(overrides.all())]
    overrides.save(Override("report"))  # an empty override is removed
    seen.append(sorted(overrides.all()))
    return seen


def offer_rules(store: RedisLock) -> list[object]:
    offers = offers_of(store)
    assert offers is not None
    holder = lease(store.try_acquire("k", 30, token="x|h|1|n1|id1", take=HOLD))
    seen: list[object] = [offers.offer("k", holder.token, b"v1").kept]
    refused = offers.offer("k", "x|h|1|n0|id0", b"v2")
    seen += [refused.kept, refused.holder]
    store.release(holder)
    seen += [offers.offer("k", holder.token, b"v3").kept, offers.take("k", holder.token)]
    seen.append(offers.take("k", holder.token))  # once
    return seen


def idempotency_rules(store: RedisLock) -> list[object]:
    keys = idempotency_keys_of(store)

    def claim(call: str, fingerprint: str = "f") -> tuple[bool, str, str]:
        found = keys.claim("pay-1", call, fingerprint, WINDOW_MS, "t")
        return found.first, found.call, found.state

    def begin(call: str, fingerprint: str = "f") -> tuple[bool, str, str]:
        found = keys.begin("pay-1", call, fingerprint, WINDOW_MS, "t")
        return found.first, found.state, found.by

    seen: list[object] = [claim("c1"), claim("c1"), claim("c2")]
    seen += [begin("c1"), begin("c1", "other"), keys.end("pay-1", "c2", "succeeded")]
    seen += [keys.end("pay-1", "c1", "succeeded"), begin("c1")]
    record = keys.read("pay-1")
    assert record is not None
    seen += [(record.call, record.state, record.task), 59.0 < (record.expires_in or 0) <= 60.0]
    seen += [keys.end("pay-1", "c1", "forget"), keys.read("pay-1") is not None]  # ended: kept
    keys.claim("pay-2", "c3", "f", WINDOW_MS, "t")
    seen += [keys.end("pay-2", "c3", "unsent"), keys.read("pay-2")]  # sent nothing: freed
    return seen


@dataclass(frozen=True)
class Rule:
    name: str
    run: Callable[[RedisLock], list[object]]
    expected: list[object]


RULES = [
    Rule(
        "lease: acquire, refuse, extend, owner-checked release, fences grow",
        lock_rules,
        ["held by a", "a", "EXTENDED", "NOT_OWNER", "RELEASED", "EXPIRED", True],
    ),
    Rule("lease: a ttl runs out", expiry_rules, [None, "lease"]),
    Rule(
        "lease: swap, unless_replaced, replace, release_matching",
        takeover_rules,
        ["held by q|n1|id1", "lease", "refused", "lease", "NOT_OWNER", "RELEASED"],
    ),
    Rule(
        "slots: at most the limit, the own slot again, a cap",
        slot_rules,
        [False, "held by a", "lease", "held by b", "lease"],
    ),
    Rule(
        "rate: two a minute at once, a peek, reservations in turn",
        rate_rules,
        ["now", "now", "refused", 0, True, "reserved", True, True],
    ),
    Rule(
        "backlog: at most the cap wait, a place kept, freed as it runs",
        backlog_rules,
        [(True, 1, False), (True, 2, False), (False, 2, True), True, True, 2],
    ),
    Rule(
        "overrides: saved, found most specific first, an empty one removed",
        override_rules,
        [3, True, ["report", "report:{n}"], ["report:{n}"]],
    ),
    Rule(
        "offers: kept for the holder only, taken once",
        offer_rules,
        [True, False, "x|h|1|n1|id1", False, b"v1", None],
    ),
    Rule(
        "idempotency: claim, begin, end, forget",
        idempotency_rules,
        [
            (True, "c1", "accepted"),
            (True, "c1", "accepted"),
            (False, "c1", "accepted"),
            (True, "accepted", ""),
            (False, "running", "c1"),
            False,
            True,
            (False, "succeeded", "c1"),
            ("c1", "succeeded", "t"),
            True,
            False,
            True,
            True,
            None,
        ],
    ),
]


@pytest.fixture(name="store", params=["memory", "redis"])
def fixture_store(request: pytest.FixtureRequest, raw: redis.Redis) -> RedisLock:
    if request.param == "memory":
        return MemoryLock(prefix="rules")
    return RedisLock(raw, prefix="rules")


@pytest.mark.parametrize("rule", RULES, ids=[rule.name for rule in RULES])
def test_a_rule_answers_alike_in_memory_and_on_a_server(store: RedisLock, rule: Rule) -> None:
    assert rule.run(store) == rule.expected
