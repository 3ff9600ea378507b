"""The decisions as Celery events: a real worker sending task events (-E), a producer with
``task_send_sent_event``, and an ``app.events.Receiver`` that sees each with its fields."""

from __future__ import annotations

import os
import time
import uuid as uuids
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import chain

from celery_singleton_lock import BackpressureError, DuplicateTaskError, RateLimitedError
from celery_singleton_lock.contrib import decisions, events, limits
from celery_singleton_lock.lease import LockKeys
from celery_singleton_lock.lease.limits.overrides import REFRESH

from ..conftest import CeleryEnv
from ..support.monitors import Flower, Seen
from ..support.runs import UNTIL_OPENED, dropped, open_gate, started, wait_for
from ..support.web import CHROMEDRIVER, CHROMIUM, browser
from ..support.workers import Worker

pytestmark = pytest.mark.slow


@pytest.fixture(name="events_worker", scope="module")
def fixture_events_worker(celery_env: CeleryEnv) -> Iterator[Worker]:
    # A short ttl: renewal (every third of it) finds a lost lease within a second.
    extra = {"CSL_TASK_EVENTS": "1", "CSL_TTL": "3"}
    worker = Worker(celery_env.env, extra_env=extra).start()
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(name="seen")
def fixture_seen(cenv: CeleryEnv) -> Iterator[Seen]:
    with Seen(cenv.app_module.app) as seen:
        yield seen


@pytest.fixture(name="sent_events")
def fixture_sent_events(cenv: CeleryEnv) -> Iterator[None]:
    app = cenv.app_module.app
    app.conf.task_send_sent_event = True
    events.follow(app)  # a change at run time: read again
    try:
        yield
    finally:
        app.conf.task_send_sent_event = False
        events.follow(app)


def _lock(task: Any, item: str) -> str:
    return LockKeys.build("t", task.singleton_options().key.derive((item,), {})).lock


def _started(cenv: CeleryEnv, item: str) -> None:
    wait_for(lambda: any(s["item"] == item for s in started(cenv)), 20, f"{item} started")


@pytest.mark.usefixtures("sent_events")
def test_a_worker_with_events_and_a_producer_with_sent_events_send_each_decision(
    cenv: CeleryEnv, events_worker: Worker, seen: Seen
) -> None:
    app, queue = cenv.app_module, events_worker.queue
    strict, work = app.strict, app.work
    key = strict.singleton_options().key.derive(("ev",), {})

    holder = strict.apply_async(("ev", UNTIL_OPENED), queue=queue)
    _started(cenv, "ev")
    # At execution, the key is busy: the policy fails it, naming the holder.
    contended = strict.apply_async(("ev",), queue=queue)
    with pytest.raises(DuplicateTaskError):
        contended.get(timeout=30)
    event = seen.wait("singleton-contended", uuid=contended.id)
    assert (event["key"], event["holder"], event["then"]) == (key, holder.id, "fail")
    # Its twin in Celery's task group, which Celery's own state files under the call.
    twin = seen.wait("task-singleton-contended", uuid=contended.id)
    assert (twin["key"], twin["holder"], twin["then"]) == (key, holder.id, "fail")
    assert event["name"] == strict.name
    assert event["hostname"] == events_worker.nodename
    assert event["result"] == f"{key!r} is held by {holder.id}: fail"
    # A copy of the holder's own message: dropped, under the holder's id.
    app.app.send_task(strict.name, ("ev",), task_id=holder.id, queue=queue)
    wait_for(lambda: dropped(cenv, holder.id), 20, "copy dropped")
    event = seen.wait("singleton-copy-dropped", uuid=holder.id)
    assert (event["key"], event["holder"], event["holder_state"]) == (key, holder.id, "running")
    # No twin: filed under the holder's id, it would be the running holder's status.
    assert not [
        e for e in seen.after_marker() if e.get("singleton") == "copy-dropped" and e is not event
    ]
    # The holder loses its lease (its key gone under it): renewal says so.
    cenv.lock_client().delete(_lock(strict, "ev"))
    event = seen.wait("singleton-lease-lost", uuid=holder.id)
    assert event["key"] == key
    # Sent from the renewal thread, filed under the run's worker all the same.
    assert event["hostname"] == events_worker.nodename
    assert isinstance(event["fence"], int)
    open_gate(cenv, "ev")
    holder.get(timeout=30, propagate=False)

    # At dispatch (this process, a producer with task_send_sent_event): a duplicate.
    first = work.apply_async(("ev-d", 1.0), queue=queue)
    again = work.apply_async(("ev-d", 1.0), queue=queue)
    assert again.id == first.id  # the holder's result
    event = seen.wait("singleton-refused", holder=first.id)
    assert event["key"] == work.singleton_options().key.derive(("ev-d",), {})
    assert event["uuid"] != first.id  # the refused call's own id
    assert first.get(timeout=30) == "ev-d"

    # A rate's slot: the runs past its budget are deferred to theirs.
    rated = app.rated_pair
    results = [rated.apply_async(("ev-r", n), queue=queue) for n in range(5)]
    assert [r.get(timeout=30) for r in results] == list(range(5))
    deferred = seen.of("singleton-deferred")
    assert deferred, "no run was deferred"
    assert {e["uuid"] for e in deferred} <= {r.id for r in results}
    for event in deferred:
        assert event["key"] == rated.singleton_options().key.derive(("ev-r",), {})
        assert event["delay"] > 0
        assert event["slot"] > event["timestamp"] - 5


