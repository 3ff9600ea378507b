"""Per-name rate limits in the lease layer (``lease.limits.rates``): GCRA against a real Redis and
the in-memory store, forms of a rate, and the sliding-window bound under contention."""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import redis

from celery_singleton_lock import ConfigurationError, CostOverBurstError, MemoryLock, RedisLock
from celery_singleton_lock.lease.clock import ManualClock
from celery_singleton_lock.lease.limits.rates import Rate, parse_rate, rates_of

from ..support.rates import most_in_a_window, most_units, needless_refusals
from ..support.runs import wait_for


@pytest.fixture(name="store", params=["redis", "memory"])
def fixture_store(request: pytest.FixtureRequest, client: redis.Redis) -> Any:
    if request.param == "memory":
        return MemoryLock(prefix="test")
    return RedisLock(client, prefix="test")


class TestForms:
    @pytest.mark.parametrize(
        ("value", "limit", "period"),
        [
            ("100/m", 100, 60.0),
            ("10/s", 10, 1.0),
            ("5/h", 5, 3600.0),
            ("100/5m", 100, 300.0),
            ("2/d", 2, 86400.0),
            (20, 20, 1.0),
            ((100, timedelta(minutes=1)), 100, 60.0),
            ((3, 7.5), 3, 7.5),
            ("0.5/s", 1, 2.0),
        ],
    )
    def test_celery_and_timedelta_forms(self, value: object, limit: int, period: float) -> None:
        rate = parse_rate(value)
        assert (rate.limit, rate.period, rate.burst) == (limit, period, 1)

    @pytest.mark.parametrize(
        ("value", "burst", "says"),
        [
            ("100 per minute", 1, "rate_limit does"),
            ("0/m", 1, "must be positive"),
            ((5, -1.0), 1, "period must be positive"),
            (True, 1, "write '100/m'"),
            ("10/s", 0, "burst=0"),
        ],
    )
    def test_bad_forms_say_what_to_write(self, value: object, burst: object, says: str) -> None:
        with pytest.raises(ConfigurationError, match=says):
            parse_rate(value, burst)


class TestAnswers:
    def test_a_burst_then_a_refusal_that_says_when(self, store: Any) -> None:
        rates, rate = rates_of(store), Rate(10, 1.0, burst=3)
        answers = [rates.ask("api", rate) for _ in range(4)]
        assert [a.state for a in answers] == ["now", "now", "now", "refused"]
        assert [a.remaining for a in answers[:3]] == [2, 1, 0]
        assert 0.08 < answers[3].wait <= 0.1 + 1e-6
        time.sleep(answers[3].wait + 0.01)
        assert rates.ask("api", rate).now
        assert rates.ask("other", rate).now  # names are apart

    def test_reserved_slots_are_one_interval_apart_in_the_order_asked(self, store: Any) -> None:
        rates, rate = rates_of(store), Rate(20, 1.0)
        slots = [rates.ask("export", rate, "reserve") for _ in range(6)]
        assert [s.state for s in slots] == ["now"] + ["reserved"] * 5
        gaps = [b.at - a.at for a, b in itertools.pairwise(slots)]
        assert gaps == pytest.approx([0.05] * 5, abs=1e-6)
        # Waits count from when each was answered (the rate's clock, in the answer): not
        # from the first ask, which a loaded machine answers some milliseconds before.
        assert slots[-1].wait == pytest.approx(slots[0].at + 0.25 - slots[-1].clock, abs=1e-3)
        # The next take waits for the slot after the last one reserved.
        refused = rates.ask("export", rate)
        assert refused.state == "refused"
        assert refused.wait == pytest.approx(slots[0].at + 0.3 - refused.clock, abs=1e-3)

    def test_peek_takes_nothing(self, store: Any) -> None:
        rates, rate = rates_of(store), Rate(2, 1.0, burst=2)
        assert rates.ask("p", rate, "peek").remaining == 2
        assert rates.ask("p", rate, "peek").remaining == 2
        assert rates.ask("p", rate).remaining == 1

    def test_a_reserved_slot_is_due_on_the_same_clock_and_counts_nothing(self, store: Any) -> None:
        rates, rate = rates_of(store), Rate(5, 1.0)
        first, later = (rates.ask("d", rate, "reserve") for _ in range(2))
        assert first.now
        assert later.state == "reserved"
        early = rates.ask("d", rate, "due", at=later.at)
        assert early.state == "reserved"
        assert 0.1 < early.wait <= 0.2 + 1e-6
        time.sleep(early.wait + 0.01)
        due = rates.ask("d", rate, "due", at=later.at)
        assert due.now
        assert due.wait == 0
        assert due.at == pytest.approx(later.at)
        # Asking counted nothing: the next reservation is the one after ``later``.
        assert rates.ask("d", rate, "reserve").at == pytest.approx(later.at + 0.2, abs=1e-6)


