"""An attached call's run: it ends with its holder's stored outcome under its own task id,
without running the body, so Celery's tracer sends its links, its chain and its chord's count.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from celery import Task, states
from celery.exceptions import Ignore

from .. import signals as singleton_signals
from ..broker.attached import holders_outcome
from ..lease import append_history
from ..tokens import ANSWER_HEADER, NAME_HEADER, header
from .replays import Replay

logger = logging.getLogger(__name__)


def answer_of(task: Task, request: object) -> Replay | None:
    """The outcome an attached call's run ends with: its holder's (the message's answer
    header names it), SUCCESS or FAILURE as stored. None: no holder named, or it left no
    outcome (an Ignore, a revoke, a killed worker, results ignored): the call runs as a
    call of its own."""
    holder = header(request, ANSWER_HEADER)
    task_id = getattr(request, "id", None)
    if not holder or holder == task_id:
        return None
    name = header(request, NAME_HEADER) or ""
    if _answered_before(task, task_id):
        _drop_copy(task, task_id, name, holder)
    outcome = holders_outcome(task.backend, holder)
    if outcome is None:
        logger.info(
            "%s[%s]: its holder %s left no outcome: it runs as a call of its own",
            task.name,
            task_id,
            holder,
        )
        return None
    status, result = outcome
    if status == states.SUCCESS:
        replay = Replay(result)
    else:
        assert isinstance(result, BaseException)  # noqa: S101  (holders_outcome's FAILURE)
        replay = Replay(error=result)
    context = getattr(task, "singleton_context", None)
    if name and context is not None and context.keeps_history:
        record = context.record(name, task_id)
        append_history(context.store, record, "answered", holder=holder, outcome=status)
    logger.info(
        "%s[%s]: answered with its holder's outcome: lock=%s holder=%s state=%s",
        task.name,
        task_id,
        name,
        holder,
        status,
    )
    singleton_signals.send(
        singleton_signals.attached_answered,
        task,
        name,
        task_id=task_id,
        holder_id=holder,
        state=status,
    )
    return replay


def _answered_before(task: Task, task_id: object) -> bool:
    """Whether this call's own id has its outcome stored already: this message is a second
    one of an answered call (its worker killed after sending it and before forgetting it
    sends it again, ``broker.attached``), whose chain and links went on once already."""
    meta = task.backend.get_task_meta(task_id)
    return meta.get("status") in states.READY_STATES


def _drop_copy(task: Task, task_id: object, name: str, holder: str) -> NoReturn:
    """End this delivery as a copy: Ignore stores no state and sends no link (Celery's
    tracer), so the first answer and its continuations stay the only ones."""
    singleton_signals.send(
        singleton_signals.copy_dropped, task, name, task_id=task_id, holder_state="answered"
    )
    logger.info(
        "copy of answered task dropped: task=%s id=%s lock=%s holder=%s",
        task.name,
        task_id,
        name,
        holder,
    )
    raise Ignore(f"a copy of {task_id}, answered already with {holder}'s outcome")


__all__ = ["answer_of"]
