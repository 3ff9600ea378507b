"""``idempotency=``: a repeat of a key answered with its first call."""

from __future__ import annotations

import os
import signal
from typing import Any

from celery_singleton_lock import SingletonTask, singleton_task, wait

from ..celery_app import app
from .records import checker, run_and_end


class KillAfterSuccess(SingletonTask):
    """The whole prefork worker dies (SIGKILL) once per task id after Celery stored its
    success, before the ack: an acks_late message comes back after the visibility timeout."""

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        if checker().set(f"killed:{task_id}", 1, nx=True):
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


@singleton_task(
    app=app, bind=True, key=["item"], idempotency={"key_from": "header:Idempotency-Key"}
)
def charge(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """A payment: its Idempotency-Key header makes a repeat answer with the first call."""
    return run_and_end(self, item, seconds, mode)


@singleton_task(app=app, bind=True, key=["item"], idempotency={"keep_failures": True})
def charge_kept(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """The same, keeping a failure for the window: a repeat gets the failure."""
    return run_and_end(self, item, seconds, mode)


@singleton_task(
    app=app, bind=True, key=["item"], idempotency={"key_from": "request_id", "window": 1}
)
def charge_brief(self: Any, item: object, request_id: str) -> object:
    """Its key is an argument, kept for one second."""
    return run_and_end(self, item, 0.0, "ok")


@singleton_task(
    app=app,
    base=KillAfterSuccess,
    bind=True,
    key=["item"],
    acks_late=True,
    reject_on_worker_lost=True,
    idempotency=True,
)
def charge_durable(self: Any, item: object) -> object:
    """acks_late: its child dies after the success is stored, so the message comes again."""
    return run_and_end(self, item, 0.0, "ok")


@singleton_task(app=app, bind=True, key=["item"], history=True, idempotency=True)
def charge_chronicled(self: Any, item: object) -> object:
    """Idempotency keys on a lock that keeps its history."""
    return run_and_end(self, item, 0.0, "ok")


@singleton_task(app=app, bind=True, key=["item"], idempotency=True, on_contention=wait(timeout=20))
def charge_waiting(self: Any, item: object, seconds: float = 0.0) -> object:
    """A copy waits for the push wake-up: it starts the moment the holder lets go."""
    return run_and_end(self, item, seconds, "ok")


@singleton_task(app=app, bind=True, key=["item"], lock="while_executing", idempotency=True)
def charge_unheld(self: Any, item: object) -> object:
    """No hold at dispatch (runs still never overlap): the key alone answers repeats."""
    return run_and_end(self, item, 0.0, "ok")
