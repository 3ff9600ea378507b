"""An attached call's message as kept beside its holder's lock, and the sweep on the worker's
timer that sends it once the holder is gone: to be answered with the holder's outcome, or
run as a call of its own when the holder ended without one.
"""

from __future__ import annotations

import base64
import logging
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from billiard.exceptions import WorkerLostError
from celery import states
from kombu.serialization import dumps as serialize
from kombu.utils.json import dumps, loads

from ..config.stores import LockStores
from ..exceptions import SingletonLockError
from ..lease.attachments import Attachments, Waiting, attachments_of
from ..tokens import ANSWER_HEADER, HOLD_HEADER, TOKEN_HEADER, holder_task_id

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

# What Celery hands a producer's ``publish`` that is not kept: how to send now, not what.
_NOT_KEPT = frozenset({
    "serializer", "declare", "timeout", "confirm_timeout", "mandatory", "immediate",
})  # fmt: skip


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


def send_kept(app: Celery, record: bytes, *, holder: str) -> None:
    """Send a kept message as it was, without its hold (the key is another's now), with
    its holder's task id for the run to answer from (``run.answered``)."""
    kept = loads(record)
    options = dict(kept["publish"])
    headers = dict(options.pop("headers", None) or {})
    for name in (TOKEN_HEADER, HOLD_HEADER):
        headers.pop(name, None)
    headers[ANSWER_HEADER] = holder
    body = base64.b64decode(kept["body"])
    with app.producer_or_acquire() as producer:
        producer.publish(
            body,
            content_type=kept["content_type"],
            content_encoding=kept["content_encoding"],
            headers=headers,
            **options,
        )


def holders_outcome(backend: object, holder: str) -> tuple[str, object] | None:
    """(SUCCESS or FAILURE, its value or exception) as ``holder``'s run stored it, for its
    attached calls to end with; None where it left no outcome: nothing stored yet, a
    revoke, an ``Ignore``, or a pool child killed under it (Celery stores that as a
    FAILURE, ``WorkerLostError``, though the work never ended)."""
    meta = backend.get_task_meta(holder)  # type: ignore[attr-defined]
    status, result = meta.get("status"), meta.get("result")
    if status == states.SUCCESS:
        return status, result
    if status == states.FAILURE and isinstance(result, BaseException):
        return None if isinstance(result, WorkerLostError) else (status, result)
    return None


class AttachSweep:
    """Every ``INTERVAL`` s on a worker's timer: the calls attached to holders that no
    longer hold their key are claimed and sent (``send_kept``), to be answered with the
    holder's stored outcome, or run as calls of their own where it left none.

    A holder whose outcome is not stored yet may still be writing it (a run with a chain
    releases its key before Celery stores its result): its calls wait ``GRACE`` s for it.
    A claim lasts ``CLAIM`` s: a worker killed while sending leaves its claims to another
    sweep, so none is lost (one sent twice then is run twice, as a redelivery is).
    """

    INTERVAL = 0.5
    GRACE = 3.0
    CLAIM = 60.0
    LIMIT = 100

    def __init__(self, app: Celery) -> None:
        self.app = app
        # (name, task id) -> when this sweep first saw its holder gone with no outcome
        self._gone: dict[tuple[str, str], float] = {}

    @classmethod
    def of(cls, app: Celery) -> AttachSweep | None:
        """A worker's sweep; None where no call attaches (a store in memory, a Redlock,
        a Cluster)."""
        return cls(app) if attachments_of(LockStores.for_app(app).lock) is not None else None

    def __call__(self) -> None:
        attachments = attachments_of(LockStores.for_app(self.app).lock)
        if attachments is None:
            return
        if len(self._gone) > 100 * self.LIMIT:  # calls another worker's sweep sent
            self._gone.clear()
        try:
            names = attachments.due_names(self.LIMIT)
            outcomes: dict[str, bool] = {}
            for name in names:
                self._sweep(attachments, name, outcomes)
        except SingletonLockError as error:  # the next sweep tries again
            logger.warning("celery-singleton-lock: attached calls not swept (%s)", error)

    def _sweep(self, attachments: Attachments, name: str, outcomes: dict[str, bool]) -> None:
        current, waiting = attachments.listed(name)
        live = holder_task_id(current) if current else None
        now = time.monotonic()
        due: list[str] = []
        for call in waiting:
            seen = (name, call.task_id)
            if call.holder == live:
                self._gone.pop(seen, None)
                continue
            if call.holder not in outcomes:
                outcomes[call.holder] = self._has_outcome(call.holder)
            if outcomes[call.holder] or now - self._gone.setdefault(seen, now) >= self.GRACE:
                due.append(call.task_id)
        if not due and waiting:
            return
        claim = secrets.token_hex(8)
        claimed = attachments.claim(name, due, claim=claim, for_s=self.CLAIM, look_in=self.INTERVAL)
        sent = [call.task_id for call in claimed if self._send(name, call)]
        if sent:
            attachments.finished(name, claim, sent)

    def _has_outcome(self, holder: str) -> bool:
        """Whether ``holder``'s run stored an outcome its attached calls answer with."""
        try:
            return holders_outcome(self.app.backend, holder) is not None
        except Exception as error:  # any backend's error: looked at again next sweep
            logger.warning("celery-singleton-lock: result of %s not read (%s)", holder, error)
            return False

    def _send(self, name: str, call: Waiting) -> bool:
        try:
            send_kept(self.app, call.record, holder=call.holder)
        except Exception:
            # Its claim runs out and a later sweep sends it.
            logger.exception("celery-singleton-lock: attached call %s not sent", call.task_id)
            return False
        self._gone.pop((name, call.task_id), None)
        logger.info(
            "attached call sent at its holder's end: lock=%s task_id=%s holder=%s",
            name,
            call.task_id,
            call.holder,
        )
        return True


__all__ = ["AttachSweep", "holders_outcome", "kept_message", "send_kept"]