@pytest.mark.usefixtures("sent_events")
def test_a_producer_tells_its_rate_deferrals_rate_refusals_and_attached_members(
    cenv: CeleryEnv, events_worker: Worker, seen: Seen
) -> None:
    app, queue = cenv.app_module, events_worker.queue
    tag = uuids.uuid4().hex[:6]
    # on_limited="delay": the second call is sent with the countdown to its slot.
    slow = app.delayed_slowly
    first = slow.apply_async((f"ev-dl-{tag}", 1), queue=queue)
    later = slow.apply_async((f"ev-dl-{tag}", 2), queue=queue)
    event = seen.wait("singleton-deferred", uuid=later.id)
    assert event["key"] == slow.singleton_options().key.derive((f"ev-dl-{tag}",), {})
    assert 0 < event["delay"] <= 2.5
    assert event["slot"] > event["timestamp"]
    # Its twin leaves the status Celery's (PENDING, then its run's) with the words.
    twin = seen.wait(decisions.GOES_ON_TWIN, uuid=later.id)
    assert twin["result"].endswith("to its slot at dispatch")
    assert not seen.of("singleton-deferred", uuid=first.id)  # a slot now: nothing to tell
    assert [first.get(timeout=30), later.get(timeout=30)] == [1, 2]

    # on_limited="raise": refused, nothing sent, told under the id it would have had.
    checked, refused_id = app.rate_checked, ""
    for n in range(6):
        try:
            checked.apply_async((f"ev-rl-{tag}", n), queue=queue, task_id=f"rl-{tag}-{n}")
        except RateLimitedError:
            refused_id = f"rl-{tag}-{n}"
            break
    assert refused_id, "no call was over the rate"
    event = seen.wait("singleton-rate-limited", uuid=refused_id)
    assert event["key"] == checked.singleton_options().key.derive((f"ev-rl-{tag}",), {})
    assert event["retry_after"] > 0
    assert event["paused"] is False
    assert seen.wait("task-singleton-rate-limited", uuid=refused_id)["result"].startswith(
        "refused at dispatch:"
    )

    # A chain's first step, its key held by a running call: attached to the holder.
    work = app.work
    holder = work.apply_async((f"ev-a-{tag}", UNTIL_OPENED), queue=queue)
    _started(cenv, f"ev-a-{tag}")
    sent = chain(work.si(f"ev-a-{tag}").set(queue=queue), app.follow.s(1).set(queue=queue))
    result = sent.apply_async()
    event = seen.wait("singleton-attached", holder=holder.id)
    assert event["uuid"] == result.parent.id
    assert event["key"] == work.singleton_options().key.derive((f"ev-a-{tag}",), {})
    open_gate(cenv, f"ev-a-{tag}")
    assert result.get(timeout=30) == [f"ev-a-{tag}", 1]


@pytest.mark.usefixtures("sent_events")
def test_a_producer_tells_a_call_max_pending_refused_once(cenv: CeleryEnv, seen: Seen) -> None:
    """Nothing consumes the queue: its calls wait, a place each, until max_pending's full."""
    capped = cenv.app_module.capped_delayed  # 1/m, "delay", at most 3 waiting
    tag = uuids.uuid4().hex[:6]
    item, parked, refused_id = f"ev-bp-{tag}", f"parked-{tag}", f"bp-{tag}"
    key = capped.singleton_options().key.derive((item,), {})
    try:
        sent = [capped.apply_async((item, n), queue=parked) for n in range(3)]
        with pytest.raises(BackpressureError) as refused:
            capped.apply_async((item, 3), queue=parked, task_id=refused_id)
        event = seen.wait("singleton-backpressured", uuid=refused_id)
        assert (event["key"], event["waiting"], event["cap"]) == (key, 3, 3)
        assert event["retry_after"] == pytest.approx(refused.value.retry_after)
        assert 0 < event["retry_after"] <= 60
        assert event["name"] == capped.name
        # Nothing was sent: its status says why (Flower's SINGLETON-BACKPRESSURED).
        twin = seen.wait("task-singleton-backpressured", uuid=refused_id)
        assert twin["result"] == (
            f"refused at dispatch: {key!r} has 3 calls waiting, as many as max_pending=3 "
            f"allows; try again in {event['retry_after']:.3f}s"
        )
        told = [e for e in seen.after_marker() if e.get("key") == key]
        pressed = [e["uuid"] for e in told if e["type"] == "singleton-backpressured"]
        assert pressed == [refused_id]  # once, and only the call refused
        deferred = {e["uuid"] for e in told if e["type"] == "singleton-deferred"}
        assert deferred == {sent[1].id, sent[2].id}  # the first's slot was now
    finally:
        cenv.broker.client().delete(parked)


