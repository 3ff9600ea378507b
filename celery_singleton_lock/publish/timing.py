"""A call's countdown, eta and expires refused as Celery refuses them, before anything is
held; a delay of the library's own made one the broker's native delay accepts.

The library changes delays before Celery sees them (hops, a rate's slot, a debounce) and
takes holds, places and slots first: what Celery would refuse is refused before all that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from celery.app.task import extract_exec_options
from celery.utils.time import maybe_make_aware

from ..config.visibility import has_quorum_queues

if TYPE_CHECKING:
    from celery import Task

# RabbitMQ's delay exchanges count whole seconds (kombu's ``calculate_routing_key``): Celery
# refuses a countdown between 0 and 1 there, so a delay of ours is never shorter.
NATIVE_DELAY_FLOOR = 1.0

# Celery's id for a message it only checks: nothing is published under it.
_CHECKED_ONLY = "celery-singleton-lock-check"


def delay_of(options: Mapping[str, object]) -> float:
    """Seconds until an ETA/countdown task may run, so its hold outlives the wait."""
    countdown = options.get("countdown")
    if isinstance(countdown, (int, float)) and countdown:
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if isinstance(eta, str):
        eta = datetime.fromisoformat(eta)
    if not isinstance(eta, datetime):
        return 0.0  # none (or not a time: Celery refuses it as it builds the message)
    now = datetime.now(eta.tzinfo or UTC) if eta.tzinfo else datetime.now()
    return max(0.0, (eta - now).total_seconds())


def refuse_as_celery(
    task: Task, call: tuple[Sequence[object], Mapping[str, object]], options: Mapping[str, object]
) -> None:
    """Raise what Celery's ``apply_async`` raises for this call's ``countdown``, ``eta`` or
    ``expires`` (``OverflowError`` for ``countdown=inf``, kombu's ``ValueError`` for a
    sub-second countdown on a queue RabbitMQ delays natively, ...), before anything is held;
    nothing for a call without them, or run eagerly (Celery reads none of them then)."""
    countdown, eta = options.get("countdown"), options.get("eta")
    expires = options.get("expires", task.expires)  # the task's own, as Celery merges it
    if countdown is None and eta is None and expires is None:
        return
    app = task.app
    if app.conf.task_always_eager:
        return
    # Celery's own checks, in its order: the native delay's, then the message's.
    if (countdown or eta) and delays_natively(task, call, options):
        # (Only reached on Celery 5.5+, whose kombu has the module.)
        from kombu.transport.native_delayed_delivery import calculate_routing_key  # noqa: PLC0415

        if eta:
            seconds = (_aware(eta) - _aware(app.now())).total_seconds()
        else:
            seconds = countdown if isinstance(countdown, int | float) else 0
        if seconds > 0:  # as Celery's send_task reads it
            calculate_routing_key(int(seconds), "checked")
    app.amqp.as_task_v2(
        _CHECKED_ONLY, task.name, countdown=countdown, eta=eta, expires=expires,
        origin=_CHECKED_ONLY,
    )  # fmt: skip


def deliverable(
    task: Task, call: tuple[Sequence[object], Mapping[str, object]], options: dict[str, object]
) -> None:
    """A delay of the library's (a backoff, a slot's wait, a hop) shorter than a second,
    made one second where RabbitMQ delays the message natively: it still runs at or after
    its time, which the worker keeps by the message's eta. An ``eta`` that close is made a
    countdown there, so the moments Celery takes to send it cannot bring it under one."""
    countdown, eta = options.get("countdown"), options.get("eta")
    near = eta is not None and countdown is None
    short = isinstance(countdown, int | float) and 0 < countdown < NATIVE_DELAY_FLOOR
    if not (near or short) or not delays_natively(task, call, options):
        return
    if near:
        left = (_aware(eta) - _aware(task.app.now())).total_seconds()
        if not 0 < left < 2 * NATIVE_DELAY_FLOOR:
            return
        options.pop("eta")
        options["countdown"] = max(NATIVE_DELAY_FLOOR, left)
    else:
        options["countdown"] = NATIVE_DELAY_FLOOR


def delays_natively(
    task: Task, call: tuple[Sequence[object], Mapping[str, object]], options: Mapping[str, object]
) -> bool:
    """Whether Celery sends this call's countdown through RabbitMQ's delay exchanges: a
    RabbitMQ broker with a quorum queue, and the call routed (as Celery routes it: the
    task's own options under the call's) to an exchange that is not direct."""
    app = task.app
    if not has_quorum_queues(app):
        return False
    args, kwargs = call
    merged = {**extract_exec_options(task), **options}
    routed = app.amqp.router.route(merged, task.name, args, kwargs, task)
    queue = routed.get("queue")
    exchange_type = queue.exchange.type if queue else routed.get("exchange_type")
    return bool(exchange_type != "direct")


def _aware(moment: object) -> datetime:
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    aware: datetime = maybe_make_aware(moment)
    return aware
