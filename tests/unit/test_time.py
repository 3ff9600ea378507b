"""Durations and backoff, tested with hand-made inputs (no Redis)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_singleton_lock import ConfigurationError
from celery_singleton_lock._time import full_jitter, to_seconds, ttl_to_ms


class TestDurations:
    @pytest.mark.parametrize(
        ("value", "seconds"), [(2, 2.0), (0.5, 0.5), (timedelta(minutes=1), 60.0)]
    )
    def test_accepts_numbers_and_timedelta(self, value: object, seconds: float) -> None:
        assert to_seconds(value, what="ttl") == seconds

    def test_sub_millisecond_ttl_rounds_up_never_to_zero(self) -> None:
        assert ttl_to_ms(0.0001) == 1
        assert ttl_to_ms(1.0004) == 1001

    def test_error_names_the_option(self) -> None:
        with pytest.raises(ConfigurationError, match="queue_ttl must be positive"):
            ttl_to_ms(-5, what="queue_ttl")


class TestFullJitter:
    def test_ceiling_doubles_up_to_the_cap(self) -> None:
        ceilings = [full_jitter(n, base=0.01, cap=0.1, rng=lambda: 1.0) for n in range(6)]
        assert ceilings == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.1, 0.1])

    def test_zero_draw_gives_no_delay(self) -> None:
        assert full_jitter(5, base=0.01, cap=1, rng=lambda: 0.0) == 0.0

    @given(st.integers(min_value=0, max_value=10_000), st.floats(0, 1, exclude_max=True))
    def test_delay_stays_within_zero_and_ceiling(self, attempt: int, draw: float) -> None:
        delay = full_jitter(attempt, base=0.005, cap=0.5, rng=lambda: draw)
        assert 0 <= delay <= min(0.5, 0.005 * 2 ** min(attempt, 62))