def test_a_call_waiting_its_turn_and_a_paused_one_are_told(cenv: CeleryEnv, seen: Seen) -> None:
    """Both end their delivery with Ignore (no event of Celery's): ours say why."""
    app, tag = cenv.app_module, uuids.uuid4().hex[:6]
    blocker, turn, paused = f"g-{tag}", f"t-{tag}", f"p-{tag}"
    worker = Worker(cenv.env, concurrency=4, extra_env={"CSL_TASK_EVENTS": "1"}).start()
    try:
        gated = [
            app.export_fair.apply_async((blocker, UNTIL_OPENED), queue=worker.queue)
            for _ in range(2)
        ]
        wait_for(
            lambda: sum(s["item"] == blocker for s in started(cenv)) == 2, 30, "the total full"
        )
        waiting = app.export_fair.apply_async((turn, 0.1), queue=worker.queue)
        event = seen.wait("singleton-waiting-turn", uuid=waiting.id)
        assert event["key"] == f"fair:{turn}"
        assert seen.wait(decisions.GOES_ON_TWIN, uuid=waiting.id)["result"].startswith(
            "waits for its turn"
        )
        open_gate(cenv, blocker)
        assert waiting.get(timeout=30) == turn
        open_gate(cenv, blocker)
        for each in gated:
            each.get(timeout=30)

        limits.set(app.app, f"fair:{paused}", paused=True, by="ops@events")
        # Every worker process reads an operator's change within REFRESH.
        time.sleep(2 * REFRESH)
        held = app.export_fair.apply_async((paused, 0.1), queue=worker.queue)
        event = seen.wait("singleton-paused", uuid=held.id)
        assert (event["key"], event["target"], event["by"]) == (
            f"fair:{paused}",
            f"fair:{paused}",
            "ops@events",
        )
        assert event["paused_at"] <= event["timestamp"]
        limits.set(app.app, f"fair:{paused}", paused=False)
        assert held.get(timeout=30) == paused
        # Told once a call, not at each round it is sent again while paused.
        assert len(seen.of("singleton-paused", uuid=held.id)) == 1
    except BaseException:
        print(worker.output()[-6000:])
        raise
    finally:
        worker.stop()
        limits.set(app.app, f"fair:{paused}", reset=True)


def test_a_wait_that_runs_out_is_told_with_what_the_run_does_then(
    cenv: CeleryEnv, events_worker: Worker, seen: Seen
) -> None:
    """``wait(timeout=0.3, then=skip())``: told as it waits, and again as it is skipped
    (Ignore sends no Celery event: without this, Flower would show it waiting for ever)."""
    app, queue = cenv.app_module, events_worker.queue
    task = app.exclusive_wait_skip
    holder = task.apply_async(("ev-wait", UNTIL_OPENED), queue=queue)
    _started(cenv, "ev-wait")
    # A copy sent by name (a dispatch would be refused as a duplicate): it meets the holder.
    waiting = app.app.send_task(task.name, ("ev-wait",), queue=queue)
    skipped = wait_for(
        lambda: [e for e in seen.of("singleton-contended", uuid=waiting.id) if e.get("waited")],
        20,
        "told again once the wait ran out",
    )[0]
    assert (skipped["then"], skipped["holder"]) == ("skip", holder.id)
    assert "waited in vain, then skip" in skipped["result"]
    [first] = [e for e in seen.of("singleton-contended", uuid=waiting.id) if not e.get("waited")]
    assert first["then"] == "wait"
    # Its status is the decision's: nothing else comes for a skipped call.
    twin = seen.wait("task-singleton-contended", uuid=waiting.id)
    assert twin["then"] == "skip"
    open_gate(cenv, "ev-wait")
    holder.get(timeout=30)


