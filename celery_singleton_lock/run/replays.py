"""A run of a call with an idempotency key: it does the work once per key, or answers instead.

``begin`` runs holding the call's running lease, so no other run of the same call is alive.
If the key's work is done (succeeded, or failed and kept), the run answers with that outcome
instead: a redelivery after success before the ack, a ``send_task`` or beat tick with the key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from celery import Task, signals, states
from celery.backends.base import DisabledBackend

from .. import signals as singleton_signals
from ..context import TaskContext
from ..exceptions import (
    IdempotencyConflictError,
    IdempotencyResultMissingError,
    LockStoreUnavailableError,
)
from ..lease import append_history
from ..lease.idempotency import Claim, Outcome, idempotency_keys_of
from ..tokens import IDEMPOTENCY_HEADER, header

logger = logging.getLogger(__name__)

# Set on the request of a run that began under an idempotency key: the key its end writes,
# and the release of its lease, sent once that end is written.
RUN_KEY = "singleton_idempotency_key"
RUN_RELEASE = "singleton_idempotency_release"


class ResultStore(Protocol):
    """The part of a Celery result backend a replay reads."""

    def get_task_meta(self, task_id: str) -> Mapping[str, object]: ...


@dataclass(frozen=True)
class Replay:
    """The outcome a run answers with instead of running: a value, or the error raised."""

    value: object = None
    error: BaseException | None = None

    def answer(self) -> object:
        if self.error is not None:
            raise self.error
        return self.value


def kept_results(task: Task, request: object) -> ResultStore | None:
    """The result backend a replay reads; None when this run's results are not kept
    (ignored, not stored for an eager call, or no backend)."""
    eager = bool(getattr(request, "is_eager", False))
    if task.ignore_result or (eager and not task.app.conf.task_store_eager_result):
        return None
    if isinstance(task.backend, DisabledBackend):
        return None
    backend: ResultStore = task.backend
    return backend


def release_after_end(request: object, release: Callable[..., None]) -> bool:
    """Whether this run's lease is released after its end is written (``release`` is
    called then, with ``ride=False``): a run that began under a key. A copy of the call
    that got the lease between the release and the end would find the record running
    and no result stored yet, and do the work again."""
    if getattr(request, RUN_KEY, None) is None:
        return False
    setattr(request, RUN_RELEASE, release)
    return True


def key_of(
    context: TaskContext,
    request: object,
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> str | None:
    """The run's idempotency key: its message's, else the task's ``key_from`` finds it."""
    sent = header(request, IDEMPOTENCY_HEADER)
    options = context.options
    if isinstance(sent, str) and sent:
        return options.idempotency.checked(context.name, sent)  # refused by this mode?
    headers = getattr(request, "headers", None)
    return options.idempotency.key_of(context.name, options.key, args, kwargs, headers)


def begin(
    context: TaskContext,
    request: object,
    call: tuple[Sequence[object], Mapping[str, object]],
    *,
    name: str,
    sender: object,
    results: Callable[[], ResultStore | None],
) -> Replay | None:
    """None: the body runs (its end is written after it); else the ``Replay`` to answer
    with. ``results``: the task's result backend (None when it keeps no results), asked
    only for a run with a key.

    The outcome is read from the result backend under the id of the run that did the
    work. A key bound to other arguments fails the run."""
    task_id = str(getattr(request, "id", ""))
    key = key_of(context, request, *call)
    if key is None:
        return None
    kept = results()
    fingerprint = context.options.key.fingerprint(*call)
    idempotency = context.options.idempotency
    try:
        claim = idempotency_keys_of(context.store).begin(
            key, task_id, fingerprint, idempotency.window_ms, context.name
        )
    except LockStoreUnavailableError as error:
        if context.stores.config.on_redis_error == "fail_closed":
            raise
        logger.warning(
            "%s[%s]: idempotency key %r unchecked, the lock store is unreachable (%s): "
            "running (fail_open)",
            context.name,
            task_id,
            key,
            error,
        )
        return None
    done_unwritten = claim.first and claim.state == "running" and _stored(kept, claim.by)
    if claim.first and not done_unwritten:
        _watch_ends()
        setattr(request, RUN_KEY, key)
        return None
    if done_unwritten:
        # That run died after Celery stored its success, before its end was written
        # (a redelivery of it, or a copy: Celery itself may not deliver it again).
        _end(context, key, task_id, "succeeded")
    elif not claim.answers_for(fingerprint):
        append_history(
            context.store,
            context.record(name, task_id),
            "idempotency conflict",
            idempotency_key=key,
            holder=claim.call,
        )
        raise IdempotencyConflictError(
            f"{context.name}[{task_id}] did not run: idempotency key {key!r} is bound to "
            f"call {claim.call} with other arguments (or another task)",
            task_id=claim.call,
            idempotency_key=key,
        )
    return _replay(
        context,
        claim,
        name=name,
        key=key,
        results=kept,
        sender=sender,
        task_id=task_id,
        by=claim.by,
    )


