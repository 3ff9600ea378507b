"""A call's countdown, eta and expires refused as Celery refuses them, before anything is
held; a delay of the library's own made one the broker's native delay accepts.

The library changes delays before Celery sees them (hops, a rate's slot, a debounce) and
takes holds, places and slots first: what Celery would refuse is refused before all that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from celery.utils.time import maybe_make_aware

try:  # Celery 5.5+: countdowns on quorum queues go through RabbitMQ's delay exchanges
    from celery.utils.quorum_queues import detect_quorum_queues
except ImportError:  # pragma: no cover  (Celery 5.3 and 5.4: no native delayed delivery)

    def detect_quorum_queues(app: Celery, driver_type: str) -> tuple[bool, str]:
        return False, ""


if TYPE_CHECKING:
    from celery import Celery

# RabbitMQ's delay exchanges count whole seconds (kombu's ``calculate_routing_key``): Celery
# refuses a countdown between 0 and 1 there, so a delay of ours is never shorter.
NATIVE_DELAY_FLOOR = 1.0

# Celery's id for a message it only checks: nothing is published under it.
_CHECKED_ONLY = "celery-singleton-lock-check"


def refuse_as_celery(
    app: Celery,
    name: str,
    call: tuple[Sequence[object], Mapping[str, object]],
    options: Mapping[str, object],
) -> None:
    """Raise what Celery's ``apply_async`` raises for this call's ``countdown``, ``eta`` or
    ``expires`` (``OverflowError`` for ``countdown=inf``, kombu's ``ValueError`` for a
    sub-second countdown on a queue RabbitMQ delays natively, ...), before anything is held;
    nothing for a call without them."""
    countdown, eta, expires = options.get("countdown"), options.get("eta"), options.get("expires")
    if countdown is None and eta is None and expires is None:
        return
    # Celery's own conversions, as it makes the message (its arguments are not needed).
    app.amqp.as_task_v2(
        _CHECKED_ONLY, name, countdown=countdown, eta=eta, expires=expires, origin=_CHECKED_ONLY
    )
    if not (countdown or eta) or not delays_natively(app, name, call, options):
        return
    # (Only reached on Celery 5.5+, whose kombu has the module.)
    from kombu.transport.native_delayed_delivery import calculate_routing_key  # noqa: PLC0415

    if eta:
        seconds = (_aware(eta) - _aware(app.now())).total_seconds()
    elif isinstance(countdown, int | float):
        seconds = countdown
    else:
        return
    if seconds > 0:  # as Celery's send_task reads it
        calculate_routing_key(int(seconds), "checked")


def deliverable(
    app: Celery,
    name: str,
    call: tuple[Sequence[object], Mapping[str, object]],
    options: dict[str, object],
) -> None:
    """A countdown of the library's (a backoff, a slot's wait, a hop) shorter than a
    second, made one second where RabbitMQ delays the message natively: it still runs at
    or after its time, which the worker keeps by the message's eta."""
    countdown = options.get("countdown")
    if (
        isinstance(countdown, int | float)
        and 0 < countdown < NATIVE_DELAY_FLOOR
        and delays_natively(app, name, call, options)
    ):
        options["countdown"] = NATIVE_DELAY_FLOOR


def delays_natively(
    app: Celery,
    name: str,
    call: tuple[Sequence[object], Mapping[str, object]],
    options: Mapping[str, object],
) -> bool:
    """Whether Celery sends this call's countdown through RabbitMQ's delay exchanges: a
    RabbitMQ broker with a quorum queue, and the call routed to an exchange that is not
    direct (the rule of Celery's ``send_task``)."""
    driver = app.producer_pool.connections.connection.transport.driver_type
    if not detect_quorum_queues(app, driver)[0]:
        return False
    args, kwargs = call
    routed = app.amqp.router.route(dict(options), name, args, kwargs)
    queue = routed.get("queue")
    exchange_type = queue.exchange.type if queue else routed.get("exchange_type")
    return bool(exchange_type != "direct")


def _aware(moment: object) -> datetime:
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    aware: datetime = maybe_make_aware(moment)
    return aware
