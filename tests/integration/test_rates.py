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

from celery_singleton_lock import ConfigurationError, MemoryLock, RedisLock
from celery_singleton_lock.lease.limits.rates import Rate, parse_rate, rates_of


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


class TestRedis:
    def test_many_clients_never_exceed_the_rate_in_any_window(self, client: redis.Redis) -> None:
        rate, seconds = Rate(50, 1.0), 1.6
        taken: list[float] = []
        guard = threading.Lock()

        def hammer() -> None:
            rates = rates_of(RedisLock(client, prefix="test"))
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                answer = rates.ask("hot", rate)
                if answer.now:
                    with guard:
                        taken.append(answer.at)
                else:
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
        assert len(taken) >= int(seconds * rate.limit * 0.9)

    def test_the_key_lasts_only_until_the_next_call_is_due(self, client: redis.Redis) -> None:
        rates = rates_of(RedisLock(client, prefix="test"))
        rates.ask("short", Rate(10, 1.0))
        key = rates.key("short")
        assert 0 < int(client.pttl(key)) <= 102
        time.sleep(0.15)
        assert not client.exists(key)
