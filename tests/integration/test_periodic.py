"""Periodic tasks: what a tick does while the previous one still runs.

- ``celery beat`` imports the task and dispatches through ``apply_async``: a tick while
  the last one is queued or running is refused at dispatch. One run at a time, no
  pile-up.
- A scheduler that sends by name (``send_task``: another service's cron, a beat that
  does not import the task) bypasses dispatch. With the default ``requeue`` every tick
  waits its turn and runs: the work piles up. With ``on_contention="fail"`` the extra
  ticks end at once and nothing piles up (the README's recipe).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import CeleryEnv
from ..support.runs import assert_no_overlap, lock_keys, runs, wait_for
from ..support.workers import ROOT, Worker


def _beat(env: dict[str, str], ticks: int, timeout: float = 60.0) -> str:
    """Run ``celery beat`` until it has sent ``ticks`` ticks; return its log."""
    folder = Path(tempfile.mkdtemp(prefix="csl-beat-"))
    log = folder / "beat.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.support.celery_app", "beat",
             "-s", str(folder / "schedule"), "-l", "info"],
            cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        sent = lambda: log.read_text(errors="replace").count(TICK)  # noqa: E731
        wait_for(lambda: sent() >= ticks, timeout, f"beat to send {ticks} ticks")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    return log.read_text(errors="replace")


TICK = "Sending due task tick"


def _queued(cenv: CeleryEnv, queue: str) -> int:
    return int(cenv.broker.client().llen(queue))


@pytest.fixture(name="tick_worker", scope="module")
def fixture_tick_worker(celery_env: CeleryEnv) -> Iterator[Worker]:
    """A worker of its own (two children) for the ticks, shared by the tests that leave
    its queue empty."""
    worker = Worker(celery_env.env, concurrency=2).start()
    try:
        yield worker
    finally:
        worker.stop()


class TestPeriodic:
    def test_beat_dedupes_its_ticks_at_dispatch(self, cenv: CeleryEnv, tick_worker: Worker) -> None:
        worker, mark = tick_worker, len(tick_worker.output())
        beat = {
            **cenv.env,
            "CSL_QUEUE": worker.queue,
            "CSL_BEAT_TASK": "tests.support.celery_app.work",
            "CSL_BEAT_EVERY": "0.3",
            "CSL_BEAT_SECONDS": "1.5",
        }
        ticks = _beat(beat, 12).count(TICK)
        wait_for(lambda: not lock_keys(cenv), 10, "the last run to end")
        records = runs(cenv)
        print(f"\nbeat: {ticks} ticks 0.3 s apart, {len(records)} runs of a 1.5 s task")
        # One run at a time, each tick during a run (or while one is queued) refused:
        # about one run in five ticks; one in three even if a loaded machine spaced
        # the ticks twice as far apart.
        assert 1 <= len(records) <= ticks // 3
        assert_no_overlap(records)
        assert _queued(cenv, worker.queue) == 0
        assert "requeued" not in worker.output()[mark:]

    def test_ticks_sent_by_name_pile_up_under_requeue(self, cenv: CeleryEnv) -> None:
        worker = Worker(cenv.env, concurrency=2).start()
        try:
            app, work = cenv.app_module.app, cenv.app_module.work
            for _ in range(5):
                app.send_task(work.name, ("tick", 1.0), queue=worker.queue)
                time.sleep(0.3)
            # Every tick is kept and will run, one after another.
            wait_for(lambda: worker.output().count("requeued") >= 3, 10, "the ticks requeued")
            assert "did not run" not in worker.output()
        finally:
            worker.stop()  # its queue, with the piled-up ticks, is never consumed again

    def test_ticks_sent_by_name_are_skipped_under_fail(
        self, cenv: CeleryEnv, tick_worker: Worker
    ) -> None:
        worker, mark = tick_worker, len(tick_worker.output())
        app, strict = cenv.app_module.app, cenv.app_module.strict
        sent = []
        for _ in range(5):
            sent.append(app.send_task(strict.name, ("tick", 1.0), queue=worker.queue))
            time.sleep(0.3)
        wait_for(lambda: all(r.ready() for r in sent), 20, "every tick ended")
        records = runs(cenv)
        print(f"\nsend_task ticks under fail: {len(records)} of {len(sent)} ran")
        # Ticks at 0, 0.3, ..., 1.2 s of a 1 s task: the first runs, those during it
        # are skipped, at most one more runs; nothing is left queued or requeued.
        assert 1 <= len(records) <= 2
        assert_no_overlap(records)
        assert _queued(cenv, worker.queue) == 0
        assert "requeued" not in worker.output()[mark:]
        assert not lock_keys(cenv)
