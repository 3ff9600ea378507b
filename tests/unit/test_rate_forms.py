"""A rate's options as users write them, read by one parser for tasks and operators alike."""

from __future__ import annotations

from datetime import timedelta

import pytest

from celery_singleton_lock import ConfigurationError, RateLimit
from celery_singleton_lock.lease.limits.rate_forms import (
    ON_LIMITED,
    Rate,
    burst_for,
    listed_rates,
    parse_burst,
    parse_cost,
    parse_on_limited,
)
from celery_singleton_lock.modes import RateSpec


class TestListedRates:
    @pytest.mark.parametrize(
        ("value", "rates"),
        [
            ("10/s", ["10/s"]),
            (20, [20]),
            ((100, 60.0), [(100, 60.0)]),  # one rate: calls and a period
            ((100, timedelta(minutes=1)), [(100, timedelta(minutes=1))]),
            (("60/m", "10000/d"), ("60/m", "10000/d")),  # two rates
            (["60/m", (5, 1.0)], ["60/m", (5, 1.0)]),
            ((True, 1.0), (True, 1.0)),  # a bool counts no calls: two forms, each refused
            ([], []),
        ],
    )
    def test_one_rate_or_a_list_of_them(self, value: object, rates: object) -> None:
        assert listed_rates(value) == rates


class TestOptions:
    def test_a_burst_is_a_whole_number_of_calls(self) -> None:
        assert parse_burst(3, "t: rate") == 3
        for bad in (0, -1, 1.5, True, "2"):
            with pytest.raises(ConfigurationError, match=r"t: rate: burst=.* must be a whole"):
                parse_burst(bad, "t: rate")

    def test_a_cost_is_units_within_every_burst_or_a_callable(self) -> None:
        assert parse_cost(None, "t") is None
        assert parse_cost(len, "t") is len
        assert parse_cost(2, "t", Rate(5, 1.0, burst=2)) == 2.0
        with pytest.raises(ConfigurationError, match=r"t: cost=2.5 is more .* burst=3 or more"):
            parse_cost(2.5, "t", Rate(5, 1.0, burst=2))
        with pytest.raises(ConfigurationError, match=r"t: cost=-1: give the units"):
            parse_cost(-1, "t")

    def test_the_least_burst_a_cost_can_start_under(self) -> None:
        assert [burst_for(cost) for cost in (0, 1, 1.2, 3.0)] == [0, 1, 2, 3]

    @pytest.mark.parametrize("how", ON_LIMITED)
    def test_on_limited_is_one_of_three(self, how: str) -> None:
        assert parse_on_limited(how, "t") == how

    def test_another_on_limited_says_what_to_choose(self) -> None:
        with pytest.raises(ConfigurationError, match=r"t: on_limited='drop': choose 'defer'"):
            parse_on_limited("drop", "t")


class TestOneParser:
    """A task's rate= and a RateLimit read their forms as the operators' rates do."""

    def test_a_task_and_a_rate_limit_read_the_same_forms(self) -> None:
        spec = RateSpec.build("t", ["60/m", RateLimit("5/s", burst=2)], 1, "delay")
        assert spec.limits is not None
        assert [limit.rate for limit in spec.limits] == [Rate(60, 60.0), Rate(5, 1.0, 2)]
        assert spec.on_limited == "delay"

    def test_a_plans_burst_and_cost_are_checked_when_the_task_is_made(self) -> None:
        with pytest.raises(ConfigurationError, match=r"t: rate: burst=0 must be"):
            RateSpec.build("t", lambda tenant: "1/s", 0, "defer")
        with pytest.raises(ConfigurationError, match=r"cost=3 is more than the burst"):
            RateSpec.build("t", lambda tenant: "1/s", 2, "defer", 3)
        assert RateSpec.build("t", lambda tenant: "1/s", 2, "defer", 2).burst == 2
