"""A worker's timer call to the lock store, paused while the store is out of reach."""

from __future__ import annotations

import itertools
import logging

import pytest

from celery_singleton_lock.exceptions import LockStoreUnavailableError
from celery_singleton_lock.worker import timers
from celery_singleton_lock.worker.timers import Paced


class Store:
    """A sweep's calls: each raises while the store is out of reach."""

    def __init__(self) -> None:
        self.out = True
        self.calls = 0

    def sweep(self) -> None:
        self.calls += 1
        if self.out:
            raise LockStoreUnavailableError("redis://127.0.0.1:1/0 is out of reach")


@pytest.fixture(name="now")
def fixture_now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(timers.time, "monotonic", lambda: now[0])
    return now


def test_an_outage_pauses_the_calls_longer_each_time_up_to_the_longest(now: list[float]) -> None:
    store = Store()
    paced = Paced("the sweep", store.sweep)
    tried_at = []
    for _ in range(2000):  # 200 s of ticks every 0.1 s
        before = store.calls
        paced()
        if store.calls > before:
            tried_at.append(now[0])
        now[0] += 0.1
    gaps = [round(b - a) for a, b in itertools.pairwise(tried_at)]
    assert gaps[:6] == [1, 2, 4, 8, 16, 30]
    assert set(gaps[5:]) == {30}


def test_the_outage_is_said_once_and_its_end_once(
    now: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    store = Store()
    paced = Paced("the sweep", store.sweep)
    with caplog.at_level(logging.WARNING, logger=timers.__name__):
        for _ in range(100):
            paced()
            now[0] += 1.0
        store.out = False
        for _ in range(100):
            paced()
            now[0] += 1.0
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2
    assert "the sweep paused while the lock store is out of reach" in said[0]
    assert "the sweep going on" in said[1]
    calls = store.calls
    paced()
    assert store.calls == calls + 1  # every tick again once the store answers


def test_other_errors_are_not_taken_for_an_outage(now: list[float]) -> None:
    def broken() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        Paced("the sweep", broken)()
