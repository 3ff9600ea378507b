"""``reopen_on=``: a failed or revoked run lets the next call in at once (throttle, and
the default lock's retries), in a real worker; and the options it is refused with."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import ConfigurationError, singleton_task

from ..conftest import CeleryEnv
from ..support.modes import of
from ..support.runs import assert_no_overlap, runs, started, wait_for
from ..support.workers import Worker


def refused_for(task: Any, args: tuple[Any, ...], holder: str, queue: str, seconds: float) -> bool:
    """Whether every call made for ``seconds`` gets ``holder``'s result (a duplicate)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if task.apply_async(args, queue=queue).id != holder:
            return False
        time.sleep(0.05)
    return True


class TestThrottle:
    def test_a_failed_run_gives_its_window_back_and_without_the_option_keeps_it(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        app, q = cenv.app_module, worker.queue
        closed = app.throttled_closed.apply_async(("closed", 0.0, "fail"), queue=q)
        failed = app.throttled_reopen.apply_async(("open", 0.0, "fail"), queue=q)
        for result in (closed, failed):
            with pytest.raises(ValueError, match="on purpose"):
                result.get(timeout=20)
        # Given back as the run failed: the next call is accepted and runs.
        nxt = wait_for(
            lambda: (
                (r := app.throttled_reopen.apply_async(("open",), queue=q)).id != failed.id and r
            ),
            3,
            "the window given back",
        )
        assert nxt.get(timeout=20) == "open"
        # Without reopen_on the 30 s window stays, failure or not.
        assert refused_for(app.throttled_closed, ("closed",), closed.id, q, 1.5)

    def test_a_revoked_call_gives_its_window_back(self, cenv: CeleryEnv, worker: Worker) -> None:
        app, q = cenv.app_module, worker.queue
        # Terminated while it runs (its child killed): the main process gives it back as
        # the child dies, not when billiard next maintains the pool (5 s later at worst).
        running = app.throttled_reopen.apply_async(("term", 10.0), queue=q)
        wait_for(lambda: any(s["id"] == running.id for s in started(cenv)), 20, "running")
        app.app.control.revoke(running.id, terminate=True)
        wait_for(
            lambda: app.throttled_reopen.apply_async(("term",), queue=q).id != running.id,
            3,
            "the window given back after terminate",
        )
        # Revoked before it ran, as the worker holds it for its ETA: given back as the
        # revoke arrives, not 30 s later when Celery drops the message.
        eta = app.throttled_reopen.apply_async(("eta",), queue=q, countdown=30)
        wait_for(lambda: f"[{eta.id}] received" in worker.output(), 20, "the ETA message held")
        app.app.control.revoke(eta.id)
        wait_for(
            lambda: app.throttled_reopen.apply_async(("eta",), queue=q).id != eta.id,
            3,
            "the window given back after revoke",
        )
        assert not [r for r in runs(cenv) if r["id"] in (running.id, eta.id)]


class TestRetries:
    def test_a_failed_runs_retry_no_longer_holds_the_key_and_never_overlaps(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        app, q = cenv.app_module, worker.queue
        # The default: a retry keeps the key until it has run (duplicates get its id).
        kept = app.work.apply_async(("kept", 0.0, "retry"), queue=q)
        wait_for(lambda: of(runs(cenv), "kept"), 20, "the first attempt")
        assert refused_for(app.work, ("kept",), kept.id, q, 0.5)
        # reopen_on="failure": the failed attempt frees it; a new call gets in before the
        # retry (due 1 s after the failure), and the retry contends when it comes.
        first = app.reopened.apply_async(("open", 0.0, "retry"), queue=q)
        wait_for(lambda: of(runs(cenv), "open"), 20, "the first attempt")
        newer = wait_for(
            lambda: (r := app.reopened.apply_async(("open", 0.3), queue=q)).id != first.id and r,
            1.0,
            "a new call let in while the retry waits",
        )
        assert newer.get(timeout=20) == "open"
        assert first.get(timeout=20) == "open"
        done = of(runs(cenv), "open")
        assert sorted(r["retries"] for r in done if r["id"] == first.id) == [0, 1]
        assert_no_overlap(done)
        assert kept.get(timeout=20) == "kept"


class TestOptions:
    def app(self) -> Celery:
        app = Celery("reopen-options", set_as_current=False)
        app.conf.update(task_always_eager=True, singleton_lock_url="memory://")
        return app

    @pytest.mark.parametrize(
        ("options", "says"),
        [
            ({"reopen_on": ("failure",), "lock": "while_executing"}, "drop reopen_on"),
            ({"reopen_on": ("failure",), "lock": "until_executing"}, "drop reopen_on"),
            ({"reopen_on": ("failure",), "on_duplicate": "replace"}, "drop reopen_on"),
            ({"reopen_on": ("failure",), "limit": 3}, "drop reopen_on"),
            ({"reopen_on": ("success",), "throttle": 5}, "choose from"),
            ({"reopen_on": 3, "throttle": 5}, "must name run ends"),
        ],
    )
    def test_where_it_changes_nothing_it_is_refused_saying_why(
        self, options: dict[str, Any], says: str
    ) -> None:
        with pytest.raises(ConfigurationError, match=says):

            @singleton_task(app=self.app(), name="reopen.bad", key=["k"], **options)
            def bad(k: str) -> str:
                return k

    def test_eagerly_a_failed_throttled_call_lets_the_next_one_in(self) -> None:
        app = self.app()

        @singleton_task(app=app, name="reopen.eager", key=["k"], throttle=60, reopen_on="failure")
        def sync(k: str, fail: bool = False) -> str:
            if fail:
                raise RuntimeError("no")
            return k

        failed = sync.apply_async(("a", True), task_id="failed")
        assert failed.failed()
        after = sync.apply_async(("a",), task_id="after")
        assert after.id == "after"
        assert sync.apply_async(("a",)).id == "after"  # a success keeps its window
