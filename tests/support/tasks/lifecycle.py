"""The plain singleton task, and Celery's own options around it: time limits,
acks_late, autoretry, errbacks, ignored results, and a plain task to compare with."""

from __future__ import annotations

from typing import Any

from celery_singleton_lock import singleton_task

from ..celery_app import app
from .records import begin, checker, hold, record, run_and_end


@singleton_task(app=app, bind=True, key=["item"])
def work(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """Record an execution of ``item``; ``mode`` picks how the execution ends."""
    return run_and_end(self, item, seconds, mode)


@singleton_task(app=app, bind=True, key=["item"], soft_time_limit=0.5, time_limit=1.0)
def limited(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """Time limits are task options: the soft one raises in the body, the hard one kills."""
    return run_and_end(self, item, seconds, mode)


@singleton_task(app=app, bind=True, key=["item"], acks_late=True, time_limit=2.0)
def durable_limited(self: Any, item: object, seconds: float = 0.0) -> object:
    """acks_late with a time limit: the message stays unacked while it runs."""
    return hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], acks_late=True, reject_on_worker_lost=True)
def durable(self: Any, item: object, seconds: float = 0.0) -> object:
    """acks_late + reject_on_worker_lost: a killed child's message is redelivered."""
    return hold(self, item, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    autoretry_for=(KeyError,),
    retry_backoff=False,
    default_retry_delay=1,
    max_retries=1,
)
def flaky(self: Any, item: object) -> object:
    """Raises KeyError on its first attempt; autoretry_for re-sends it."""
    started = begin(self, item)
    record(self, item, started)
    if self.request.retries == 0:
        raise KeyError(item)
    return item


@app.task
def note_error(request: Any, exc: Any, traceback: Any) -> None:
    """An errback (link_error): records which task id it fired for."""
    checker().rpush("errbacks", str(request.id))


@singleton_task(app=app, key=["item"], ignore_result=True)
def noop(item: object) -> None:
    """The cheapest singleton task: counts itself (the worker-memory benchmark)."""
    checker().incr("noop")


@app.task
def plain(item: object) -> object:
    """A plain Celery task: what a pool does without this library, for comparison."""
    return item
