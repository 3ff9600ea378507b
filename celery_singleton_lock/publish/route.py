"""Which way one call is sent: past the lock (a resend of ours, a canvas), in line (a mode
that sends every call: a rate's slot, a place among the waiting), or held first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..tokens import NAME_HEADER, REDRIVE_HEADER
from .dispatch import long_wait, send_in_line
from .held import send_held

if TYPE_CHECKING:
    from celery import Task
    from celery.result import AsyncResult

    from ..context import TaskContext
    from ..modes.base import Publish


def dispatch(
    task: Task,
    context: TaskContext,
    call: tuple[Sequence[object], Mapping[str, object]],
    task_id: str | None,
    *,
    options: dict[str, object],
    publish: Publish,
    producer: object,
    bypass: object,
    redrive: bool,
    canvas: bool,
) -> AsyncResult:
    """The lock's dispatch of one call: held and published, or answered as a duplicate."""
    args, kwargs = call
    opts = context.options
    lock_name = opts.key.derive(args, kwargs)  # KeyDerivationError: nothing sent
    if opts.mode.checks_dispatch and not bypass and not canvas:
        return send_held(
            task,
            context,
            lock_name,
            call,
            task_id=task_id,
            options=options,
            publish=publish,
            producer=producer,
        )
    if redrive or not bypass:  # (held calls: after their mode's own countdown, in send_held)
        long_wait(context, options)
    own_headers: dict[str, object] = {NAME_HEADER: lock_name}
    if isinstance(bypass, dict):
        own_headers.update(bypass)
    if redrive:
        own_headers[REDRIVE_HEADER] = 1
    elif not (bypass or canvas):  # a place in line, and a rate's slot
        return send_in_line(
            context,
            lock_name,
            call,
            task_id=task_id,
            options=options,
            publish=publish,
            own_headers=own_headers,
        )
    return publish(task_id, options, own_headers)
