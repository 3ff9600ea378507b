"""``on_duplicate="replace"``: a later call's arguments swapped into the queued call.

The queued call keeps its task id, so every caller holds the ``AsyncResult`` of the run
that will cover its call. The later call publishes a new message under that id and
moves the queued hold to it in one compare-and-swap (``RedisLock.swap``): only while the
holder is a queued or reserved message, never a running one (replace never cancels a
run). The replaced message finds the hold taken by another message of its own id when
it arrives, and the worker drops it quietly (``execution.py``): acked, no result, not
REVOKED, which Celery's revoke by id would also do to its replacement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .exceptions import LockStoreUnavailableError
from .lease import Contended, Lease
from .tokens import TOKEN_HEADER, holder_task_id, queued_token

logger = logging.getLogger(__name__)

# Holders whose message has not started: a queued hold or a worker's reservation of it.
REPLACEABLE = ("q|", "r|")


class Replacement:
    """What a dispatch needs to replace the queued call it was refused by."""

    def __init__(
        self,
        *,
        task: Any,
        key: str,
        hold: str,
        ttl: float,
        ours: dict[str, Any],
        options: dict[str, Any],
        publish: Callable[..., Any],
    ) -> None:
        self._task = task
        self._key = key
        self._hold = hold
        self._ttl = ttl
        self._ours = ours
        self._options = options  # as the caller gave them: the first publish consumed its copy
        self._publish = publish

    def __call__(self, held: Contended) -> Any:
        task, store = self._task, self._task._singleton_store.lock
        holder = held.holder
        queued_id = holder_task_id(holder)
        if queued_id is None or not holder.startswith(REPLACEABLE):
            return task._duplicate(self._key, held)  # running: its result covers this call
        token = queued_token(queued_id)
        try:
            outcome = store.swap(self._hold, holder, self._ttl, token=token)
        except LockStoreUnavailableError as error:
            task._redis_error_at_dispatch(self._key, error)  # fail_open: as a duplicate
            return task._duplicate(self._key, held)
        if isinstance(outcome, Contended):
            # It started, or another call replaced it first: that holder covers this call.
            return (
                task._duplicate(self._key, outcome)
                if outcome.holder
                else task._duplicate(self._key, held)
            )
        try:
            self._publish(queued_id, self._options, {**self._ours, TOKEN_HEADER: token})
        except BaseException:
            # The replaced message is still queued: give its hold back, or it would be
            # dropped as replaced by a message that was never sent.
            self._give_back(outcome, holder)
            raise
        logger.info(
            "%s: queued call %s takes a later call's arguments for %r",
            task.name,
            queued_id,
            self._key,
        )
        return task.AsyncResult(queued_id)

    def _give_back(self, swapped: Lease, holder: str) -> None:
        try:
            self._task._singleton_store.lock.swap(
                self._hold, swapped.token, self._ttl, token=holder
            )
        except LockStoreUnavailableError as error:
            logger.warning(
                "%s: the replaced call's hold could not be restored (%s)", self._key, error
            )
