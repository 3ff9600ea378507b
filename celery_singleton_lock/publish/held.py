"""A call that holds its lock before it is sent: the hold planned, taken (in the push's
own script, or overlapped with Celery building the message), a duplicate answered.

``SingletonTask.apply_async`` sends here every call its mode checks at dispatch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from celery.utils import uuid

from .. import outages
from .. import signals as singleton_signals
from ..broker.seam import trips_of
from ..exceptions import DuplicateTaskError, LockStoreUnavailableError
from ..lease import HOLD, Contended
from ..lease.offers import Offered, offers_of
from ..modes import Replacement, arguments
from ..modes.base import Publish
from ..tokens import NAME_HEADER, holder_state, holder_task_id
from .dispatch import (
    Gate,
    GatedProducer,
    Sent,
    can_overlap,
    delay_of,
    long_wait,
    refusals,
    send_gated,
)
from .riding import Ride, duplicate_answered

if TYPE_CHECKING:
    from celery import Task
    from celery.result import AsyncResult

    from ..context import TaskContext

logger = logging.getLogger(__name__)


def send_held(
    task: Task,
    context: TaskContext,
    lock_name: str,
    call: tuple[Sequence[object], Mapping[str, object]],
    *,
    task_id: str | None,
    options: dict[str, object],
    publish: Publish,
    producer: object,
) -> AsyncResult:
    """Publish ``task``'s call that holds its lock first; a duplicate is answered, not sent."""
    mode = context.options.mode
    duplicate = partial(answer_duplicate, task, context, lock_name)
    task_id = task_id or uuid()
    # What the hold's take, swap or read writes in a kept history (given as ``entry``).
    record = context.record(
        lock_name,
        task_id,
        take=("accepted", "refused", ""),
        swap=("replaced", "", ""),
        read=("", "refused", ""),
    )
    store, queue_ttl = context.store, context.queue_ttl
    # A storm of one call's duplicates: one read answers it before anything is built.
    early = duplicate_answered(mode, store, lock_name, duplicate, record)
    if early is not None:
        return early
    mode.prepare(task.name, options)
    long_wait(context, options)  # a debounce's own window, past the broker's: hops
    planned = mode.hold(lock_name, mode.token(task_id), queue_ttl + delay_of(options))
    hold, ttl, token, own_headers = planned.lock, planned.ttl, planned.token, planned.headers
    outage = partial(outages.at_dispatch, context, lock_name)
    pushes = trips_of(task.app).publish_held(context, options)
    ride = (
        None
        if pushes is None
        else Ride(
            store,
            pushes,
            hold,
            outage,
            partial(task.app.producer_or_acquire, producer),
            swaps=mode.answered_by(lock_name) is None,
            entry=record,
        )
    )
    sent = Sent(
        lock_name,
        task_id,
        options,
        own_headers,
        publish,
        # On a refusal: the holder's result, or with replace, the queued call's with
        # ``own_headers``.
        refused_by=mode.answer_refused(
            duplicate,
            # Built only for a mode that replaces (what it reads costs a dispatch's CPU).
            lambda: Replacement(
                mode=mode,
                task_name=task.name,
                store=store,
                queue_ttl=queue_ttl,
                result=task.AsyncResult,
                name=lock_name,
                hold=hold,
                ttl=ttl,
                own_headers=own_headers,
                options=dict(options),
                publish=publish,
                refused=duplicate,
                outage=outage,
                ride=None if ride is None else ride.replace,
                entry=record,
                offer=offer_of(task, context, call, options),
                long_wait=partial(long_wait, context),
            ),
        ),
        accepted=partial(
            singleton_signals.send,
            singleton_signals.dispatch_accepted,
            task,
            lock_name,
            task_id=task_id,
        ),
    )
    if ride is not None:
        result = ride.send(sent, ttl, token)  # the hold in the push's script
        if result is not None:
            return result
    try:
        pending = store.begin_try_acquire(hold, ttl, token=token, take=HOLD, entry=record)
    except LockStoreUnavailableError as error:
        outage(error)  # fail_closed raises
        return publish(task_id, options, {NAME_HEADER: lock_name})
    gate = Gate(store, lock_name, pending, outage)
    if refusals.expects(lock_name) or not can_overlap(task.app, options):
        return send_gated(gate, sent)
    # The acquire is on its way; Celery builds the message meanwhile and the gated
    # producer waits for the answer just before anything is published.
    with task.app.producer_or_acquire(producer) as real:
        return send_gated(gate, sent, via=GatedProducer(real, gate))


def offer_of(
    task: Task,
    context: TaskContext,
    call: tuple[Sequence[object], Mapping[str, object]],
    options: Mapping[str, object],
) -> Callable[[str, str], Offered] | None:
    """How a call leaves its arguments for a started execution of the pending call
    (``Replacement``), serialized as its message would be; None where the store cannot
    keep them (a Redlock)."""
    offers = offers_of(context.store)
    if offers is None:
        return None
    serializer = str(options.get("serializer") or task.serializer)

    def offer(hold: str, holder: str) -> Offered:
        value = arguments.dump(serializer, *call)
        return offers.offer(hold, holder, value)

    return offer


def answer_duplicate(
    task: Task, context: TaskContext, lock_name: str, held: Contended
) -> AsyncResult:
    """A refused call's answer: the holder's result, or ``DuplicateTaskError``."""
    holder = holder_task_id(held.holder)
    singleton_signals.send(singleton_signals.duplicate_refused, task, lock_name, holder_id=holder)
    opts = context.options
    if logger.isEnabledFor(logging.INFO):
        # One line, stable wording (docs/operations.md): why this call was not sent.
        logger.info(
            "refused at dispatch: task=%s lock=%s holder=%s state=%s",
            task.name,
            lock_name,
            holder or "-",
            holder_state(held),
        )
    if opts.on_duplicate != "raise" and holder is not None:
        return task.AsyncResult(holder)
    raise DuplicateTaskError(
        f"{task.name} {opts.mode.refused_because()} for {lock_name!r}"
        + (f" as task {holder}" if holder else " (holder unknown)"),
        name=lock_name,
        key=held.key,
        task_id=holder,
    )
