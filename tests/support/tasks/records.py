"""What the test tasks record on the checker, and the bodies most of them share.

Each execution appends ``{"task", "id", "item", "fence", "pid", "start", "end", ...}``
to the list ``runs`` on the checker (``record``), and ``{"id", "item", "pid"}`` to
``started`` as it begins (``begin``), so tests can assert who ran, when, and whether two
executions of one key ever overlapped. The library's ``copy_dropped`` signal, sent in
the worker process that drops a copy, appends ``{"signal", "task", "task_id", "name",
"hostname", "holder_state"}`` to ``signals`` (``runs.dropped`` reads it)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded

from celery_singleton_lock.signals import copy_dropped

from ..celery_app import check_url

_checker: redis.Redis | None = None


def checker() -> redis.Redis:
    global _checker  # noqa: PLW0603  (one client per process, created after fork)
    if _checker is None:
        _checker = redis.Redis.from_url(check_url())
    return _checker


def checker_time() -> float:
    """The checker server's clock: real time for a process whose own clock is faked."""
    seconds, micros = checker().time()
    return float(seconds) + micros / 1e6


def record(task: Any, item: object, started: float, **extra: Any) -> None:
    lease = task.lease
    checker().rpush(
        "runs",
        json.dumps(
            {
                "task": task.name,
                "id": task.request.id,
                "item": item,
                "key": lease.name,
                "fence": lease.fence,
                "pid": os.getpid(),
                "retries": task.request.retries,
                "start": started,
                "end": time.time(),
                # RabbitMQ's dead-letterings of this message (its delay exchanges add their
                # own): one sent again must not carry its request's.
                **deaths(task.request.headers),
                **extra,
            }
        ),
    )


def deaths(headers: Any) -> dict[str, list[str]]:
    deaths = (headers or {}).get("x-death")
    if not deaths:
        return {}
    return {"x_death": [f"{d.get('reason')}:{d.get('queue')}" for d in deaths]}


def begin(task: Any, item: object) -> float:
    started = time.time()
    checker().rpush(
        "started", json.dumps({"id": task.request.id, "item": item, "pid": os.getpid()})
    )
    return started


GATE_CLIENT = "test-gate"


def pause(item: object, seconds: float) -> None:
    """Sleep ``seconds``; a negative value (``runs.UNTIL_OPENED``) waits instead until the
    test opens the item's gate, at most -seconds."""
    if seconds < 0:
        # A connection of its own, named, so a count of the clients parked on a push
        # wake-up (``runs.waiting_for_a_wake_up``) leaves it out.
        with redis.Redis.from_url(check_url(), client_name=GATE_CLIENT) as gate:
            gate.blpop([f"gate:{item}"], timeout=-seconds)
    else:
        time.sleep(seconds)


def hold(task: Any, item: Any, seconds: float) -> Any:
    """The plain execution: hold the key for ``seconds``, record it, return the item."""
    started = begin(task, item)
    pause(item, seconds)
    record(task, item, started)
    return item


def run_and_end(task: Any, item: object, seconds: float, mode: str) -> object:
    started = begin(task, item)
    if mode == "soft":
        try:
            time.sleep(seconds)
        except SoftTimeLimitExceeded:
            record(task, item, started, soft_handled=True)
            return "soft-handled"
    pause(item, seconds)
    if mode in ("retry", "retry_later") and task.request.retries == 0:
        record(task, item, started, retrying=True)
        raise task.retry(countdown=1.0 if mode == "retry" else 5.0, max_retries=1)
    if mode == "fail":
        record(task, item, started, failed=True)
        raise ValueError(f"failing on purpose for {item}")
    if mode == "ignore":
        record(task, item, started)
        raise Ignore()
    if mode == "reject":
        record(task, item, started)
        raise Reject("rejecting on purpose", requeue=False)
    record(task, item, started)
    return item


def _copy_dropped(
    sender: Any = None, name: str = "", task_id: str = "", holder_state: str = "", **_: Any
) -> None:
    """Record a ``copy_dropped`` signal where the test can read it: the worker's process
    sends it, and the test's is another."""
    checker().rpush(
        "signals",
        json.dumps(
            {
                "signal": "copy_dropped",
                "task": getattr(sender, "name", None),
                "task_id": task_id,
                "name": name,
                "hostname": getattr(getattr(sender, "request", None), "hostname", None),
                "holder_state": holder_state,
            }
        ),
    )


copy_dropped.connect(_copy_dropped)