def _stored(results: ResultStore | None, task_id: str) -> bool:
    """Whether Celery stored a success under ``task_id``."""
    return results is not None and results.get_task_meta(task_id).get("status") == states.SUCCESS


def _replay(
    context: TaskContext,
    claim: Claim,
    *,
    name: str,
    key: str,
    results: ResultStore | None,
    sender: object,
    task_id: str,
    by: str,
) -> Replay:
    append_history(
        context.store,
        context.record(name, task_id),
        "idempotent replay",
        idempotency_key=key,
        holder=by,
    )
    singleton_signals.send(
        singleton_signals.idempotent_replayed,
        sender,
        name,
        idempotency_key=key,
        task_id=task_id,
        answered_by=by,
    )
    if results is None:
        return Replay()  # results are not kept: there is nothing to answer with
    meta = results.get_task_meta(by)
    status, result = meta.get("status"), meta.get("result")
    if status == states.SUCCESS:
        return Replay(result)
    if status == states.FAILURE and isinstance(result, BaseException):
        return Replay(error=result)
    return Replay(
        error=IdempotencyResultMissingError(
            f"{context.name}[{task_id}] did not run: idempotency key {key!r} says call "
            f"{by} {claim.state or 'ran'}, but its result is no longer stored (raise "
            "result_expires to cover the idempotency window)",
            task_id=by,
            idempotency_key=key,
        )
    )


def _end(context: TaskContext, key: str, task_id: str, outcome: Outcome) -> None:
    try:
        idempotency_keys_of(context.store).end(key, task_id, outcome)
    except LockStoreUnavailableError as error:
        logger.warning(
            "%s[%s]: idempotency key %r's end (%s) not written (%s); the key keeps its "
            "first call until its window ends",
            context.name,
            task_id,
            key,
            outcome,
            error,
        )


_watching: list[bool] = []


def _watch_ends() -> None:
    """Connect the end's receiver once a process first runs a call with a key: until
    then Celery sends no ``task_postrun`` on our account."""
    if not _watching:
        signals.task_postrun.connect(_at_postrun, weak=False, dispatch_uid=__name__)
        _watching.append(True)


# Celery's end states and what each writes: kept (the outcome for the window) or freed.
_OUTCOMES: dict[str, Outcome] = {
    states.SUCCESS: "succeeded",
    states.REVOKED: "forget",
    states.REJECTED: "forget",
    states.IGNORED: "forget",
}


def _at_postrun(
    sender: object = None, task_id: str | None = None, state: str | None = None, **_: object
) -> None:
    """Write a keyed run's end once Celery has stored its result (``task_postrun``): a
    worker that dies in between leaves the record running, and the next run of the call
    finds that stored success instead of running again (``begin``)."""
    request = getattr(sender, "request", None)
    key = getattr(request, RUN_KEY, None)
    if key is None or task_id is None:
        return  # not a keyed run
    release = getattr(request, RUN_RELEASE, None)
    setattr(request, RUN_KEY, None)
    setattr(request, RUN_RELEASE, None)
    context = getattr(sender, "singleton_context", None)
    outcome = _outcome(context, state) if isinstance(context, TaskContext) else None
    # A kept outcome is written before the lock is let go (a copy then finds it); a freed
    # key after (the client's retry, sent once the key is free, finds the lock free too).
    if isinstance(context, TaskContext) and outcome in ("succeeded", "failed"):
        _end(context, key, task_id, outcome)
    if callable(release):
        release(ride=False)
    if isinstance(context, TaskContext) and outcome == "forget":
        _end(context, key, task_id, outcome)


def _outcome(context: TaskContext, state: str | None) -> Outcome | None:
    """What a run's end writes for Celery's ``state``; None for a retry (its run ends it)."""
    if state == states.RETRY:
        return None
    outcome = _OUTCOMES.get(str(state))
    if outcome is None:  # a failure: freed for the client's retry, unless kept
        outcome = "failed" if context.options.idempotency.keep_failures else "forget"
    return outcome
