"""Rates as the test workers kept them: the rated runs recorded, and the sliding-window checks."""

from __future__ import annotations

import bisect
import itertools
import json
import statistics
from typing import Any

from celery_singleton_lock.lease.limits.rates import Rate

from ..conftest import CeleryEnv


def rated_runs(cenv: CeleryEnv) -> list[dict[str, Any]]:
    return [json.loads(r) for r in cenv.checker_client().lrange("rated", 0, -1)]


def most_in_a_window(times: list[float], window: float) -> int:
    """The most of ``times`` in any half-open window ``[t, t + window)`` (every window
    that starts at one of them: a window holding the most can be slid to start there)."""
    ordered = sorted(times)
    return max(
        (bisect.bisect_left(ordered, t + window - 1e-6) - i for i, t in enumerate(ordered)),
        default=0,
    )


def most_units(charged: list[tuple[float, float]], window: float) -> float:
    """The most units charged in any half-open window ``[t, t + window)`` of (slot,
    units) pairs (every window that starts at a slot, as ``most_in_a_window``)."""
    ordered = sorted(charged)
    times = [at for at, _ in ordered]
    return max(
        (
            sum(units for _, units in ordered[i : bisect.bisect_left(times, t + window - 1e-6)])
            for i, t in enumerate(times)
        ),
        default=0.0,
    )


def closest_slots(records: list[dict[str, Any]]) -> float:
    """The shortest gap between two of the runs' slots: the rate's interval, once two
    calls waited for slots together."""
    slots = sorted(r["slot"] for r in records)
    return min(b - a for a, b in itertools.pairwise(slots))


def check_rate(records: list[dict[str, Any]], limit: int, period: float) -> dict[str, float]:
    """Every sliding window of the slots holds at most ``limit``; no run began before its
    slot; a window of start times holds about as many. Returns what was achieved."""
    slots = sorted(r["slot"] for r in records)
    most = most_in_a_window(slots, period)
    assert most <= limit, "more slots in a window than the rate"
    lags = [r["start"] - r["slot"] for r in records]
    assert min(lags) >= -0.002, f"a run began {-min(lags):.4f}s before its slot"
    starts = sorted(r["start"] for r in records)
    busiest = most_in_a_window(starts, period)
    # One more at admission (see modes/rate.py); one more for a run held up after it
    # on a loaded machine (the gap between the slot's check and the body is not ours).
    assert busiest <= limit + 2, f"{busiest} runs began within {period}s"
    span = slots[-1] - slots[0]
    return {
        "average_per_s": (len(slots) - 1) / span if span else float("inf"),
        "busiest_slots": most,
        "busiest_starts": busiest,
        "lag_p50_ms": statistics.median(lags) * 1000,
        "lag_max_ms": max(lags) * 1000,
    }


def all_delivered(cenv: CeleryEnv, worker: Any, ids: set[str]) -> bool:
    """No message of ``ids`` left to be handed out again (queued or unacked on the
    broker), and every delivery the worker received of them finished (ran or was sent
    on): from then on no copy of them can run."""
    broker = cenv.broker.client()
    unacked = b"".join(broker.hvals("unacked"))
    if broker.llen(worker.queue) or any(i.encode() in unacked for i in ids):
        return False
    log = worker.output()
    ended = ("succeeded", "ignored", "retry:")  # how Celery logs a delivery's end
    return all(
        log.count(f"[{i}] received") == sum(log.count(f"[{i}] {end}") for end in ended) for i in ids
    )


def needless_refusals(
    answers: list[tuple[float, bool, list[float]]], limits: list[Rate]
) -> list[float]:
    """The refusals a GCRA over ``limits`` would have let through, replaying ``answers``
    ((the server's clock as it answered, taken or not, units per limit)) in the server's
    order, in whole microseconds as rate.lua counts (its interval is rounded to one).

    The check that a rate is used, whatever the load: a starved client asks less often,
    but every call it was refused must have been over a limit when it asked. (Answers at
    the same microsecond go takes first: the side that never flags a refusal wrongly.)
    """
    steps = [(max(1, round(r.interval * 1e6)), r.burst - 1) for r in limits]
    tats = [0] * len(limits)
    needless = []
    for clock, taken, units in sorted(answers, key=lambda a: (a[0], not a[1])):
        now = round(clock * 1e6)
        fits = max(
            (
                tat + (cost - 1) * interval - burst * interval
                for (interval, burst), tat, cost in zip(steps, tats, units, strict=True)
                if cost > 0
            ),
            default=now,
        )
        if taken:
            tats = [
                round(max(tat, now) + cost * interval)
                for (interval, _), tat, cost in zip(steps, tats, units, strict=True)
            ]
        elif fits <= now:
            needless.append(clock)
    return needless
