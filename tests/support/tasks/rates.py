"""``rate=``: runs per window per item, token costs, plans, delays and caps on waiting
calls. Each run appends ``{"task", "id", "item", "n", "slot", ...}`` to ``rated``."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery_singleton_lock import RateLimit, requeue, singleton_task

from ..celery_app import app
from .records import checker


def _rated(task: Any, item: str, n: int, seconds: float) -> int:
    """Record a rate-limited run: its slot (the lock store's clock) and when it began."""
    started = time.time()
    time.sleep(seconds)
    checker().rpush(
        "rated",
        json.dumps(
            {
                "task": task.name,
                "id": task.request.id,
                "item": item,
                "n": n,
                "slot": task.request.singleton_rate_slot,
                "start": started,
                "end": time.time(),
                "fence": task.lease.fence,
                "pid": os.getpid(),
            }
        ),
    )
    return n


@singleton_task(
    app=app, bind=True, key=["item"], rate="20/s", acks_late=True, reject_on_worker_lost=True
)
def rated(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """20 runs a second per item, across every worker; a killed worker's messages return."""
    return _rated(self, item, n, seconds)


def tokens_of(item: str, n: int = 0, seconds: float = 0.0) -> int:
    """What a call costs against a token limit: 1, 2 or 3 units (in turn for calls n
    made over three items in turn)."""
    return n // 3 % 3 + 1


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    rate=["20/s", RateLimit("40/2s", burst=6, cost=tokens_of)],
    acks_late=True,
    reject_on_worker_lost=True,
)
def rated_tokens(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """20 calls a second and 40 tokens per 2 s per item (``tokens_of`` each call)."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="20/s", max_pending=5)
def capped(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """20 runs a second per item, and at most 5 calls of an item waiting (refused past)."""
    return _rated(self, item, n, seconds)


@singleton_task(
    app=app, bind=True, key=["item"], rate="1/m", on_limited="delay", max_pending=3, queue_ttl=10
)
def capped_delayed(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One run a minute per item, each call sent with the countdown to its slot; at most 3
    waiting, each waiting longer than its queue_ttl."""
    return _rated(self, item, n, seconds)


@singleton_task(
    app=app, bind=True, key=["item"], rate="1/4s", on_limited="delay", max_pending=3, queue_ttl=10
)
def capped_soon(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One run per 4 s per item, each call sent with the countdown to its slot: a wait
    shorter than half its queue_ttl."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="1/m", on_limited="raise", max_pending=3)
def capped_checked(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One a minute or RateLimitedError at dispatch, and at most 3 of an item waiting."""
    return _rated(self, item, n, seconds)


def tenant_plan(item: str, n: int = 0, seconds: float = 0.0) -> str:
    """A per-tenant plan: the paying tenants get four times the rate."""
    return "20/s" if item.startswith("gold") else "5/s"


@singleton_task(app=app, bind=True, key=["item"], rate=tenant_plan)
def planned(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="10/s", on_limited="delay")
def delayed(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """Sent with the countdown to its slot, reserved at dispatch."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="1/2s")
def rated_slowly(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One run every 2 s per item: a backlog waits seconds for its slots (deferred)."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="1/2s", on_limited="delay")
def delayed_slowly(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One run every 2 s per item, each sent with the countdown to its slot."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="10/s", burst=2, on_limited="raise")
def rate_checked(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """Refused with RateLimitedError at dispatch over 10/s (two back to back)."""
    return _rated(self, item, n, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    rate="10/s",
    limit=2,
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def rated_pair(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """10 runs a second per item, and at most two at once."""
    return _rated(self, item, n, seconds)
