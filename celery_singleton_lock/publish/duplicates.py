"""A refused call's answer as a duplicate: the holder's result, or ``DuplicateTaskError``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import signals as singleton_signals
from ..exceptions import DuplicateTaskError
from ..tokens import holder_state, holder_task_id

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from ..lease import Contended
    from .call import Dispatch

logger = logging.getLogger(__name__)


def answer_duplicate(call: Dispatch, held: Contended) -> AsyncResult:
    """A refused call's answer, as its mode's refusal says (``Refusal.duplicate``): the
    holder's result, or ``DuplicateTaskError``."""
    task, lock_name = call.task, call.lock_name
    holder = holder_task_id(held.holder)
    singleton_signals.send(
        singleton_signals.duplicate_refused,
        task,
        lock_name,
        task_id=call.task_id,
        holder_id=holder,
    )
    if logger.isEnabledFor(logging.INFO):
        # One line, stable wording (docs/operations.md): why this call was not sent.
        logger.info(
            "refused at dispatch: task=%s lock=%s holder=%s state=%s",
            task.name,
            lock_name,
            holder or "-",
            holder_state(held),
        )
    mode = call.facts.mode
    answer = mode.refusal.duplicate(holder, task.AsyncResult)
    if answer is not None:
        return answer
    raise DuplicateTaskError(
        f"{task.name} {mode.refused_because()} for {lock_name!r}"
        + (f" as task {holder}" if holder else " (holder unknown)"),
        name=lock_name,
        key=held.key,
        task_id=holder,
    )
