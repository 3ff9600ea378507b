"""The decisions as Celery events where Celery sends its own (Flower, ``celery events``).

A worker sending task events (``-E``) sends each of ``DECISIONS``, a producer with
``task_send_sent_event`` its refusals, through Celery's own dispatcher. Otherwise a worker
has no receiver, and a producer's asks the setting (kept a second): nothing is built.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable

from celery import Celery
from celery.utils import uuid

from .decisions import DECISIONS, Told

logger = logging.getLogger(__name__)

# Whether this process is a worker sending task events (its pool children inherit it).
_worker: list[bool] = [False]

# How long a producer keeps its answer to ``task_send_sent_event`` (a change made at run
# time is followed within this): read through Celery's chain of maps, the setting costs a
# refused call more than the rest of its events-off path together (the bench's section 2).
SETTING_KEPT_SECONDS = 1.0
# Per app: when its answer was read, and the answer.
_sent_events: weakref.WeakKeyDictionary[Celery, tuple[float, bool]] = weakref.WeakKeyDictionary()


def install(*, worker: bool = False) -> None:
    """Connect the receivers: a producer's refusals (each checks ``task_send_sent_event``
    when it is made), and with ``worker`` every decision. Idempotent."""
    if worker:
        _worker[0] = True
    for told in DECISIONS:
        if worker or told.at_dispatch:
            told.signal.connect(_receiver(told), weak=False, dispatch_uid=_uid(told))


def uninstall() -> None:
    """Disconnect every receiver ``install`` connected (the bench measures without them)."""
    _worker[0] = False
    for told in DECISIONS:
        told.signal.disconnect(dispatch_uid=_uid(told))


def _uid(told: Told) -> str:
    return f"celery_singleton_lock.event.{told.what}"


def _receiver(told: Told) -> Callable[..., None]:
    def receive(sender: object = None, **sent: object) -> None:
        app = getattr(sender, "app", None)
        if not isinstance(app, Celery) or not getattr(sender, "send_events", True):
            return  # a task that opted out of events (Celery's ``Task.send_events``)
        if not (_worker[0] or (told.at_dispatch and sends_sent_events(app))):
            return
        fields = told.fields(sent)
        if fields is not None:
            send(app, told, fields, getattr(sender, "name", None), _hostname(sender))

    return receive


def sends_sent_events(app: Celery) -> bool:
    """``task_send_sent_event``, as Celery reads it for each call it sends, kept
    ``SETTING_KEPT_SECONDS``."""
    now = time.monotonic()
    kept = _sent_events.get(app)
    if kept is not None and now - kept[0] < SETTING_KEPT_SECONDS:
        return kept[1]
    on = bool(app.conf.task_send_sent_event)
    _sent_events[app] = (now, on)
    return on


def _hostname(sender: object) -> str | None:
    """The worker's node name in a run (Flower files the event under it), else Celery's."""
    request = getattr(sender, "request", None)
    hostname = getattr(request, "hostname", None)
    return hostname if isinstance(hostname, str) else None


def send(
    app: Celery, told: Told, fields: dict[str, object], task: object, host: str | None
) -> None:
    """Send one decision's event (``singleton-...``, and its ``task-singleton-...`` twin for
    Celery's own state): its fields, the task's ``name``, and its words as ``result``
    (Celery's state, Flower's, shows the call's result: this until the call ends)."""
    said = {k: v for k, v in fields.items() if k != "reason" and v is not None}
    # A call refused before it was given an id (a storm's early answer) gets one here.
    said.setdefault("uuid", uuid())
    said.update(name=task, result=fields.get("reason"))
    try:
        with app.events.default_dispatcher(hostname=host) as dispatcher:
            for event_type in (told.event_type, told.task_event_type):
                dispatcher.send(
                    event_type,
                    retry=True,
                    retry_policy=app.conf.task_publish_retry_policy,
                    **said,
                )
    except Exception as error:  # a broker hiccup: a monitor's event never stops a call
        logger.warning("celery-singleton-lock: %s event not sent (%s)", told.event_type, error)