class TestLateRuns:
    """A run that comes later than its grace (its worker was saturated, or died holding
    it) starts now if the runs that started leave room, else on the next free slot."""

    def test_late_runs_start_now_while_the_starts_leave_room(self, store: Any) -> None:
        if isinstance(store, MemoryLock):  # time moved by hand; Redis's passes
            store = MemoryLock(prefix="test", clock=ManualClock())
        rates, rate = rates_of(store), Rate(10, 1.0)  # a run every 0.1 s; grace 0.1 s
        slots = [rates.ask("late", rate, "reserve") for _ in range(3)]
        wait_until_past(rates.ask("late", rate, "peek").clock, slots[-1].at + 0.15, store)
        late = [rates.ask("late", rate, "due", at=s.at, grace=0.1) for s in slots]
        # The first starts now, not on its slot; the others would start with it: each is
        # given the next free slot instead, in the order they came, 0.1 s apart.
        assert [a.state for a in late] == ["now", "reserved", "reserved"]
        assert late[0].at > slots[-1].at + 0.1
        gaps = [b.at - a.at for a, b in itertools.pairwise(late)]
        assert gaps == pytest.approx([0.1, 0.1], abs=1e-3)
        # One whose turn is near waits for it where it is: now, after the wait, on the
        # first start the runs that started leave (a slot reserved is a promise of the
        # schedule; whoever starts first takes the start, the other is given another).
        near = rates.ask("late", rate, "due", at=slots[0].at, grace=0.1, near=0.5)
        assert near.state == "now"
        assert near.at - late[0].at == pytest.approx(0.1, abs=1e-3)
        assert near.wait == pytest.approx(near.at - near.clock, abs=1e-6)

    def test_the_budget_after_a_late_start_counts_it(self, store: Any) -> None:
        # A late run starts past its slot: the schedule's next slot has passed, but the
        # next run may not start until a period after it (what metrics and logs show).
        if isinstance(store, MemoryLock):
            store = MemoryLock(prefix="test", clock=ManualClock())
        rates, rate = rates_of(store), Rate(10, 1.0)
        slot = rates.ask("behind", rate, "reserve")
        wait_until_past(slot.clock, slot.at + 0.25, store)
        late = rates.ask("behind", rate, "due", at=slot.at, grace=0.1)
        assert late.now
        assert late.at > slot.at + 0.2
        for answer in (late, rates.ask("behind", rate, "peek")):
            assert answer.remaining == 0
            assert answer.free == pytest.approx(late.at + 0.1, abs=1e-3)

    def test_runs_late_on_every_return_all_start_within_the_rate(self) -> None:
        # Workers that stay behind: every message comes back 0.5 s after its slot, five
        # times the grace. Were a late run only given a new slot, none would ever start.
        clock = ManualClock()
        rates, rate, lag = rates_of(MemoryLock(prefix="test", clock=clock)), Rate(10, 1.0), 0.5
        pending: list[tuple[float, int, float | None]] = [
            (clock.time(), n, None) for n in range(40)
        ]
        started: dict[int, float] = {}
        for _ in range(40 * 20):  # bounded: a livelock fails instead of hanging
            if not pending:
                break
            pending.sort()
            arrives, n, slot = pending.pop(0)
            clock.advance(max(0.0, arrives - clock.time()))
            if slot is None:
                answer = rates.ask("busy", rate, "start", near=0.05)
            else:
                answer = rates.ask("busy", rate, "due", at=slot, grace=0.1, near=0.05)
            if answer.now:
                started[n] = answer.at
            else:
                pending.append((answer.at + lag, n, answer.at))
        assert sorted(started) == list(range(40)), f"{40 - len(started)} never started"
        starts = sorted(started.values())
        assert most_in_a_window(starts, 1.0) <= 10  # the rate, in every window
        took = starts[-1] - starts[0]
        assert took < 40 / 10 * 2, f"{took:.1f}s: late runs cost the rate more than half"


def wait_until_past(now: float, moment: float, store: Any) -> None:
    """Until the rate's clock is past ``moment``: advanced (memory), or waited (Redis)."""
    if isinstance(store, MemoryLock) and isinstance(store.clock, ManualClock):
        store.clock.advance(max(0.0, moment - now))
    else:
        time.sleep(max(0.0, moment - now))


