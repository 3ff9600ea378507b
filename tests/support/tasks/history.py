"""The history tests (tests/integration/test_history.py): tasks that keep one
(history=True) while the app's setting is off, one per way a lock's story goes."""

from __future__ import annotations

import time
from typing import Any

from celery_singleton_lock import requeue, singleton_task, wait

from ..celery_app import app
from .records import hold


@singleton_task(app=app, bind=True, key=["item"], history=True)
def chronicled(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(hold(self, item, seconds))


@singleton_task(app=app, bind=True, key=["item"], history=True, dedupe=False, on_contention="fail")
def chronicled_strict(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(hold(self, item, seconds))


@singleton_task(app=app, bind=True, key=["item"], history=True, on_duplicate="replace")
def chronicled_latest(self: Any, item: str, version: str) -> str:
    return version


@singleton_task(app=app, bind=True, key=["item"], history=True, rate="1/2s")
def chronicled_rated(self: Any, item: str, n: int = 0) -> int:
    return n


@singleton_task(app=app, bind=True, key=["item"], history=True, dedupe=False,
                on_contention=wait(timeout=10))  # fmt: skip
def chronicled_patient(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(hold(self, item, seconds))


def _requeue_at_once(state: Any) -> Any:  # a policy of the user's own
    return requeue(max_tries=20, backoff=0.05, cap=0.1)(state)


@singleton_task(app=app, bind=True, key=["item"], history=True, dedupe=False,
                on_contention=_requeue_at_once)  # fmt: skip
def chronicled_custom(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(hold(self, item, seconds))


@singleton_task(app=app, bind=True, key=["item"], history=True, limit=2)
def chronicled_limited(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(hold(self, item, seconds))


@singleton_task(app=app, bind=True, key=["item"], history=True, on_duplicate="cancel")
def chronicled_cancel(self: Any, item: str, seconds: float = 0.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        self.lease.check()  # raises TaskCancelledError once a newer call cancels this run
        time.sleep(0.05)
    return item


@singleton_task(app=app, bind=True, key=["item"], history=True, lock="until_executing",
                on_duplicate="replace")  # fmt: skip
def chronicled_pending(self: Any, item: str, version: str) -> str:
    return version