def test_without_events_nothing_is_sent(cenv: CeleryEnv, worker: Worker, seen: Seen) -> None:
    """The shared worker sends no task events, this producer no task-sent events."""
    app, queue = cenv.app_module, worker.queue
    holder = app.strict.apply_async(("ev-off", UNTIL_OPENED), queue=queue)
    _started(cenv, "ev-off")
    with pytest.raises(DuplicateTaskError):
        app.strict.apply_async(("ev-off",), queue=queue).get(timeout=30)
    first = app.work.apply_async(("ev-off-d", 0.5), queue=queue)
    assert app.work.apply_async(("ev-off-d", 0.5), queue=queue).id == first.id
    open_gate(cenv, "ev-off")
    holder.get(timeout=30)
    first.get(timeout=30)
    ours = ("singleton-", "task-singleton-")
    told = [e["type"] for e in seen.after_marker() if e["type"].startswith(ours)]
    assert told == []


def test_a_worker_without_e_follows_enable_and_disable_events(cenv: CeleryEnv, seen: Seen) -> None:
    """Flower sends ``enable_events`` to workers started without -E: from then on the
    library's decisions are sent too, from the pool processes, until ``disable_events``.
    (Heartbeats on, as workers run by default: without any event Celery has no dispatcher
    to turn on.)"""
    app = cenv.app_module
    worker = Worker(cenv.env, concurrency=2, without=("gossip", "mingle")).start()
    control = app.app.control
    try:
        control.enable_events(destination=[worker.nodename])
        wait_for(lambda: "task events enabled by remote" in worker.output(), 20, "followed")
        holder = app.strict.apply_async(("ev-remote", UNTIL_OPENED), queue=worker.queue)
        _started(cenv, "ev-remote")
        contended = app.strict.apply_async(("ev-remote",), queue=worker.queue)
        with pytest.raises(DuplicateTaskError):
            contended.get(timeout=30)
        event = seen.wait("singleton-contended", uuid=contended.id)
        assert (event["holder"], event["hostname"]) == (holder.id, worker.nodename)

        control.disable_events(destination=[worker.nodename])
        wait_for(lambda: "task events disabled by remote" in worker.output(), 20, "followed")
        again = app.strict.apply_async(("ev-remote",), queue=worker.queue)
        with pytest.raises(DuplicateTaskError):
            again.get(timeout=30)
        # (the run's pool process has read the flag before its decision: none is sent)
        assert not [e for e in seen.after_marker() if e.get("uuid") == again.id]
        open_gate(cenv, "ev-remote")
        holder.get(timeout=30)
    finally:
        worker.stop()


def test_flower_shows_a_waiting_call_waits_for_its_keys_holder(
    cenv: CeleryEnv, events_worker: Worker
) -> None:
    app, queue = cenv.app_module, events_worker.queue
    with Flower(cenv.env) as flower:
        flower.listening(app.app)
        holder = app.patient.apply_async(("fl", UNTIL_OPENED), queue=queue)
        _started(cenv, "fl")
        waiting = app.patient.apply_async(("fl",), queue=queue)  # waits up to 20 s
        key = app.patient.singleton_options().key.derive(("fl",), {})

        said = f"{key!r} is held by {holder.id}: wait up to 20s"

        def told() -> dict[str, Any] | None:
            info = flower.task(waiting.id)
            return info if info and info.get("result") == said else None

        info = wait_for(told, 30, "Flower's result of the waiting call")
        # It waits in its run: Celery's own status, which its later events replace.
        assert info["state"] == "STARTED"
        assert info["worker"] == events_worker.nodename
        page = flower.page(waiting.id)
        assert "STARTED" in page
        assert f"is held by {holder.id}: wait up to 20s" in page
        open_gate(cenv, "fl")
        assert waiting.get(timeout=30) == "fl"
        wait_for(lambda: (flower.task(waiting.id) or {}).get("state") == "SUCCESS", 20, "SUCCESS")


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs chromium and chromium-driver")
def test_a_screenshot_of_flowers_task_page(
    cenv: CeleryEnv, events_worker: Worker, tmp_path: Path
) -> None:
    """``python3 scripts/dev.py screenshot`` writes it into the docs (CSL_FLOWER_SCREENSHOT)."""
    app, queue = cenv.app_module, events_worker.queue
    target = Path(os.environ.get("CSL_FLOWER_SCREENSHOT") or tmp_path / "flower-task.png")
    with Flower(cenv.env) as flower, browser() as driver:
        flower.listening(app.app)
        holder = app.patient.apply_async(("fl-shot", UNTIL_OPENED), queue=queue)
        _started(cenv, "fl-shot")
        waiting = app.patient.apply_async(("fl-shot",), queue=queue)
        wait_for(
            lambda: "is held by" in str((flower.task(waiting.id) or {}).get("result")),
            30,
            "Flower's result of the waiting call",
        )
        driver.set_window_size(1400, 900)
        driver.get(f"{flower.url}/task/{waiting.id}")
        assert f"is held by {holder.id}" in driver.page_source
        driver.save_screenshot(str(target))
        open_gate(cenv, "fl-shot")
        assert waiting.get(timeout=30) == "fl-shot"
        holder.get(timeout=30)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
