"""A contention at execution as operators see it: the signal and its one INFO line."""

from __future__ import annotations

import logging

from .. import signals as singleton_signals
from ..context import Delivery
from ..policies import ContentionState, Decision, described

# The logger this line always had: operators filter their logs on it.
logger = logging.getLogger("celery_singleton_lock.run.execution")


def contended(
    delivery: Delivery, name: str, state: ContentionState, held_as: str, decision: Decision
) -> None:
    """The run found ``name`` held (``held_as``: the holder's state) and does
    ``decision``: ``execution_contended`` (again, ``waited``, once a wait ran out), and
    for the contention one INFO line of stable wording (docs/operations.md): contention
    is expected work, one line each."""
    request = delivery.request
    singleton_signals.send(
        singleton_signals.execution_contended,
        delivery.sender,
        name,
        task_id=request.id,
        holder_id=state.holder,
        decision=decision,
        waited=state.waited,
    )
    if not state.waited and logger.isEnabledFor(logging.INFO):
        logger.info(
            "contended at execution: task=%s id=%s lock=%s holder=%s state=%s then=%s",
            delivery.name,
            request.id,
            name,
            state.holder or "-",
            held_as,
            described(decision),
        )


__all__ = ["contended"]
