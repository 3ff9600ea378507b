"""A hop towards a call's own ETA hands its hold back (``run/eta.py``), against a real
Redis: from the running lease the worker took at receipt, or from its reservation,
to the queued hold the next worker takes over; the message is sent on with it."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import Ignore

from celery_singleton_lock.context import Delivery
from celery_singleton_lock.lease import Lease
from celery_singleton_lock.run import eta
from celery_singleton_lock.tokens import (
    ETA_HEADER,
    NAME_HEADER,
    TOKEN_HEADER,
    HandedLease,
    queued_token,
    reserved_token,
    running_token,
)

from ..conftest import CeleryEnv


def hop(cenv: CeleryEnv, monkeypatch: pytest.MonkeyPatch, handed: str | None) -> dict[str, Any]:
    """One early arrival of a ``work`` call with 500 s left (the broker's timeout: 100 s),
    its key held as the worker left it (its reservation, or ``handed``: a running lease)."""
    conf = cenv.app_module.app.conf
    options = {**(conf.broker_transport_options or {}), "visibility_timeout": 100}
    monkeypatch.setitem(conf, "broker_transport_options", options)
    task = cenv.app_module.work
    context = task.singleton_context
    store = context.store
    task_id, host = f"id-{time.monotonic_ns()}", "w1@host"
    name = task.singleton_options().key.derive((task_id,), {})
    queued = queued_token(task_id)
    token = running_token(task_id, host, 1234) if handed else reserved_token(task_id, host, queued)
    taken = store.try_acquire(name, 1.0, token=token)  # as the worker left it: 1 s to go
    assert isinstance(taken, Lease)
    headers = {NAME_HEADER: name, TOKEN_HEADER: queued, ETA_HEADER: f"{time.time() + 500:.6f}"}
    request = SimpleNamespace(
        id=task_id, hostname="another-spelling", is_eager=False, headers=headers, args=(), kwargs={}
    )
    sent: dict[str, Any] = {}

    def resend(countdown: float, headers: dict[str, object], options: dict[str, object]) -> None:
        sent.update(countdown=countdown, headers=headers, options=options)

    delivery = Delivery(context, request, task, True, lambda *_: None, resend)
    given = (
        HandedLease(
            name, taken.key, token, fence=taken.fence, ttl=1.0, expires_at=time.monotonic() + 1
        )
        if handed
        else None
    )
    with pytest.raises(Ignore):
        eta.send_on(delivery, name, given)
    client = cenv.lock_client()
    return {
        **sent,
        "holder": client.get(taken.key),
        "pttl": client.pttl(taken.key),
        "queued": queued,
    }


@pytest.mark.parametrize("handed", [None, "running"])
def test_the_hold_goes_back_to_the_queued_token_for_the_hop_and_the_queue(
    cenv: CeleryEnv, monkeypatch: pytest.MonkeyPatch, handed: str | None
) -> None:
    done = hop(cenv, monkeypatch, handed)
    assert done["countdown"] == pytest.approx(50.0)  # half the timeout
    assert done["headers"][TOKEN_HEADER] == done["queued"]
    assert float(done["headers"][ETA_HEADER]) > time.time() + 400
    assert done["holder"].decode() == done["queued"], "the next worker takes it over"
    queue_ttl = cenv.app_module.work.singleton_context.queue_ttl
    assert (queue_ttl + 40) * 1000 < done["pttl"] <= (queue_ttl + 50) * 1000
