"""The newest call wins (cancel, replace, debounce) whoever has the pending call: still
queued, reserved by a worker with busy children, or started by an idle child where it
waits for the key. A later call made while it waits leaves its arguments for it: the run
that follows uses the newest, and every caller of the calls it covers gets its result."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_singleton_lock.lease import companion

from ..conftest import CeleryEnv
from ..support.runs import assert_no_overlap, runs, started, wait_for
from ..support.workers import Worker


@pytest.fixture(
    name="shape",
    params=[
        pytest.param(("prefork", 4), id="prefork-idle"),
        # The other shapes run in CI's fuller command.
        pytest.param(("prefork", 1), id="prefork-busy", marks=pytest.mark.oneoff),
        pytest.param(("gevent", 4), id="gevent-idle", marks=pytest.mark.oneoff),
    ],
)
def fixture_shape(request: pytest.FixtureRequest, cenv: CeleryEnv) -> Iterator[Worker]:
    pool, children = request.param
    worker = Worker(cenv.env, pool=pool, concurrency=children).start()
    try:
        yield worker
    except BaseException:
        print(worker.output()[-6000:])
        raise
    finally:
        worker.stop()


# (task, the old run's arguments after item and version): the old run lasts long enough
# for the whole burst to come while it holds the key (a cancel it ignores: obey=False).
MODES = {
    "cancel": ("preview", (4.0, False)),
    "replace": ("latest", (4.0,)),
    "debounce": ("debounced", (4.0,)),
}


def versions(cenv: CeleryEnv, item: str) -> list[str]:
    done = sorted((r for r in runs(cenv) if r["item"] == item), key=lambda r: r["start"])
    assert_no_overlap(done)
    return [r["version"] for r in done]


def burst(cenv: CeleryEnv, worker: Worker, mode: str, count: int) -> None:
    name, old_args = MODES[mode]
    task = getattr(cenv.app_module, name)
    item = f"{mode}-{uuid.uuid4().hex[:8]}"
    store = task.singleton_context.store
    pending = companion(task.singleton_options().key.derive((item, "v"), {}), "pending")
    old = task.apply_async((item, "v1", *old_args), queue=worker.queue)
    wait_for(lambda: any(s["id"] == old.id for s in started(cenv)), 20, "the old run")
    mid = task.apply_async((item, "v2", 0.1), queue=worker.queue)
    # The pending call in a worker's hands: reserved (children busy) or started by an
    # idle child, waiting for the key.
    wait_for(lambda: (store.holder(pending) or "q|").startswith(("r|", "x|")), 20, "received")
    later = [
        task.apply_async((item, f"v{n}", 0.1), queue=worker.queue) for n in range(3, count + 3)
    ]
    newest = f"v{count + 2}"
    assert {call.id for call in later} == {mid.id}, "every later call is covered by its run"
    assert mid.get(timeout=60) == newest, "the run after the old one has the newest arguments"
    wait_for(lambda: len(versions(cenv, item)) >= 2, 20, "both runs recorded")
    assert versions(cenv, item) == ["v1", newest]
    old.get(timeout=20, propagate=False)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cancel", "replace", "debounce"])
def test_the_newest_arguments_run_after_a_burst_of_three(
    cenv: CeleryEnv, shape: Worker, mode: str
) -> None:
    burst(cenv, shape, mode, 3)


@pytest.mark.slow
@pytest.mark.oneoff  # the same with twenty calls in the burst
@pytest.mark.parametrize("mode", ["cancel", "replace", "debounce"])
def test_the_newest_arguments_run_after_a_burst_of_twenty(
    cenv: CeleryEnv, shape: Worker, mode: str
) -> None:
    burst(cenv, shape, mode, 20)


def test_a_started_pending_call_s_arguments_come_from_the_newest_call(
    cenv: CeleryEnv, worker: Worker
) -> None:
    """The case the mode was wrong in: an idle child starts the pending call at once, and a
    call half a second later still wins (its caller gets the run with its arguments)."""
    preview = cenv.app_module.preview
    item = f"late-{uuid.uuid4().hex[:8]}"
    old = preview.apply_async((item, "old", 3.0, False), queue=worker.queue)
    wait_for(lambda: any(s["id"] == old.id for s in started(cenv)), 20, "the old run")
    mid = preview.apply_async((item, "mid", 0.1), queue=worker.queue)
    store: Any = preview.singleton_context.store
    pending = companion(preview.singleton_options().key.derive((item, "v"), {}), "pending")
    wait_for(lambda: (store.holder(pending) or "").startswith("x|"), 20, "mid started, waiting")
    new = preview.apply_async((item, "new", 0.1), queue=worker.queue)
    assert new.id == mid.id
    assert new.get(timeout=30) == "new"
    assert versions(cenv, item) == ["old", "new"]
