"""Which way one call is sent: past the lock (a resend of ours, a canvas member that cannot
attach), in line (a mode that sends every call: a rate's slot, a place among the waiting),
held first, or attached to the call holding its key (a canvas member)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tokens import NAME_HEADER, REDRIVE_HEADER
from .attaching import attachments_for, send_attaching
from .dispatch import long_wait, send_in_line
from .held import send_held

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from .call import Dispatch


def dispatch(call: Dispatch) -> AsyncResult:
    """The lock's dispatch of one call: held and published, or answered as a duplicate."""
    facts, bypass, redrive = call.facts, call.bypass, call.redrive
    call.lock_name = facts.options.key.derive(*call.call)  # KeyDerivationError: nothing sent
    if facts.mode.checks_dispatch and not bypass and not call.canvas:
        return send_held(call)
    attachments = None if bypass else attachments_for(call)
    if attachments is not None:  # a canvas member: held, attached to its holder, or sent
        return send_attaching(call, attachments)
    if redrive or not bypass:  # (held calls: after their mode's own countdown, in send_held)
        long_wait(facts, call.options)
    own_headers: dict[str, object] = {NAME_HEADER: call.lock_name}
    if isinstance(bypass, dict):
        own_headers.update(bypass)
    if redrive:
        own_headers[REDRIVE_HEADER] = 1
    elif not (bypass or call.canvas):  # a place in line, and a rate's slot
        return send_in_line(call, own_headers)
    return call.publish(call.task_id, call.options, own_headers)
