"""``rate=`` with ``total_limit`` round robin (``lease.limits.turns``): a call kept waiting
for its turn is not charged its rate twice, so a flood goes at the pace the rate and the
total allow together, and the rate holds in every window. On real prefork workers."""

from __future__ import annotations

import uuid

import pytest

from ..conftest import CeleryEnv
from ..support.modes import results_of
from ..support.rates import most_in_a_window
from ..support.runs import runs
from ..support.turns import check_caps, of_items, slots_free, waiting
from ..support.workers import Worker

RATED = "tests.support.celery_app.export_fair_rated"
PER_SECOND = 5  # export_fair_rated's rate, per tenant


# (tenants, calls each, seconds a run): the total the tighter limit (two slots, runs
# longer than two intervals), then two tenants' rates together over the total's pace.
@pytest.mark.parametrize(("tenants", "each", "run"), [(1, 24, 0.4), (2, 12, 0.3)])
def test_a_flood_goes_at_the_pace_of_the_rate_and_the_total(
    cenv: CeleryEnv, tenants: int, each: int, run: float
) -> None:
    app, tag = cenv.app_module, uuid.uuid4().hex[:6]
    keys = [f"t{n}-{tag}" for n in range(tenants)]
    worker = Worker(cenv.env, concurrency=4).start()
    try:
        calls = [
            app.export_fair_rated.apply_async((key, run), queue=worker.queue)
            for _ in range(each)
            for key in keys
        ]
        results_of(calls, worker, 120)
    except BaseException:
        print(worker.output()[-6000:])
        raise
    finally:
        worker.stop()
    done = of_items(runs(cenv), keys)
    assert sorted(r["id"] for r in done) == sorted(c.id for c in calls), "each ran once"
    check_caps(done, per_key=2, total=2)
    for key in keys:
        starts = [r["start"] for r in done if r["item"] == key]
        # A rate's grace (an interval, run/admission) lets one more in a window.
        most = most_in_a_window(starts, 1.0)
        assert most <= PER_SECOND + 1, f"{key}: {most} starts in a second, over the rate"
    # Ideal: each tenant's starts an interval apart, and the total's two slots busy.
    ideal = max((each - 1) / PER_SECOND + run, len(calls) * run / 2)
    took = max(r["end"] for r in done) - min(r["start"] for r in done)
    print(f"\n{len(calls)} calls of {tenants} tenant(s) in {took:.2f}s (ideal {ideal:.2f}s)")
    assert took < 1.3 * ideal, f"{took:.2f}s against {ideal:.2f}s: charged twice?"
    assert not waiting(cenv, RATED), "the room is empty"
    assert slots_free(cenv, RATED, 2), "every slot of the total given back"
