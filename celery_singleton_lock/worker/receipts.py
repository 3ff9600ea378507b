"""What a received message rides in the unacked record's pipeline: its take, its note's clear.

The worker hands ``riding_calls`` to its app's ride as it starts consuming (``broker.on_receipt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..broker.state import RidingCall
from ..broker.transit import ClearNote
from ..broker.transport import NOTED_PROPERTY
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
    """What rides the pipeline recording a received message (its ``received``
    headers and properties) as unacked: its take (``Reservations.ride``) where the ride
    allows (``broker.ride``), and the clearing of its note if it has one (always: a
    producer configured otherwise may have noted it)."""
    headers, properties = received
    task_name = headers.get("task")
    task = app.tasks.get(task_name) if isinstance(task_name, str) else None
    if task is None or not is_singleton(task):
        return []
    found: list[RidingCall] = []
    take = reservations.ride(app, hostname, headers, server)
    if take is not None:
        found.append(take)
    if properties.get(NOTED_PROPERTY):
        found.append(ClearNote(task.singleton_context.store.prefix, tag))
    return found
