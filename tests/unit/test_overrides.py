"""Operators' overrides as values: one lock's chain merged field by field, a pause's
times, and where a slot or a paused run is after the pause."""

from __future__ import annotations

import time

import pytest

from celery_singleton_lock import ConfigurationError
from celery_singleton_lock.lease import Rate
from celery_singleton_lock.lease.limits.overrides import RECHECK, Override, changed, merged


def test_a_chain_is_merged_value_by_value_and_the_latest_pause_or_resume_wins() -> None:
    key = Override("tenant:acme", resumed_at=50.0, paused_at=40.0)  # a resume, nothing else
    task = Override("proj.sync", rates=(Rate(5, 1.0),), limit=2)
    both = merged([key, task])
    assert (both.target, both.rates, both.limit, both.paused) == (
        "tenant:acme",
        (Rate(5, 1.0),),
        2,
        False,
    )
    later = merged([key, Override("proj.sync", paused=True, paused_at=60.0)])
    assert (later.paused, later.target, later.paused_at, later.resumed_at) == (
        True,
        "proj.sync",
        60.0,
        None,
    )
    earlier = merged([key, Override("proj.sync", paused=True, paused_at=30.0)])
    assert not earlier.paused  # the key was resumed after its task was paused


def test_a_pause_and_a_resume_are_timed_and_time_stands_still_between() -> None:
    paused = changed(None, "k", paused=True)
    assert paused.paused_at is not None
    assert paused.resumed_at is None
    resumed = changed(paused, "k", paused=False)
    assert resumed.resumed_at is not None
    assert not resumed.empty  # kept: paused runs wait on its times
    began, ended = resumed.pause or (0.0, 0.0)
    assert ended == pytest.approx(resumed.resumed_at + RECHECK)
    length = ended - began
    # A slot reserved before the pause's end, after its start, moves by its length.
    assert resumed.moved(began + 1.0, began - 5.0) == pytest.approx(began + 1.0 + length)
    # Before its start, or reserved after the resume: where it was.
    assert resumed.moved(began - 1.0, began - 5.0) == began - 1.0
    assert resumed.moved(began + 1.0, resumed.resumed_at + 0.1) == began + 1.0


def test_an_override_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="limit=0 must be from 1 to 100"):
        Override("k", limit=0)
    with pytest.raises(ConfigurationError, match="give at least one rate"):
        Override("k", rates=())


def test_a_run_first_paused_stands_in_line_at_its_rate_slot() -> None:
    # A message sent to arrive on its slot may come late, after calls given later slots
    # (a busy worker): its slot keeps its place in the line the resume lets go.
    from celery_singleton_lock.run.admission import place

    began = time.time() - 60.0
    pause = Override("k", paused=True, paused_at=began)
    assert place(pause, (began + 1e-3, began - 1.0)) == pytest.approx(began + 1e-3)
    assert place(pause, (began + 3600.0, began)) <= time.time()  # never ahead of now
    assert began <= place(pause, None) <= time.time()  # no slot: when it came
    # Due before the pause: first, in their slots' order, just after the pause began,
    # so the resume moves them as every other paused run.
    early, earlier = place(pause, (began - 0.2, began - 1.0)), place(pause, (began - 3.0, 0.0))
    assert began < earlier < early <= began + 0.01
    resumed = Override("k", paused_at=began, resumed_at=began + 30.0)
    let_go = [resumed.moved(at, at) for at in (earlier, early, began + 1.0)]
    assert began + 30.0 + RECHECK < let_go[0] < let_go[1] < let_go[2]
