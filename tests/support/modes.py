"""Helpers of the mode tests: task definitions, storms of producers, the broker's queue read."""

from __future__ import annotations

import base64
import json
import multiprocessing
import time
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import TimeoutError

from celery_singleton_lock import singleton_task

from ..conftest import CeleryEnv
from .runs import lock_keys
from .workers import Worker

QUEUE = "modes-dispatch"


def name_of(task: Any, *args: Any) -> str:
    return str(task.singleton_options().key.derive(args))


def define(**options: Any) -> Any:
    app = Celery("modes-options", set_as_current=False)

    def body(item: str) -> str:
        return item

    return singleton_task(app=app, name=f"modes.t{time.monotonic_ns()}", **options)(body)


def reads(client: redis.Redis) -> int:
    return int(client.info("stats")["total_reads_processed"])


def dispatch_round_trips(
    lock: redis.Redis, calls: dict[str, tuple[Any, tuple[Any, ...]]]
) -> dict[str, int]:
    """Lock-store round trips of one dispatch of each task (name -> (task, args)), after
    one call that puts its scripts and connections in place; printed, to read next to
    plain Celery's."""
    counted = {}
    for name, (task, args) in calls.items():
        task.apply_async(("warm", *args[1:]), queue=QUEUE)  # another key than the one counted
        before = reads(lock)
        task.apply_async(args, queue=QUEUE)
        counted[name] = reads(lock) - before - 1  # minus the INFO read itself
    print(f"\nlock-store round trips per dispatch: {counted}")
    return counted


def _storm(  # noqa: PLR0917  (a process target's arguments)
    task_name: str, item: str, calls: int, barrier: Any, out: Any, extra: tuple[Any, ...] = ()
) -> None:
    from tests.support import celery_app

    task = celery_app.app.tasks[task_name]
    barrier.wait(10)
    queue = celery_app.app.conf.task_default_queue
    out.put([task.apply_async((item, *extra), queue=queue).id for _ in range(calls)])


def storm(  # noqa: PLR0917  (a storm's shape)
    task: Any,
    item: str,
    queue: str,
    processes: int = 8,
    calls: int = 20,
    extra: tuple[Any, ...] = (),
) -> set[str]:
    """``processes`` forked producers, ``calls`` dispatches each, released at a barrier."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    task.app.conf.task_default_queue = queue
    procs = [
        ctx.Process(target=_storm, args=(task.name, item, calls, barrier, out, extra))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        ids = [i for _ in procs for i in out.get(timeout=30)]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert len(ids) == processes * calls
    return set(ids)


def results_of(results: list[Any], worker: Worker, timeout: float) -> list[Any]:
    """Every result's value; a caller left waiting fails with what the worker said of it."""
    deadline = time.monotonic() + timeout
    values = []
    for result in results:
        try:
            values.append(result.get(timeout=max(0.1, deadline - time.monotonic())))
        except TimeoutError:
            said = [line for line in worker.output().splitlines() if result.id in line]
            pytest.fail(
                f"no result for {result.id} in {timeout}s; the worker said:\n" + "\n".join(said)
            )
    return values


def held(cenv: CeleryEnv) -> list[bytes]:
    """Locks and holds still taken (a wait's signal keys and the record of replaced
    messages are bookkeeping that expires by itself)."""
    bookkeeping = (b":signal", b":waiters", b":replaced")
    return [k for k in lock_keys(cenv) if not k.endswith(bookkeeping)]


def of(records: list[dict[str, Any]], item: str) -> list[dict[str, Any]]:
    return sorted((r for r in records if r["item"] == item), key=lambda r: r["start"])


def concurrency(records: list[dict[str, Any]]) -> int:
    """The most executions that ran at once."""
    edges = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def messages(queue: redis.Redis, name: str) -> list[dict[str, Any]]:
    """The messages waiting in a Redis-broker queue: (task id, args, headers)."""
    found = []
    for raw_message in queue.lrange(name, 0, -1):
        message = json.loads(raw_message)
        body = json.loads(base64.b64decode(message["body"]))
        found.append({"id": message["headers"]["id"], "args": body[0], **message["headers"]})
    return found
