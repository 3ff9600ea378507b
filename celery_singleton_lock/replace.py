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
import time
from collections.abc import Callable
from typing import Any

from celery.utils import uuid

from .exceptions import LockStoreUnavailableError
from .lease import Contended, Lease
from .tokens import (
    TOKEN_HEADER,
    burst_began,
    debounced_token,
    holder_task_id,
    queued_form,
    queued_token,
)

logger = logging.getLogger(__name__)

# Holders whose message has not started: a queued hold or a worker's reservation of it.
REPLACEABLE = ("q|", "r|")
# Tries against a hold that keeps changing under a storm of replacing calls, after
# which the call is answered as a duplicate of the latest holder.
ATTEMPTS = 5


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
        refused: Callable[[Contended], Any],
        outage: Callable[[LockStoreUnavailableError], None],
    ) -> None:
        self._refused = refused  # answer the call as a duplicate of ``held``
        self._outage = outage  # the task's singleton_lock_on_redis_error, at dispatch
        self._task = task
        self._key = key
        self._hold = hold
        self._ttl = ttl
        self._ours = ours
        self._options = options  # as the caller gave them: the first publish consumed its copy
        self._publish = publish

    def __call__(self, held: Contended) -> Any:
        task = self._task
        for _ in range(ATTEMPTS):
            holder = held.holder
            queued_id = holder_task_id(holder)
            if holder and (queued_id is None or not holder.startswith(REPLACEABLE)):
                return self._refused(held)  # running: its result covers this call
            try:
                outcome, queued_id, token, ttl, options = self._take_place(holder, queued_id)
            except LockStoreUnavailableError as error:
                self._outage(error)  # fail_open: as a duplicate
                return self._refused(held)
            if isinstance(outcome, Lease):
                self._send(outcome, holder, queued_id, token, ttl, options)
                return task.AsyncResult(queued_id)
            # It changed meanwhile (a worker reserved it, another call replaced it, it
            # started): try again against whoever holds it now.
            held = outcome
        return self._refused(held)

    def _take_place(
        self, holder: str, queued_id: str | None
    ) -> tuple[Lease | Contended, str, str, float, dict[str, Any]]:
        """Swap the queued call's hold to a new message of its id; or, if the hold is free
        now (the queued call started), take it for a new call like a fresh dispatch."""
        store = self._task.singleton_context.store
        if not holder or queued_id is None:
            queued_id = uuid()
            token = self._fresh_token(queued_id)
            outcome = store.try_acquire(self._hold, self._ttl, token=token, fenced=False)
            return outcome, queued_id, token, self._ttl, self._options
        token, ttl, options = self._successor(queued_id, holder)
        # Recorded as the queued hold it was made from: the replaced message asks by that.
        outcome = store.swap(self._hold, holder, ttl, token=token, record=queued_form(holder))
        return outcome, queued_id, token, ttl, options

    def _fresh_token(self, task_id: str) -> str:
        if self._task.singleton_options().debounce is None:
            return queued_token(task_id)
        return debounced_token(task_id, time.time())

    def _send(  # noqa: PLR0917  (one replacement's whole state)
        self,
        place: Lease,
        holder: str,
        queued_id: str,
        token: str,
        ttl: float,
        options: dict[str, Any],
    ) -> None:
        try:
            self._publish(queued_id, options, {**self._ours, TOKEN_HEADER: token})
        except BaseException:
            # A replaced message is still queued: give its hold back, or it would be
            # dropped as replaced by a message that was never sent.
            self._give_back(place, holder, ttl)
            raise
        if holder:
            logger.info(
                "%s: queued call %s takes a later call's arguments for %r",
                self._task.name,
                queued_id,
                self._key,
            )

    def _successor(self, queued_id: str, holder: str) -> tuple[str, float, dict[str, Any]]:
        """(token, hold ttl, publish options) of the message replacing ``holder``'s.

        Debounced: it runs ``debounce`` s from now, but no later than ``max_wait`` after
        the burst began (kept in the holder's token).
        """
        opts = self._task.singleton_options()
        if opts.debounce is None:
            return queued_token(queued_id), self._ttl, self._options
        now = time.time()
        began = burst_began(holder) or now
        delay = opts.debounce
        if opts.max_wait is not None:
            delay = max(0.0, min(delay, began + opts.max_wait - now))
        options = {**self._options, "countdown": delay}
        return (
            debounced_token(queued_id, began),
            self._task.singleton_context.queue_ttl + delay,
            options,
        )

    def _give_back(self, place: Lease, holder: str, ttl: float) -> None:
        store = self._task.singleton_context.store
        try:
            if holder:
                store.swap(self._hold, place.token, ttl, token=holder)
            else:
                store.release(place)
        except LockStoreUnavailableError as error:
            logger.warning(
                "%s: the replaced call's hold could not be restored (%s)", self._key, error
            )
