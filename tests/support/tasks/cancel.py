"""``on_duplicate="cancel"``: a newer call cancels the run in progress."""

from __future__ import annotations

import json
import time
from typing import Any

from celery_singleton_lock import SingletonTask, TaskCancelledError, singleton_task, wait

from ..celery_app import app
from .records import begin, checker, record


class CancelHooked(SingletonTask):
    """Records when ``on_cancel`` is called (on a thread of its own)."""

    def on_cancel(self, task_id: str, lease: Any) -> None:
        checker().rpush("cancel_hooks", json.dumps({"id": task_id, "at": time.time()}))


def _preview(task: Any, item: str, version: str, seconds: float, obey: bool) -> str:
    """Work for ``seconds``, checking the lease every 20 ms unless told not to obey."""
    started = begin(task, item)
    deadline = time.time() + seconds
    try:
        while time.time() < deadline:
            if obey:
                task.lease.check()
            time.sleep(0.02)
    except TaskCancelledError:
        record(task, item, started, version=version, cancelled=True)
        raise
    record(task, item, started, version=version, cancelled=task.lease.cancelled)
    return version


@singleton_task(
    app=app,
    base=CancelHooked,
    bind=True,
    key=["item"],
    on_duplicate="cancel",
    on_contention=wait(timeout=60),
)
def preview(self: Any, item: str, version: str, seconds: float = 0.0, obey: bool = True) -> str:
    """Re-render a preview: a newer call cancels the render in progress."""
    return _preview(self, item, version, seconds, obey)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    on_duplicate="cancel",
    terminate_on_cancel=True,
    on_contention=wait(timeout=60),
)
def preview_hard(self: Any, item: str, version: str, seconds: float = 0.0) -> str:
    """The same, ignoring the cancel: its prefork child is terminated instead."""
    return _preview(self, item, version, seconds, obey=False)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    on_duplicate="cancel",
    on_contention=wait(timeout=60),
    autoretry_for=(Exception,),
    max_retries=3,
    default_retry_delay=0,
)
def preview_retrying(self: Any, item: str, version: str, seconds: float = 0.0) -> str:
    """Retries whatever it raises: a cancel still ends it, in REVOKED."""
    return _preview(self, item, version, seconds, obey=True)
