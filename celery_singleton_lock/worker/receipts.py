"""A received message's take, riding the pipeline that records it as unacked.

The worker hands ``riding_calls`` to its app's ride as it starts consuming (``broker.on_receipt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..broker.state import RidingCall
from ..config.options import is_singleton
from .reservations import reservations

if TYPE_CHECKING:
    from celery import Celery

    from ..lease import Server


def riding_calls(
    app: Celery,
    hostname: str,
    received: tuple[Mapping[str, object], Mapping[str, object]],
    server: Server,
    tag: str,
) -> list[RidingCall]:
    """What of the worker's rides the pipeline recording a received message (its
    ``received`` headers and properties) as unacked: its take (``Reservations.ride``)
    where the ride allows (``broker.ride``). The clearing of its note, if it has one, the
    ride adds itself (``broker.unacked``)."""
    headers, _ = received
    task_name = headers.get("task")
    task = app.tasks.get(task_name) if isinstance(task_name, str) else None
    if task is None or not is_singleton(task):
        return []
    take = reservations.ride(app, hostname, headers, server)
    return [] if take is None else [take]
