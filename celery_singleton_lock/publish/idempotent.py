"""A call with an idempotency key at dispatch: the first is claimed and sent, a repeat answered.

The claim is one round trip before the call's own dispatch. A repeat with the same
arguments gets the first call's ``AsyncResult`` (queued, running or done) and nothing
is sent; other arguments raise ``IdempotencyConflictError`` before anything is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from celery import states
from celery.backends.base import DisabledBackend

from .. import outages
from .. import signals as singleton_signals
from ..config.idempotency_options import warn_once_for_call_keys
from ..config.options import SingletonOptions
from ..context import TaskContext
from ..exceptions import IdempotencyConflictError, LockStoreUnavailableError
from ..lease import append_history
from ..lease.idempotency import Claim, idempotency_keys_of
from ..tokens import IDEMPOTENCY_HEADER

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from .call import Dispatch

logger = logging.getLogger(__name__)


def key_of_call(
    task: str,
    options: SingletonOptions,
    call: tuple[Sequence[object], Mapping[str, object]],
    call_options: dict[str, object],
) -> str | None:
    """The call's idempotency key, taken out of its options (``idempotency_key=``), or
    found by the task's ``key_from``; None: the call has none (nothing else is done
    then: the dispatch of a call without a key pays a dict lookup)."""
    given = call_options.pop("idempotency_key", None)
    idempotency = options.idempotency
    if given is not None:
        return idempotency.checked(task, given)
    if idempotency.key_from is None:
        return None
    headers = call_options.get("headers")
    return idempotency.key_of(
        task, options.key, *call, headers if isinstance(headers, Mapping) else None
    )


def send_once(dispatch: Dispatch, key: str, send: Callable[[Dispatch], AsyncResult]) -> AsyncResult:
    """Claim ``key`` for this call (its task id, made now if it has none) and ``send``
    it, or answer a repeat with the first call's result. Where the task's results are
    stored, a first call in flight can be seen to have failed.

    A claimed call that is not sent after all (refused as a duplicate of another call, or
    its publish failed) frees its key (``forget``), so the client's retry is a first call
    again."""
    context, call, options, sender = (
        dispatch.context,
        dispatch.call,
        dispatch.options,
        dispatch.task,
    )
    task_id, result_of = dispatch.new_task_id(), sender.AsyncResult
    results_kept = not sender.ignore_result and not isinstance(sender.backend, DisabledBackend)
    warn_once_for_call_keys(
        context.name,
        context.options.idempotency,
        context.app.conf,
        bool(getattr(sender, "ignore_result", False)),
    )
    fingerprint = context.options.key.fingerprint(*call)
    given = options.get("headers") or {}
    if isinstance(given, Mapping):  # also when sent unchecked: its copies meet the key
        options["headers"] = {**given, IDEMPOTENCY_HEADER: key}
    try:
        claim = _claim(context, key, task_id, fingerprint, result_of if results_kept else None)
    except LockStoreUnavailableError as error:
        outages.at_dispatch(context, f"idempotency key {key!r}", error)  # fail_closed raises
        # fail_open: sent without the check, as a lock's dispatch would be.
        return send(dispatch)
    if not claim.first:
        return result_of(_repeat(context, key, call, claim, sender=sender, fingerprint=fingerprint))
    try:
        sent = send(dispatch)
    except BaseException:
        forget(context, key, task_id)
        raise
    if sent.id != task_id:  # the lock answered with another call: this one was not sent
        forget(context, key, task_id)
    return sent


def _claim(
    context: TaskContext,
    key: str,
    task_id: str,
    fingerprint: str,
    result_of: Callable[[str], AsyncResult] | None,
) -> Claim:
    """The key claimed for ``task_id``, or the record of the call that has it. A first
    call left in flight by a run that ended without writing its end (a hard time limit,
    a worker lost, a revoke before it started) and whose result says it failed or was
    revoked frees the key, unless failures are kept: the client's retry then runs. That
    costs a repeat of a call in flight one read of the result backend (none when
    ``result_of`` is None: results are not kept)."""
    idempotency = context.options.idempotency
    keys = idempotency_keys_of(context.store)
    claim = keys.claim(key, task_id, fingerprint, idempotency.window_ms, context.name)
    if claim.first or claim.ended or idempotency.keep_failures or result_of is None:
        return claim
    holder = claim.by if claim.state == "running" else claim.call
    if not _ended_badly(result_of(holder)):
        return claim
    keys.end(key, holder, "forget")  # owner-checked: only if it is still that call's
    return keys.claim(key, task_id, fingerprint, idempotency.window_ms, context.name)


def _ended_badly(result: AsyncResult) -> bool:
    try:
        return str(result.state) in (states.FAILURE, states.REVOKED)
    except Exception:  # no result backend, or it is down: cannot tell
        return False


def _repeat(
    context: TaskContext,
    key: str,
    call: tuple[Sequence[object], Mapping[str, object]],
    claim: Claim,
    *,
    sender: object,
    fingerprint: str,
) -> str:
    """A repeat of ``key``: recorded in the lock's history, refused if its arguments are
    another request's; else the first call's id, whose result answers it."""
    lock_name = context.options.key.derive(*call)
    same = claim.answers_for(fingerprint)
    # The lock's history says what the key answered (a round trip, with history on).
    append_history(
        context.store,
        context.record(lock_name, claim.call),
        "idempotent repeat" if same else "idempotency conflict",
        idempotency_key=key,
    )
    if not same:
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
    return claim.call


def forget(context: TaskContext, key: str, task_id: str) -> None:
    """Free ``key`` if ``task_id`` holds it and no run of it began (owner-checked)."""
    try:
        idempotency_keys_of(context.store).end(key, task_id, "unsent")
    except LockStoreUnavailableError as error:
        logger.warning(
            "idempotency key %r of %s[%s] not freed (%s): it stays bound to a call that "
            "was not sent until its window ends",
            key,
            context.name,
            task_id,
            error,
        )
