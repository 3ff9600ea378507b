"""``limit=``: counting leases per item, and ``total_limit=`` across every item."""

from __future__ import annotations

import time
from typing import Any

from celery_singleton_lock import requeue, singleton_task, wait

from ..celery_app import app
from .records import begin, checker, hold, record, run_and_end


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    limit=3,
    on_contention=requeue(max_tries=1000, backoff=0.02, cap=0.1),
)
def export(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """At most three executions per item at once (a counting lease)."""
    return run_and_end(self, item, seconds, mode)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    limit=2,
    total_limit=3,
    total_order="first_come",
    on_contention=wait(timeout=60),
)
def export_total(self: Any, item: object, seconds: float = 0.0, until: str = "") -> object:
    """Two at once per item, three at once for every item together; the rest wait,
    first come, first served.

    ``until``: run on until the checker has that key (so a test frees slots one by one).
    """
    return _until(self, item, seconds, until)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    limit=1,
    total_limit=3,
    total_order="first_come",
    on_contention=wait(timeout=60),
)
def export_one_total(
    self: Any, item: object, seconds: float = 0.0, until: str = "", mode: str = "ok"
) -> object:
    """One at once per item (a tenant), three at once for every item together; the rest
    wait. ``until`` as ``export_total``'s; ``mode``: ``"fail"`` raises, ``"retry"``
    retries its first attempt after 0.5 s."""
    return _until(self, item, seconds, until, mode)


def _until(task: Any, item: object, seconds: float, until: str, mode: str = "ok") -> object:
    """Run until the checker has ``until`` (when given), then ``seconds``; end as ``mode``
    says."""
    started = begin(task, item)
    deadline = time.monotonic() + 60.0
    while until and not checker().exists(until) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(seconds)
    if mode == "retry" and task.request.retries == 0:
        record(task, item, started, retrying=True)
        raise task.retry(countdown=0.5, max_retries=1)
    if mode == "fail":
        record(task, item, started, failed=True)
        raise ValueError(f"failing on purpose for {item}")
    record(task, item, started)
    return item


@singleton_task(app=app, bind=True, key=["item"], limit=3, on_contention=wait(timeout=30))
def export_waiting(self: Any, item: object, seconds: float = 0.0) -> object:
    """limit=3 whose fourth execution waits for a slot (push wake-up, first come first served)."""
    return hold(self, item, seconds)


def _tenant_weight(tenant: str, seconds: float = 0.0) -> float:
    """A tenant named ``heavy-...`` has three turns of the total to another's one."""
    return 3.0 if str(tenant).startswith("heavy-") else 1.0


@singleton_task(app=app, bind=True, key="fair:{tenant}", limit=2, total_limit=2, acks_late=True)
def export_fair(self: Any, tenant: str, seconds: float = 0.0, mode: str = "ok") -> object:
    """Two at once per tenant and two in all, the total's slots handed out round robin
    across the tenants waiting (the default with ``total_limit``); acks_late, so a run
    killed with its worker comes again. ``mode``: ``run_and_end``'s."""
    return run_and_end(self, tenant, seconds, mode)


@singleton_task(
    app=app, bind=True, key="capped:{tenant}", limit=2, total_limit=2, max_pending=1, queue_ttl=2
)
def export_fair_capped(self: Any, tenant: str, seconds: float = 0.0) -> object:
    """``export_fair`` with one call of a tenant waiting at most, each place lasting 2 s
    unless renewed (a call kept in the waiting room longer keeps it)."""
    return run_and_end(self, tenant, seconds, "ok")


@singleton_task(
    app=app, bind=True, key="heavy:{tenant}", limit=3, total_limit=2, weight=_tenant_weight
)
def export_weighted(self: Any, tenant: str, seconds: float = 0.0) -> object:
    """Two at once in all, round robin by weight (``_tenant_weight``; an operator's wins);
    a tenant's limit above the total, so a tenant's share is its weight's alone."""
    return run_and_end(self, tenant, seconds, "ok")


@singleton_task(app=app, bind=True, key="paced:{tenant}", rate="5/s", limit=2, total_limit=2)
def export_fair_rated(self: Any, tenant: str, seconds: float = 0.0) -> object:
    """``export_fair`` behind a rate of five starts a second per tenant: a call kept
    waiting for its turn has been counted a start, given back as it is kept."""
    return run_and_end(self, tenant, seconds, "ok")
