"""What a contended execution does: fail, wait for the push wake-up, requeue, skip;
and two task forms sharing one lock."""

from __future__ import annotations

from typing import Any

from celery_singleton_lock import SingletonTask, fail, requeue, singleton_task, skip, wait

from ..celery_app import app
from .records import hold


@singleton_task(app=app, bind=True, key=["item"], on_contention="fail", dedupe=False)
def strict(self: Any, item: object, seconds: float = 0.0) -> object:
    """Never queued twice is off (dedupe=False); a contended execution fails at once."""
    return hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_contention=wait(timeout=20), dedupe=False)
def patient(self: Any, item: object, seconds: float = 0.0) -> object:
    """A contended execution waits for the push wake-up."""
    return hold(self, item, seconds)


@app.task(bind=True, base=SingletonTask, singleton={"key": "request:{request_idx}"})
def process_request(self: Any, request_idx: int, seconds: float = 0.0) -> int:
    """The base-class form, sharing one lock per request with ``callback_request``."""
    return hold(self, request_idx, seconds)


@singleton_task(app=app, bind=True, key="request:{request_idx}")
def callback_request(self: Any, request_idx: int, seconds: float = 0.0) -> int:
    return hold(self, request_idx, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    on_contention=requeue(max_tries=2, backoff=0.1, cap=0.2),
    dedupe=False,
)
def impatient(self: Any, item: object, seconds: float = 0.0) -> object:
    """Requeued at most twice while contended, then fails."""
    return hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_contention="fail")
def exclusive_fail(self: Any, item: object, seconds: float = 0.0) -> object:
    """Deduped at dispatch; a copy that reaches execution anyway fails at once."""
    return hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_contention=wait(timeout=0.3, then=fail()))
def exclusive_wait_fail(self: Any, item: object, seconds: float = 0.0) -> object:
    """A contended execution waits briefly, then fails."""
    return hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_contention="skip")
def exclusive_skip(self: Any, item: object, seconds: float = 0.0) -> object:
    """A contended execution is dropped quietly (IGNORED)."""
    return hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_contention=wait(timeout=0.3, then=skip()))
def exclusive_wait_skip(self: Any, item: object, seconds: float = 0.0) -> object:
    """A contended execution waits briefly, then is dropped quietly."""
    return hold(self, item, seconds)
