"""The three managers. All take the same lock per request, so they exclude each other.

- ``pending_sweep`` (PendingManager) picks up new requests and dispatches processing.
- ``process_request`` (ProcessManager) does the slow, side-effecting work for one request.
- ``callback_sweep`` / ``callback_request`` (CallbackManager) notify the requester when a
  request is done, and re-drive requests that look stuck.

Every manager checks the request's state before acting. On its own that check is a
race (two copies both see "not processed yet"); the lock per request is what makes
check-then-act safe, across tasks and workers. Sweeps and producers may dispatch the
same request as often as they like: duplicates are refused at dispatch, and a copy that
arrives some other way (``send_task``, a redelivery) waits its turn at execution.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from celery_singleton_lock import signals, singleton_task, wait
from celery_singleton_lock.lease import get_renewer

from . import settings, store
from .celeryapp import app

REQUEST_LOCK = "request:{request_idx}"  # one lock per request, shared by every manager


def worker_id() -> str:
    """The worker this pool child belongs to (its main process), for the demo's report."""
    return f"{socket.gethostname()}:{os.getppid()}"


def manager_task(**options: Any) -> Any:
    """A task taking the request's lock; a plain task in the demo's --without-lock run."""
    if settings.LOCKS_ENABLED:
        return singleton_task(app=app, bind=True, **options)
    options.pop("key", None)
    options.pop("on_contention", None)
    options.pop("dedupe", None)
    return app.task(bind=True, **options)


@manager_task(name="example.process_request", key=REQUEST_LOCK)
def process_request(self: Any, request_idx: int) -> str:
    """ProcessManager: the slow work, exactly once per request."""
    if store.state(request_idx) in ("processed", "called_back"):
        return "already processed"
    store.set_state(request_idx, "processing")
    store.record_start(request_idx, worker_id())
    time.sleep(settings.WORK_SECONDS)  # the side effect: charge a card, call a partner...
    store.record_processed(request_idx, self.request.id, worker_id())  # and "processed"
    return "processed"


@manager_task(name="example.callback_request", key=REQUEST_LOCK)
def callback_request(self: Any, request_idx: int) -> str:
    """CallbackManager: tell the requester, exactly once per request."""
    if store.state(request_idx) != "processed":
        return "not ready" if store.state(request_idx) != "called_back" else "already called back"
    time.sleep(settings.WORK_SECONDS / 5)  # the HTTP call to the requester
    store.record_callback(request_idx, self.request.id)  # and "called_back"
    return "called back"


@manager_task(name="example.pending_sweep", key="sweep:pending")
def pending_sweep(self: Any) -> int:
    """PendingManager: dispatch processing for every request still pending."""
    pending = store.in_state("pending")
    for request_idx in pending:
        process_request.delay(request_idx)
    return len(pending)


@manager_task(name="example.callback_sweep", key="sweep:callback")
def callback_sweep(self: Any, stuck_after: float = 1.0, lost_after: float = 5.0) -> int:
    """CallbackManager's sweep: call back finished requests, re-drive stuck ones."""
    for request_idx in store.in_state("processed"):
        callback_request.delay(request_idx)
    # "processing" for too long: its worker may have died. Re-dispatching is safe: if it
    # is in fact still queued or running, the dispatch is refused.
    stuck = store.in_state("processing", older_than=stuck_after)
    for request_idx in stuck:
        process_request.delay(request_idx)
    # Still pending long after submission: its message may sit in the prefetch of a
    # worker that died, keeping its queued hold until the broker gives it back. Re-drive
    # past the hold (dedupe=False); the lock per request still keeps the copies apart.
    lost = store.in_state("pending", older_than=lost_after)
    for request_idx in lost:
        if settings.LOCKS_ENABLED:
            process_request.apply_async((request_idx,), dedupe=False)
        else:
            process_request.delay(request_idx)
    return len(stuck) + len(lost)


@manager_task(
    name="example.claim_coupon",
    key="coupon-stock",
    dedupe=False,  # every claim is a distinct order; they queue up and take turns
    on_contention=wait(timeout=60),
)
def claim_coupon(self: Any, user_id: int, pause: float = 0.0) -> bool:
    """First come, first served, through a store that checks the lease's fence."""
    fence = self.lease.fence if settings.LOCKS_ENABLED else None
    if pause:
        # Simulate a stop-the-world pause (GC, SIGSTOP, a partition): renewal stops and
        # the lease expires while this holder still thinks it holds the lock.
        if settings.LOCKS_ENABLED:
            get_renewer().discard(self.lease)
        time.sleep(pause)
    return store.claim_coupon(user_id, fence)


def _count(name: str) -> Any:
    def receiver(sender: Any = None, **_: Any) -> None:
        # The signals are the library's, sent for every singleton task in the process:
        # count this project's own.
        if getattr(sender, "name", "").startswith("example."):
            store.bump(name)

    return receiver


# Metrics: the library's signals, counted where they happen (producers and workers).
signals.duplicate_refused.connect(_count("refused_at_dispatch"), weak=False)
signals.execution_contended.connect(_count("contended_at_execution"), weak=False)