class TestRedis:
    def test_many_clients_never_exceed_the_rate_in_any_window(self, client: redis.Redis) -> None:
        rate, seconds = Rate(50, 1.0), 1.6
        taken: list[float] = []
        answers: list[tuple[float, bool, list[float]]] = []
        guard = threading.Lock()
        name = f"hot-{time.monotonic_ns()}"  # no schedule left by an earlier run

        def hammer() -> None:
            rates = rates_of(RedisLock(client, prefix="test"))
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                answer = rates.ask(name, rate)
                with guard:
                    answers.append((answer.clock, answer.now, [1.0]))
                    if answer.now:
                        taken.append(answer.at)
                if not answer.now:
                    time.sleep(min(answer.wait, 0.005))

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        taken.sort()
        most = max(
            bisect.bisect_left(taken, start + rate.period) - i for i, start in enumerate(taken)
        )
        print(f"rate 50/s over {seconds}s, 4 clients: {len(taken)} taken, at most {most} in 1 s")
        assert most <= rate.limit
        # The rate is used: no call was refused that it had room for when it asked (how
        # many are taken in all depends on how often the clients got a core to ask).
        assert len(taken) > 1
        assert needless_refusals(answers, [rate]) == []

    def test_the_key_lasts_only_until_the_next_call_is_due(self, client: redis.Redis) -> None:
        rates = rates_of(RedisLock(client, prefix="test"))
        rates.ask("short", Rate(10, 1.0))
        key = rates.key("short")
        assert 0 < int(client.pttl(key)) <= 102
        time.sleep(0.15)
        assert not client.exists(key)


