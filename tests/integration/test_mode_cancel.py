"""``on_duplicate="cancel"``: the newest call wins. In every pool a run in progress
learns it is cancelled within a bounded delay, the newer call runs after it has let go
with its own arguments and a greater fence; a run that ignores the cancel is never
overlapped; prefork can terminate it instead."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.exceptions import TaskRevokedError

from celery_singleton_lock import ConfigurationError
from celery_singleton_lock.holders import is_dead
from celery_singleton_lock.modes.cancel import CANCEL_CHECK

from ..conftest import CeleryEnv, separate_lock_server
from ..support.modes import define, dispatch_round_trips
from ..support.runs import assert_no_overlap, runs, started, wait_for
from ..support.workers import Worker

POOLS = ["prefork", "threads", "gevent", "eventlet"]


@pytest.fixture(name="pool_worker", scope="module", params=POOLS)
def fixture_pool_worker(request: pytest.FixtureRequest, celery_env: CeleryEnv) -> Iterator[Worker]:
    worker = Worker(celery_env.env, pool=request.param, concurrency=4).start()
    try:
        yield worker
    finally:
        worker.stop()


def began(cenv: CeleryEnv, item: str, count: int = 1) -> list[dict[str, Any]]:
    return wait_for(
        lambda: (s := [r for r in started(cenv) if r["item"] == item]) and len(s) >= count and s,
        20,
        f"{count} run(s) of {item} started",
    )


def hooks(cenv: CeleryEnv) -> list[dict[str, Any]]:
    return [json.loads(r) for r in cenv.checker_client().lrange("cancel_hooks", 0, -1)]


class TestEveryPool:
    def test_a_newer_call_cancels_the_run_in_progress_and_runs_after_it(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        preview, queue = cenv.app_module.preview, pool_worker.queue
        old = preview.apply_async(("p", "v1", 10.0), queue=queue)
        began(cenv, "p")
        time.sleep(2.0)
        asked = time.time()
        new = preview.apply_async(("p", "v2", 0.2), queue=queue)
        assert new.id != old.id  # the caller holds the newer call's result
        with pytest.raises(TaskRevokedError):
            old.get(timeout=20)
        assert old.state == "REVOKED"
        assert new.get(timeout=20) == "v2"
        records = {r["version"]: r for r in runs(cenv) if r["item"] == "p"}
        stopped = records["v1"]
        assert stopped["cancelled"] is True
        delay = stopped["end"] - asked
        print(
            f"\n{pool_worker.pool}: the run saw check() raise {delay * 1000:.0f} ms after the call"
        )
        assert delay < CANCEL_CHECK + 0.5
        assert stopped["end"] - stopped["start"] < 5.0  # stopped, not run to its end
        assert records["v2"]["fence"] > stopped["fence"]
        assert_no_overlap(list(records.values()))
        [hook] = hooks(cenv)
        assert hook["id"] == old.id
        assert asked <= hook["at"] <= stopped["end"] + 0.05

    def test_a_run_that_ignores_the_cancel_keeps_its_lease_and_is_never_overlapped(
        self, cenv: CeleryEnv, pool_worker: Worker
    ) -> None:
        preview, queue = cenv.app_module.preview, pool_worker.queue
        old = preview.apply_async(("i", "v1", 2.0, False), queue=queue)
        began(cenv, "i")
        new = preview.apply_async(("i", "v2", 0.1), queue=queue)
        assert old.get(timeout=20) == "v1"  # it chose to finish: its own result
        assert new.get(timeout=20) == "v2"
        records = {r["version"]: r for r in runs(cenv) if r["item"] == "i"}
        assert records["v1"]["cancelled"] is True  # told, and it carried on
        assert records["v1"]["end"] - records["v1"]["start"] >= 2.0
        assert records["v2"]["fence"] > records["v1"]["fence"]
        assert_no_overlap(list(records.values()))


class TestPendingCall:
    def test_later_calls_replace_the_pending_one_and_get_its_result(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        preview, queue = cenv.app_module.preview, worker.queue
        old = preview.apply_async(("r", "v1", 10.0), queue=queue)
        began(cenv, "r")
        # Queued (its countdown not yet up): later calls replace its arguments. (Once a
        # worker has started it, waiting for the key, they get its result instead: the
        # later calls have a countdown too, or the worker could start v3's message
        # before v4 is sent, a race a loaded machine loses.)
        pending = preview.apply_async(("r", "v2", 0.1), queue=queue, countdown=1.5)
        later = [
            preview.apply_async(("r", f"v{n}", 0.1), queue=queue, countdown=1.5) for n in (3, 4)
        ]
        assert {r.id for r in later} == {pending.id}
        assert pending.get(timeout=20) == "v4"  # the newest arguments, one run
        with pytest.raises(TaskRevokedError):
            old.get(timeout=20)
        versions = sorted(r["version"] for r in runs(cenv) if r["item"] == "r")
        assert versions == ["v1", "v4"]

    def test_a_cancelled_run_is_not_retried_by_autoretry_for(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        retrying, queue = cenv.app_module.preview_retrying, worker.queue
        old = retrying.apply_async(("a", "v1", 10.0), queue=queue)
        began(cenv, "a")
        new = retrying.apply_async(("a", "v2", 0.1), queue=queue)
        assert new.get(timeout=20) == "v2"
        with pytest.raises(TaskRevokedError):
            old.get(timeout=20)
        assert sorted(r["version"] for r in runs(cenv) if r["item"] == "a") == ["v1", "v2"]
        assert len(began(cenv, "a", 2)) == 2  # v1 once, never again


class TestDispatch:
    @separate_lock_server
    def test_round_trips_per_dispatch_next_to_plain_celery(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        app = cenv.app_module
        counted = dispatch_round_trips(
            cenv.lock_client(),
            {"plain": (app.plain, ("rt",)), "preview": (app.preview, ("rt", "v1"))},
        )
        # The pending hold, as until_executing takes it; it is also what cancels a run.
        assert counted == {"plain": 0, "preview": 1}


class TestHardStop:
    def test_prefork_terminates_a_cancelled_run_and_the_newer_one_follows(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        hard, queue = cenv.app_module.preview_hard, worker.queue
        old = hard.apply_async(("h", "v1", 30.0), queue=queue)
        [first] = began(cenv, "h")
        asked = time.monotonic()
        new = hard.apply_async(("h", "v2", 0.1), queue=queue)
        assert new.get(timeout=20) == "v2"
        took = time.monotonic() - asked
        print(f"\nprefork hard stop: the newer run done {took:.2f}s after the call")
        assert took < 5.0  # not the 30 s the old run would have taken
        with pytest.raises(TaskRevokedError):
            old.get(timeout=10)
        records = [r for r in runs(cenv) if r["item"] == "h"]
        assert [r["version"] for r in records] == ["v2"]  # the old one never finished
        wait_for(lambda: is_dead(first["pid"]), 5, "the cancelled run's child terminated")


class TestOptions:
    @pytest.mark.parametrize(
        ("options", "says"),
        [
            ({"on_duplicate": "cancel", "lock": "until_executed"}, r"cancel' with lock="),
            ({"on_duplicate": "cancel", "throttle": 5}, r"cancel' with throttle"),
            ({"on_duplicate": "cancel", "dedupe": False}, r"cancel' with dedupe=False"),
            ({"on_duplicate": "cancel", "limit": 2}, r"limit=2 with on_duplicate"),
            ({"on_duplicate": "cancel", "rate": "1/s"}, r"rate with on_duplicate"),
            ({"terminate_on_cancel": True}, r"terminate_on_cancel without on_duplicate='cancel'"),
            ({"on_duplicate": "cancel", "terminate_on_cancel": 1}, r"must be True or False"),
        ],
    )
    def test_contradictions_fail_at_decoration(self, options: dict[str, Any], says: str) -> None:
        with pytest.raises(ConfigurationError, match=says):
            define(**options)

    def test_cancel_is_a_pending_call_that_replaces(self) -> None:
        opts = define(on_duplicate="cancel").singleton_options()
        assert (opts.lock, opts.mode.hold_role, opts.mode.name) == (
            "until_executing",
            "pending",
            "cancel",
        )
