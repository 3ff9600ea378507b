"""The lock modes and windows: while_executing, until_executing (one running + one
pending), replace, debounce, throttle, and windows reopened by a failure."""

from __future__ import annotations

from typing import Any

from celery_singleton_lock import requeue, singleton_task, wait

from ..celery_app import THROTTLE, app, task_name
from .records import begin, hold, pause, record, run_and_end


@singleton_task(app=app, bind=True, key=["item"], lock="while_executing")
def work_while_executing(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """No dispatch check: held only while it runs (its retry keeps the key meanwhile)."""
    return run_and_end(self, item, seconds, mode)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    lock="until_executing",
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def refresh(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """One running + one pending: a call made while one runs queues the next run."""
    return run_and_end(self, item, seconds, mode)


@singleton_task(
    app=app, bind=True, key=["item"], lock="until_executing", on_contention=wait(timeout=20)
)
def refresh_waiting(self: Any, item: object, seconds: float = 0.0) -> object:
    """until_executing whose pending execution waits for the running one (push wake-up)."""
    return hold(self, item, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    throttle=THROTTLE,
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def throttled(self: Any, item: object, seconds: float = 0.0) -> object:
    """At most one accepted call per item per window; executions still exclude."""
    return hold(self, item, seconds)


def _versioned(task: Any, item: object, version: str, seconds: float) -> str:
    started = begin(task, item)
    pause(item, seconds)
    record(task, item, started, version=version)
    return version


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    lock="until_executing",
    on_duplicate="replace",
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def latest(self: Any, item: object, version: str, seconds: float = 0.0) -> str:
    """One running + one pending, and the pending call takes the latest arguments."""
    return _versioned(self, item, version, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_duplicate="replace")
def latest_queued(self: Any, item: object, version: str, seconds: float = 0.0) -> str:
    """The default scope with replace: a queued call takes the latest arguments."""
    return _versioned(self, item, version, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    debounce=0.5,
    max_wait=1.5,
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def debounced(self: Any, item: object, version: str, seconds: float = 0.0) -> str:
    """Trailing debounce: one run 0.5 s after a burst's last call, within 1.5 s of its first."""
    return _versioned(self, item, version, seconds)


def _throttled_30s(name: str, doc: str, **reopen: Any) -> Any:
    @singleton_task(
        app=app,
        bind=True,
        name=task_name(name),
        key=["item"],
        throttle=30,
        on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
        **reopen,
    )
    def throttled(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
        return run_and_end(self, item, seconds, mode)

    throttled.__doc__ = doc
    return throttled


throttled_reopen = _throttled_30s(
    "throttled_reopen",
    "A 30 s window per item that a failed or revoked run gives back at once.",
    reopen_on=("failure", "revoked"),
)
throttled_closed = _throttled_30s(
    "throttled_closed", "The same window without reopen_on: a failed run keeps it to its end."
)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    reopen_on="failure",
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def reopened(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """until_executed whose failed run frees the key even while its retry waits."""
    return run_and_end(self, item, seconds, mode)
