"""A call with an idempotency key at dispatch: the first is claimed and sent, a repeat answered.

The claim is one round trip before the call's own dispatch. A repeat with the same
arguments gets the first call's ``AsyncResult`` (queued, running or done) and nothing
is sent; other arguments raise ``IdempotencyConflictError`` before anything is sent. A
claimed call that is not sent after all (refused as a duplicate of another call, or
its publish failed) frees its key, so the client's retry is a first call again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from .. import outages
from .. import signals as singleton_signals
from ..context import TaskContext
from ..exceptions import IdempotencyConflictError, LockStoreUnavailableError
from ..lease import append_history
from ..lease.idempotency import idempotency_keys_of
from ..tokens import IDEMPOTENCY_HEADER

if TYPE_CHECKING:
    from celery.result import AsyncResult

logger = logging.getLogger(__name__)


def key_of_call(
    context: TaskContext,
    call: tuple[Sequence[object], Mapping[str, object]],
    options: dict[str, object],
) -> str | None:
    """The call's idempotency key, taken out of its options (``idempotency_key=``), or
    found by the task's ``key_from``; None: the call has none."""
    given = options.pop("idempotency_key", None)
    idempotency = context.options.idempotency
    if given is not None:
        return idempotency.checked(context.name, given)
    headers = options.get("headers")
    return idempotency.key_of(
        context.name,
        context.options.key,
        *call,
        headers if isinstance(headers, Mapping) else None,
    )


def send_once(
    context: TaskContext,
    key: str,
    call: tuple[Sequence[object], Mapping[str, object]],
    task_id: str,
    options: dict[str, object],
    *,
    sender: object,
    send: Callable[[], AsyncResult],
    result_of: Callable[[str], AsyncResult],
) -> AsyncResult:
    """Claim ``key`` for this call (``task_id``) and ``send`` it, or answer a repeat with
    the first call's result (``result_of`` its id)."""
    fingerprint = context.options.key.fingerprint(*call)
    idempotency = context.options.idempotency
    keys = idempotency_keys_of(context.store)
    try:
        claim = keys.claim(key, task_id, fingerprint, idempotency.window_ms, context.name)
    except LockStoreUnavailableError as error:
        outages.at_dispatch(context, f"idempotency key {key!r}", error)  # fail_closed raises
        return send()  # fail_open: sent without the check, as a lock's dispatch would be
    if not claim.first:
        lock_name = context.options.key.derive(*call)
        event = "idempotent repeat" if claim.answers_for(fingerprint) else "idempotency conflict"
        # The lock's history says what the key answered (a round trip, with history on).
        append_history(
            context.store, context.record(lock_name, claim.call), event, idempotency_key=key
        )
        if not claim.answers_for(fingerprint):
            raise IdempotencyConflictError(
                f"{context.name}: idempotency key {key!r} was first used by call "
                f"{claim.call} with other arguments (or another task); a key names one "
                "request: send a new key for a new request",
                task_id=claim.call,
                idempotency_key=key,
            )
        singleton_signals.send(
            singleton_signals.idempotent_repeat,
            sender,
            lock_name,
            idempotency_key=key,
            task_id=claim.call,
            state=claim.state,
        )
        return result_of(claim.call)
    given = options.get("headers") or {}
    if isinstance(given, Mapping):
        options["headers"] = {**given, IDEMPOTENCY_HEADER: key}
    try:
        sent = send()
    except BaseException:
        forget(context, key, task_id)
        raise
    if sent.id != task_id:  # the lock answered with another call: this one was not sent
        forget(context, key, task_id)
    return sent


def forget(context: TaskContext, key: str, task_id: str) -> None:
    """Free ``key`` if ``task_id`` holds it and never ran (owner-checked)."""
    try:
        idempotency_keys_of(context.store).end(key, task_id, "forget")
    except LockStoreUnavailableError as error:
        logger.warning(
            "idempotency key %r of %s[%s] not freed (%s): it stays bound to a call that "
            "was not sent until its window ends",
            key,
            context.name,
            task_id,
            error,
        )
