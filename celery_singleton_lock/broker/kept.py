"""An attached call's message as kept beside its holder's lock, and sent again through its
task's own ``apply_async`` once the holder is gone, as Celery's retry sends a request again.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from celery.app.task import Context
from kombu.exceptions import ContentDisallowed, DecodeError
from kombu.serialization import dumps as serialize
from kombu.serialization import loads as deserialize
from kombu.serialization import prepare_accept_content, registry
from kombu.utils.json import dumps, loads

from ..config.options import is_singleton
from ..config.stores import LockStores
from ..tokens import (
    ANSWER_HEADER,
    BYPASS_OPTION,
    CALL_HEADERS,
    HOLD_HEADER,
    NAME_HEADER,
    RATE_SLOT_HEADER,
    TOKEN_HEADER,
    carried_headers,
)
from .connection import publishing
from .in_transit import InTransit

if TYPE_CHECKING:
    from celery import Celery, Task

logger = logging.getLogger(__name__)

# What Celery hands a producer's ``publish`` that is not kept: how to send now, not what.
_NOT_KEPT = frozenset({
    "serializer", "declare", "timeout", "confirm_timeout", "mandatory", "immediate",
})  # fmt: skip

# What a kept message's publish said that its request is made again from (its delivery,
# its reply), or that Celery works out again as it sends it (the expiration of its expires).
_REBUILT = frozenset({
    "exchange", "routing_key", "priority", "correlation_id", "reply_to", "expiration",
})  # fmt: skip

# The library's headers a kept call is sent again with as its own: Celery's copy of a
# request's headers keeps them, but a publish drops those it did not set itself.
_PASSED_ON = (NAME_HEADER, TOKEN_HEADER, HOLD_HEADER, RATE_SLOT_HEADER, *CALL_HEADERS)


def kept_message(body: object, publish: Mapping[str, object]) -> bytes | None:
    """A message as Celery publishes it (``producer.publish(body, **publish)``), kept to be
    sent again as it was: its body serialized as it would be, its headers, properties,
    exchange and routing key. None: something in it cannot be kept (it is then sent as a
    canvas member was before attach, without a hold)."""
    options = {name: value for name, value in publish.items() if name not in _NOT_KEPT}
    exchange = options.get("exchange")
    if exchange is not None and not isinstance(exchange, str):
        options["exchange"] = getattr(exchange, "name", "")
    try:
        serializer = publish.get("serializer")
        content_type, content_encoding, data = serialize(body, serializer=serializer)
        if isinstance(data, str):
            data = data.encode(content_encoding or "utf-8")
        kept = {
            "body": base64.b64encode(data).decode(),
            "content_type": content_type,
            "content_encoding": content_encoding,
            "publish": options,
        }
        encoded: str = dumps(kept)
        return encoded.encode()
    except (TypeError, ValueError) as error:
        logger.debug("a canvas member's message not kept (%s): sent without a hold", error)
        return None


def send_kept(app: Celery, record: bytes, *, holder: str | None) -> None:
    """Send a kept message again through its task's ``apply_async``, as Celery's retry
    sends a request again (``signature_from_request``): its task id, arguments, chain,
    links, chord, group and route as kept, and Celery's publish signals and checks on the
    way. With ``holder``'s task id, for its run to end with that call's outcome
    (``run.answered``), and without its hold (the key is another's now); or, ``holder``
    None, promoted, with the hold it took (``Promotion``). The publish notes it in transit
    on a Redis broker, as every resend of a singleton call is (``broker.transit``).

    A task this process does not know (a worker that does not import it), a message it
    cannot read back, or one Celery's checks refuse, is published as it was kept."""
    kept = loads(record)
    options = dict(kept["publish"])
    headers = dict(options.pop("headers", None) or {})
    # The library's own headers go as the resend's own: Celery's copy drops them.
    own = {name: headers[name] for name in _PASSED_ON if name in headers}
    if holder is not None:
        for name in (TOKEN_HEADER, HOLD_HEADER):
            headers.pop(name, None)
            own.pop(name, None)
        headers[ANSWER_HEADER] = own[ANSWER_HEADER] = holder
    task = app.tasks.get(str(headers.get("task") or ""))
    request = _request_of(app, kept, headers, options) if is_singleton(task) else None
    if task is None or request is None:
        logger.debug(
            "attached call %s sent as kept: its task %s is not a singleton task here",
            headers.get("id"),
            headers.get("task"),
        )
        _publish_as_kept(app, task, kept, headers, options)
        return
    again = {name: value for name, value in options.items() if name not in _REBUILT}
    serializer = registry.type_to_name.get(kept["content_type"])
    if serializer is not None:
        again["serializer"] = serializer
    if request.eta:
        again["eta"] = request.eta
    signature = task.signature_from_request(
        request, headers=carried_headers(request.headers), **again
    )
    try:
        signature.apply_async(**{BYPASS_OPTION: own})
    except (TypeError, ValueError) as error:
        # Refused by Celery's checks as it builds the message (arguments the task no
        # longer takes after a deploy, say): kept for ever, its canvas would never go on;
        # sent as kept, its run fails where its links and chord see it.
        logger.warning(
            "celery-singleton-lock: attached call %s refused by apply_async (%s): sent as kept",
            headers.get("id"),
            error,
        )
        _publish_as_kept(app, task, kept, headers, options)


def _request_of(
    app: Celery,
    kept: Mapping[str, object],
    headers: dict[str, object],
    options: Mapping[str, object],
) -> Context | None:
    """The request a worker would make of the kept message (Celery's protocol 2): its
    headers, its body's arguments and canvas, its delivery; None where it cannot be read
    back (another protocol, a content type the app does not accept)."""
    try:
        body = deserialize(
            base64.b64decode(str(kept["body"])),
            str(kept["content_type"]),
            str(kept["content_encoding"]),
            accept=prepare_accept_content(app.conf.accept_content),
        )
    except (ContentDisallowed, DecodeError, ValueError) as error:
        logger.debug("a kept message not read back (%s)", error)
        return None
    if not headers.get("id") or not isinstance(body, (list, tuple)) or len(body) != 3:
        return None
    args, kwargs, embed = body
    delivery = {name: options.get(name) for name in ("exchange", "routing_key", "priority")}
    return Context(
        headers,
        args=args,
        kwargs=kwargs,
        **(embed or {}),
        delivery_info=delivery,
        reply_to=options.get("reply_to"),
        correlation_id=options.get("correlation_id"),
    )


def _publish_as_kept(
    app: Celery,
    task: Task | None,
    kept: Mapping[str, object],
    headers: dict[str, object],
    options: dict[str, object],
) -> None:
    """The kept message published as it was kept, with ``headers``, noted in transit."""
    stores = LockStores.for_app(app)
    context = getattr(task, "singleton_context", None)
    queue_ttl = stores.config.queue_ttl if context is None else context.queue_ttl
    notes = InTransit.sent(stores, queue_ttl, str(headers.get("id") or ""), headers)
    with app.producer_or_acquire() as producer, publishing(producer, notes=notes):
        producer.publish(
            base64.b64decode(str(kept["body"])),
            content_type=kept["content_type"],
            content_encoding=kept["content_encoding"],
            headers=headers,
            **options,
        )


__all__ = ["kept_message", "send_kept"]
