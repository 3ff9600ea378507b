"""A retry of the running task: its lease handed to the retry's message as it is sent.

Celery's ``Task.retry`` re-sends the running task under the same id. The running lease
passes to the retry's message in one step (``hand_over``), so no other call can take the
key between this execution's end and the retry's start (unless ``reopen_on`` frees it at a failure).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..exceptions import LockStoreUnavailableError
from ..lease import Contended, Lease, split_role
from ..outages import release_or_warn
from ..tokens import HOLD_HEADER, NAME_HEADER, RETRY_OF_HEADER, TOKEN_HEADER
from .dispatch import long_wait

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from .call import Dispatch

logger = logging.getLogger(__name__)


def send_retry(
    call: Dispatch, running: Lease, *, token: str, handed_over: Callable[[], None]
) -> AsyncResult:
    """Publish the retry's message (``call``, under the running task's id) holding
    ``running``'s key under ``token`` (a queued hold, ``tokens.retry_token``);
    ``handed_over()`` once the running lease is the message's (the execution then does
    not release it)."""
    context, task_id, options, publish = call.context, call.task_id, call.options, call.publish
    store = context.store
    delay = long_wait(context, options)  # a countdown past the visibility_timeout: hops
    # A slot of a counting lease (limit=N) is named beside the key: the retry's
    # message carries the key and which slot it keeps.
    lock_name, role = split_role(running.name)
    headers: dict[str, object] = {NAME_HEADER: lock_name, RETRY_OF_HEADER: running.token}
    if not context.options.mode.retry_keeps_key:
        # reopen_on=("failure",): the key is free at the failure (this run releases it
        # as it ends); the retry contends when it comes, behind any call let in since.
        return publish(task_id, options, headers)
    try:
        outcome = store.hand_over(running, context.queue_ttl + delay, token=token)
    except LockStoreUnavailableError as error:
        # The retry is sent anyway: losing it would be worse. It meets on_contention
        # at execution if this execution's lease is still there.
        logger.warning("retry of %s could not keep %s: %s", context.name, running.name, error)
        outcome = None
    if isinstance(outcome, Lease):
        headers[TOKEN_HEADER] = token
        if role is not None:
            headers[HOLD_HEADER] = role
        handed_over()
    elif isinstance(outcome, Contended):
        logger.warning("retry of %s: the lease on %s was already lost", context.name, running.name)
    try:
        return publish(task_id, options, headers)
    except BaseException:
        if isinstance(outcome, Lease):
            release_or_warn(store.release, outcome)
        raise
