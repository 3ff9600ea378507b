"""The decisions as Celery events where Celery sends its own (Flower, ``celery events``).

A worker sending task events (``-E``, or ``enable_events`` as Flower sends it) sends each
of ``DECISIONS``, a producer with ``task_send_sent_event`` its refusals, through Celery's
own dispatcher. Otherwise no receiver is connected: a refusal pays nothing for events.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from celery import Celery
from celery.utils import uuid

from .decisions import DECISIONS, Told

logger = logging.getLogger(__name__)

# The apps this process is a worker of that send task events (its pool children inherit
# them); another app in the process sends only what its own settings say.
_workers: weakref.WeakSet[Celery] = weakref.WeakSet()

# The apps whose producers send their refusals: ``task_send_sent_event`` as it was when
# each singleton task was bound, or when ``follow`` read it again.
_sending: weakref.WeakSet[Celery] = weakref.WeakSet()


def install(app: Celery) -> None:
    """A worker's receivers (``app``'s worker sends task events): every decision of
    ``app``'s tasks. Idempotent."""
    _workers.add(app)
    _connect(DECISIONS)


@dataclass
class _Remote:
    """A worker started without ``-E``: whether Celery's ``enable_events`` (Flower sends it
    every few seconds) has its task events on now, in memory its pool processes share."""

    app: Celery
    on: ctypes.c_bool

    def follow(self) -> None:
        """This process's receivers as ``on`` says (connected once, not per run)."""
        on = bool(self.on.value)
        if on != (self.app in _workers):
            if on:
                _workers.add(self.app)
            else:
                _workers.discard(self.app)
            _reconnect()


# Set as a worker without -E starts (before its pool forks): each process reads it.
_remote: list[_Remote] = []

# How often a worker's main process reads its consumer's event dispatcher.
REMOTE_CHECK_INTERVAL = 1.0


def watch_remote(app: Celery) -> None:
    """A worker of ``app`` started without ``-E``, before its pool forks: its decisions
    are sent while ``enable_events`` has its task events on (``follow_consumer``)."""
    _remote[:] = [_Remote(app, multiprocessing.RawValue(ctypes.c_bool, False))]


def follow_consumer(consumer: object) -> None:
    """Every ``REMOTE_CHECK_INTERVAL`` s in a worker's main process: whether its consumer's
    event dispatcher sends Celery's task group now (``enable_events`` adds it, and
    ``disable_events`` takes it away), told to its pool processes."""
    if not _remote:
        return
    dispatcher = getattr(consumer, "event_dispatcher", None)
    groups = getattr(dispatcher, "groups", None)
    on = bool(getattr(dispatcher, "enabled", False)) and (not groups or "task" in groups)
    remote = _remote[0]
    if on != bool(remote.on.value):
        remote.on.value = on
        logger.info(
            "celery-singleton-lock: task events %s by remote: the library's decisions %s",
            "enabled" if on else "disabled",
            "are sent as events too" if on else "are no longer sent",
        )
    remote.follow()


def follow_remote() -> None:
    """As a run starts (in a pool process as in the main one): the receivers connected
    or not as the worker's ``enable_events`` / ``disable_events`` last said."""
    if _remote:
        _remote[0].follow()


def follow(app: Celery) -> bool:
    """Read ``app.conf.task_send_sent_event`` and connect the producer's receivers while
    any app sends: each singleton task's binding does, and a producer that changes the
    setting at run time calls it then (Celery's settings tell no one of a change).
    Returns whether ``app`` sends its refusals."""
    if app.conf.task_send_sent_event:
        _sending.add(app)
        _connect(told for told in DECISIONS if told.at_dispatch)
        return True
    _sending.discard(app)
    _reconnect()
    return False


def _reconnect() -> None:
    """Every decision's receiver while an app's worker sends events, else the dispatch
    ones while an app's producer does, else none."""
    _disconnect()
    if _workers:
        _connect(DECISIONS)
    elif _sending:
        _connect(told for told in DECISIONS if told.at_dispatch)


def uninstall() -> None:
    """Disconnect every receiver connected here (the bench measures without them)."""
    _workers.clear()
    _sending.clear()
    _remote.clear()
    _disconnect()


def _connect(told_all: Iterable[Told]) -> None:
    for told in told_all:
        told.signal.connect(_receiver(told), weak=False, dispatch_uid=_uid(told))


def _disconnect() -> None:
    for told in DECISIONS:
        told.signal.disconnect(dispatch_uid=_uid(told))


def _uid(told: Told) -> str:
    return f"celery_singleton_lock.event.{told.what}"


def _receiver(told: Told) -> Callable[..., None]:
    def receive(sender: object = None, **sent: object) -> None:
        app = getattr(sender, "app", None)
        if not isinstance(app, Celery) or not getattr(sender, "send_events", True):
            return  # a task that opted out of events (Celery's ``Task.send_events``)
        if not (app in _workers or (told.at_dispatch and app in _sending)):
            return  # another app's decision, in a process where one app sends
        fields = told.fields(sent)
        if fields is not None:
            send(app, told, fields, getattr(sender, "name", None), _hostname(sender, sent))

    return receive


def _hostname(sender: object, sent: Mapping[str, object]) -> str | None:
    """The worker's node name in a run (Flower files the event under it), else Celery's:
    as the decision says it (one sent from another thread than the run's) or as the
    run's request has it."""
    hostname = sent.get("hostname") or getattr(getattr(sender, "request", None), "hostname", None)
    return hostname if isinstance(hostname, str) else None


def send(
    app: Celery, told: Told, fields: dict[str, object], task: object, host: str | None
) -> None:
    """Send one decision's event (``singleton-...``, and its twin in Celery's task group for
    Celery's own state: ``Told.task_event_type``): its fields, the task's ``name``, the
    decision as ``singleton``, and its words as ``result`` (Celery's state, Flower's, shows
    the call's result: this until the call ends)."""
    said = {k: v for k, v in fields.items() if k != "reason" and v is not None}
    # A call refused before it was given an id (a storm's early answer) gets one here.
    said.setdefault("uuid", uuid())
    said.update(name=task, singleton=told.what, result=fields.get("reason"))
    twin = told.task_event_type(fields)
    try:
        with app.events.default_dispatcher(hostname=host) as dispatcher:
            for event_type in (told.event_type, twin) if twin else (told.event_type,):
                dispatcher.send(
                    event_type,
                    retry=True,
                    retry_policy=app.conf.task_publish_retry_policy,
                    **said,
                )
    except Exception as error:  # a broker hiccup: a monitor's event never stops a call
        logger.warning("celery-singleton-lock: %s event not sent (%s)", told.event_type, error)