class TestSeveralLimitsAndCosts:
    def test_a_call_refused_by_one_limit_is_charged_against_none(self, store: Any) -> None:
        rates = rates_of(store)
        # The loose limit refills one unit a second: a loaded machine's pause of a few
        # milliseconds between the asks must not give back what they were charged.
        loose, tight = Rate(100, 100.0, burst=5), Rate(2, 10.0, burst=2)
        both = [(loose, 1.0), (tight, 1.0)]
        assert [rates.ask("two", both).state for _ in range(3)] == ["now", "now", "refused"]
        refused = rates.ask("two", both)
        assert refused.limiting == 1  # the tight one said no
        assert 4.9 < refused.wait <= 5.0 + 1e-6
        # The loose limit counted the two that ran, not the refused ones.
        assert rates.ask("two", [(loose, 1.0)], "peek").remaining == 3

    def test_a_deferred_call_waits_for_the_latest_slot_and_each_limit_counts_it(
        self, store: Any
    ) -> None:
        rates = rates_of(store)
        fast, slow = Rate(10, 1.0), Rate(4, 2.0, burst=2)
        both = [(fast, 1.0), (slow, 1.0)]
        slots = [rates.ask("late", both, "reserve") for _ in range(4)]
        base = slots[0].at
        # Each call at the later of the two: fast alone would give 0, .1, .2, .3 (and
        # counts each at its slot), slow 0, 0, .5, 1.0 (two at once, then one per .5 s).
        assert [s.at - base for s in slots] == pytest.approx([0, 0.1, 0.5, 1.0], abs=1e-6)
        assert [s.limiting for s in slots[2:]] == [1, 1]
        # fast counted each call at its slot: its next is .1 after the last one.
        assert rates.ask("late", [(fast, 1.0)], "reserve").at - base == pytest.approx(1.1, abs=1e-6)

    def test_a_cost_moves_the_schedule_by_that_many_units(self, store: Any) -> None:
        rates, rate = rates_of(store), Rate(10, 1.0, burst=5)
        first = rates.ask("tokens", [(rate, 5.0)], "reserve")
        assert first.now
        assert first.remaining == 0
        then = [rates.ask("tokens", [(rate, cost)], "reserve") for cost in (1.0, 3.0, 0.0)]
        # 5 units at once (the burst), then one every 0.1 s: 1 unit at .1, and 3 more
        # once the schedule has room for 3 (.6 - .4 of tolerance + .2 for 2 more units).
        assert [s.at - first.at for s in then[:2]] == pytest.approx([0.1, 0.4], abs=1e-6)
        assert then[2].now  # a call that costs nothing is never held back

    def test_a_pause_moves_the_schedule_on_by_its_length_once(self, store: Any) -> None:
        rates, rate = rates_of(store), Rate(10, 1.0)
        slots = [rates.ask("held", rate, "reserve") for _ in range(3)]
        began = slots[0].at + 0.05  # paused after the first slot, for 30 s
        pause = (began, began + 30.0)
        moved = rates.ask("held", rate, "reserve", paused=pause)
        # The two slots after the pause's start moved on 30 s, and the next is after them.
        assert moved.at - slots[0].at == pytest.approx(30.3, abs=1e-3)
        again = rates.ask("held", rate, "reserve", paused=pause)  # moved once only
        assert again.at - moved.at == pytest.approx(0.1, abs=1e-6)

    def test_a_schedule_outlives_a_longer_pause_while_runs_are_held_back(
        self, client: redis.Redis
    ) -> None:
        # Three slots 50 ms apart: their key expires once the last has passed. A pause
        # began after the first and outlasts them; only the runs it held back, going
        # round, keep the schedule (``keep``) for the resume to move on.
        rates, rate = rates_of(RedisLock(client, prefix="test")), Rate(20, 1.0)
        kept = [rates.ask("kept", rate, "reserve") for _ in range(3)]
        lost = [rates.ask("lost", rate, "reserve") for _ in range(3)]
        rates.keep("kept", 3600.0)
        wait_for(lambda: not client.exists(rates.key("lost")), 5, "the schedule expired")
        assert client.exists(rates.key("kept"))
        began = kept[0].at + 0.01
        pause = (began, began + 30.0)
        moved = rates.ask("kept", rate, "reserve", paused=pause)
        # Behind the two slots the pause moved on, as with a short pause.
        assert moved.at - kept[-1].at == pytest.approx(30.05, abs=1e-3)
        # Without it the first call after the resume would take a slot at once, beside
        # the held-back runs' moved ones: over the rate.
        after = rates.ask("lost", rate, "reserve", paused=(lost[0].at + 0.01, began + 30.0))
        assert after.at == after.clock
        # The first decision after the resume set the key's expiry back to its schedule's.
        assert client.pttl(rates.key("kept")) <= (moved.at - moved.clock + 0.06) * 1000

    def test_keep_never_makes_a_schedule_nor_shortens_one(self, client: redis.Redis) -> None:
        rates, rate = rates_of(RedisLock(client, prefix="test")), Rate(1, 60.0)
        rates.keep("none", 60.0)  # nothing reserved: nothing to move
        assert not client.exists(rates.key("none"))
        rates.ask("far", rate, "reserve")
        rates.ask("far", rate, "reserve")  # its schedule ends two minutes on
        rates.keep("far", 1.0)
        assert client.pttl(rates.key("far")) > 100_000

    def test_a_kept_schedule_outlives_its_slots_where_an_unkept_one_is_let_go(self) -> None:
        clock = ManualClock()  # memory:// runs the same scripts, time moved by hand
        rates, rate = rates_of(MemoryLock(prefix="test", clock=clock)), Rate(20, 1.0)
        kept = [rates.ask(name, rate, "reserve") for name in ("kept", "lost")]
        rates.keep("kept", 30.0)
        clock.advance(1.0)  # both schedules' slots have passed
        pause = (kept[0].at - 0.01, kept[0].at + 29.0)
        moved = [rates.ask(name, rate, "reserve", paused=pause) for name in ("kept", "lost")]
        assert moved[0].at == pytest.approx(kept[0].at + 29.06, abs=1e-6)
        assert moved[1].at == moved[1].clock  # its schedule was let go

    def test_a_cost_over_a_burst_is_refused_saying_what_to_change(self, store: Any) -> None:
        rates, rate = rates_of(store), Rate(1000, 60.0, burst=500)
        with pytest.raises(CostOverBurstError, match=r"burst=600"):
            rates.ask("big", [(rate, 600.0)])
        assert rates.ask("big", [(rate, 500.0)]).now  # nothing was charged for it

    def test_contended_costs_keep_every_window_of_every_limit(self, client: redis.Redis) -> None:
        # Requests a second and tokens per 2 s, each call 1 to 4 tokens, 4 clients.
        calls, tokens = Rate(30, 1.0), Rate(120, 2.0, burst=8)
        taken: list[tuple[float, float]] = []
        answers: list[tuple[float, bool, list[float]]] = []
        guard = threading.Lock()
        name = f"llm-{time.monotonic_ns()}"  # no schedule left by an earlier run

        def hammer(seed: int) -> None:
            rates = rates_of(RedisLock(client, prefix="test"))
            deadline = time.monotonic() + 2.5
            n = seed
            while time.monotonic() < deadline:
                cost = float(n % 4 + 1)
                n += 1
                answer = rates.ask(name, [(calls, 1.0), (tokens, cost)])
                with guard:
                    answers.append((answer.clock, answer.now, [1.0, cost]))
                    if answer.now:
                        taken.append((answer.at, cost))
                if not answer.now:
                    time.sleep(min(answer.wait, 0.005))

        threads = [threading.Thread(target=hammer, args=(s,)) for s in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert most_units([(at, 1.0) for at, _ in taken], 1.0) <= calls.limit
        assert most_units(taken, 2.0) <= tokens.burst - 1 + tokens.limit
        print(f"2 limits, 4 clients: {len(taken)} calls, {sum(c for _, c in taken):g} tokens")
        # Both limits are used: no call was refused that they had room for as it asked.
        assert len(taken) > 1
        assert needless_refusals(answers, [calls, tokens]) == []
