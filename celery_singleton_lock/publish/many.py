"""Many calls of one task dispatched together (``apply_many``): their holds decided in one
script call, their messages in one broker pipeline, a duplicate answered with its holder.

Each message is still built by Celery's ``apply_async``; a call that cannot be decided
with the others (``sent_alone``, ``batches``) is sent by ``apply_async``, after the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

from celery.canvas import Signature

from .. import signals as singleton_signals
from ..exceptions import DuplicateTaskError, LockStoreUnavailableError
from ..lease import Contended, Lease
from ..lease.batch_holds import BatchHolds, HoldSpec, batch_holds_of
from ..tokens import holder_task_id
from .dispatch import long_wait
from .pipeline import give_back, publish_together

if TYPE_CHECKING:
    from celery import Task
    from celery.result import AsyncResult

    from .call import Dispatch, TaskFacts

logger = logging.getLogger(__name__)

# One call of a batch as given: positional arguments, keyword arguments, options.
Item: TypeAlias = tuple[Sequence[object], Mapping[str, object], dict[str, object]]


def items_of(task: Task, given: Iterable[object], options: Mapping[str, object]) -> list[Item]:
    """Each of ``given`` as a call of ``task``: a tuple (or list) of positional arguments,
    or a signature of ``task`` (its own options over the batch's ``options``)."""
    items: list[Item] = []
    for item in given:
        if isinstance(item, Signature):
            if item.task != task.name:
                raise TypeError(
                    f"{task.name}.apply_many: a signature of {item.task!r} is not a call of "
                    f"{task.name}; send it with its own task"
                )
            items.append((tuple(item.args), dict(item.kwargs), {**options, **item.options}))
        elif isinstance(item, tuple | list):
            items.append((tuple(item), {}, dict(options)))
        else:
            raise TypeError(
                f"{task.name}.apply_many: each item is a tuple of positional arguments or a "
                f"signature of the task, got {item!r}; write ({item!r},) for one argument"
            )
    return items


def sent_alone(options: Mapping[str, object]) -> bool:
    """Whether a call with ``options`` is sent by ``apply_async`` rather than decided with
    the batch: a canvas member (``publish.call.Dispatch.canvas``), ``dedupe=False``, an
    idempotency key, or ``connection=`` (Celery then publishes on a producer of its own)."""
    return bool(
        options.get("link")
        or options.get("link_error")
        or options.get("chain") is not None
        or options.get("group_id")
        or options.get("chord")
        or options.get("dedupe", True) is False
        or options.get("idempotency_key") is not None
        or options.get("connection") is not None
    )


def batches(facts: TaskFacts) -> BatchHolds | None:
    """The store's batch holds where this task's calls may be decided together: its mode
    holds at dispatch and answers a duplicate with its holder (not a replace, debounce or
    cancel, not a rate's slot), no ``max_pending`` place, no idempotency key, no history
    kept, not run eagerly, and one script can see every key (not a Cluster, a Redlock or
    a store waiting for replicas). None: each call is sent on its own."""
    mode, options = facts.mode, facts.options
    if (
        facts.app.conf.task_always_eager
        or not mode.checks_dispatch
        or mode.refusal.looked_at_start
        or mode.asks_at_publish
        or options.max_pending is not None
        or options.idempotency.key_from is not None
        or facts.keeps_history
    ):
        return None
    return batch_holds_of(facts.store)


def send_many(
    task: Task,
    facts: TaskFacts,
    items: Sequence[Item],
    dispatch: Callable[[Item], Dispatch],
    producer: object,
) -> list[AsyncResult]:
    """One result per item, in order: the batch's calls decided together (``dispatch``
    makes each one's ``Dispatch``); the others, and all where the task cannot batch, sent
    by the task's ``apply_async``, after the batch."""
    holds = batches(facts)
    together = [i for i, item in enumerate(items) if holds is not None and not sent_alone(item[2])]
    results: dict[int, AsyncResult] = {}
    if holds is not None and together:
        answers = decide(facts, holds, [dispatch(items[i]) for i in together], producer)
        results.update(zip(together, answers, strict=True))
    for i, (args, kwargs, options) in enumerate(items):
        if i not in results:
            results[i] = task.apply_async(args, kwargs, producer=producer, **options)
    return [results[i] for i in range(len(items))]


def decide(
    facts: TaskFacts, holds: BatchHolds, calls: Sequence[Dispatch], producer: object
) -> list[AsyncResult]:
    """The calls' holds in one script, the held calls' messages in one pipeline: each
    call's own result, or its duplicate's holder's (an earlier call of the batch, or the
    key's holder already)."""
    mode = facts.mode

    def hold_of(call: Dispatch) -> str:
        return mode.hold_name(call.lock_name) or call.lock_name

    for call in calls:  # KeyDerivationError: nothing held, nothing sent
        call.lock_name = facts.options.key.derive(*call.call)
    firsts: dict[str, Dispatch] = {}
    for call in calls:  # the first call of a key stands for it
        firsts.setdefault(hold_of(call), call)
    distinct = list(firsts.values())
    for call in distinct:
        mode.prepare(call.task.name, call.options)
        call.plan_hold(long_wait(facts, call.options))
    answers: dict[str, AsyncResult] = {}
    try:
        outcomes = holds.hold([HoldSpec(call.hold, call.ttl, call.token) for call in distinct])
    except LockStoreUnavailableError as error:
        distinct[0].outage(error)  # fail_closed raises, nothing sent; fail_open sends unheld
        sent = publish_together(distinct, producer, held=False)
        answers.update(zip(firsts, sent, strict=True))
        return [answers[hold_of(c)] for c in calls]
    held = [(c, o) for c, o in zip(distinct, outcomes, strict=True) if isinstance(o, Lease)]
    refused = [(c, o) for c, o in zip(distinct, outcomes, strict=True) if isinstance(o, Contended)]
    foreign = [(c, o) for c, o in refused if holder_task_id(o.holder) is None]
    if foreign:
        give_back(facts, [lease for _, lease in held])
        for call, _ in foreign:  # refused as a duplicate, of a holder of unknown id
            singleton_signals.send(
                singleton_signals.duplicate_refused,
                call.task,
                call.lock_name,
                task_id=call.task_id,
                holder_id=None,
            )
        call, outcome = foreign[0]
        raise DuplicateTaskError(
            f"{call.task.name} {mode.refused_because()} for {call.lock_name!r} (holder "
            "unknown); nothing of the batch was sent",
            name=call.lock_name,
            key=outcome.key,
            task_id=None,
        )
    sent = publish_together([c for c, _ in held], producer, held=True, leases=[o for _, o in held])
    for (call, _), result in zip(held, sent, strict=True):
        call.accepted()
        answers[hold_of(call)] = result
    for call, outcome in refused:
        call.refused(outcome)
        answers[hold_of(call)] = call.task.AsyncResult(holder_task_id(outcome.holder))
    # Every call answered by another's hold is a duplicate refused, as a single call is:
    # those the store refused, and those folded into an earlier call of the batch.
    duplicates = [call for call in calls if answers[hold_of(call)].id != call.task_id]
    for call in duplicates:
        holder = answers[hold_of(call)].id
        singleton_signals.send(
            singleton_signals.duplicate_refused,
            call.task,
            call.lock_name,
            task_id=call.task_id,
            holder_id=holder,
        )
    if duplicates and logger.isEnabledFor(logging.INFO):
        # One line a batch, not one a call: the batch's duplicates counted, a few named.
        named = sorted({call.lock_name for call in duplicates})
        logger.info(
            "refused at dispatch: task=%s count=%d locks=%s",
            facts.name,
            len(duplicates),
            ",".join(named[:5]) + (",..." if len(named) > 5 else ""),
        )
    return [answers[hold_of(call)] for call in calls]


__all__ = ["Item", "batches", "decide", "items_of", "send_many", "sent_alone"]
