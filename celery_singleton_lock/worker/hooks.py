"""The worker's signal receivers, connected when the first singleton task is defined.

Not at import: a web process that imports the package but defines no singleton task
gets no receivers. Each receiver acts only in a worker (the signals are the worker's).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable

from celery import Task, signals
from celery.concurrency import get_implementation
from celery.worker.control import Panel, inspect_command
from celery.worker.request import Request

from ..broker import on_receipt
from ..broker.attached import AttachSweep, send_at_end
from ..broker.restore import stale_restorer
from ..broker.results import release_not_ridden
from ..broker.sweeper import Sweeper
from ..broker.turn_sweep import TurnSweep, send_turns
from ..config.options import is_singleton
from ..contrib import events
from ..exceptions import SingletonLockError
from ..lease.limits.turns import Waiter
from ..tokens import NAME_HEADER, TOKEN_HEADER, header
from . import receipts
from .childwatch import child_watch
from .reservations import reservations
from .revokes import revoked_windows
from .setupchecks import check_the_ride, check_worker_setup, refuse_bad_settings
from .timers import Paced

logger = logging.getLogger(__name__)

# How often the main process looks for revoked messages it holds a reservation for: a
# revoked ETA message frees its key within this, not at its ETA.
REVOKE_CHECK_INTERVAL = 0.5
# Where this worker serves its metrics, if it does (singleton_lock_metrics_port).
_serving: list[str] = []
# What worker_init found to say (the broker ride's self-check), logged once logging is set up.
_said: list[tuple[int, str]] = []
# What closes the connections this worker's timers use, at shutdown.
_closing: list[Callable[[], None]] = []


def _has_children(pool: object) -> bool:
    """Whether a pool (class, instance or name) runs tasks in child processes.

    Only prefork does; the thread, gevent, eventlet and solo pools report the main
    process or a greenlet's id as the "pid".
    """
    # Here, not at the top: only a worker needs billiard's pool.
    from celery.concurrency.prefork import TaskPool as PreforkPool  # noqa: PLC0415

    if not isinstance(pool, type):
        if not isinstance(pool, str):
            return isinstance(pool, PreforkPool)
        try:
            pool = get_implementation(pool)
        except (KeyError, ImportError, AttributeError):
            return False
    return isinstance(pool, type) and issubclass(pool, PreforkPool)


def _at_worker_init(sender: object = None, **_: object) -> None:
    """Before the worker consumes: stop on bad settings, learn whether it has children."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    refuse_bad_settings(app)
    child_watch.enabled = _has_children(getattr(sender, "pool_cls", None))
    hostname = getattr(sender, "hostname", None)
    if isinstance(hostname, str):
        # A received message's take, and its note's clear, ride kombu's unacked bookkeeping.
        on_receipt(app, functools.partial(receipts.riding_calls, app, hostname))
    # Here, before the pool forks: the children inherit the receivers, or the flag that
    # tells them enable_events came (Flower sends it to workers started without -E).
    if getattr(sender, "task_events", False):  # -E, worker_send_task_events
        events.install(app)
    else:
        events.watch_remote(app)
    port = app.conf.get("singleton_lock_metrics_port")
    if port is not None:
        # Here, before the pool forks: the children inherit the multiprocess mode.
        from ..contrib.metrics_server import serve_worker  # noqa: PLC0415  (an optional extra)

        addr = app.conf.get("singleton_lock_metrics_addr") or "127.0.0.1"
        try:
            _serving.append(f"http://{addr}:{serve_worker(port, addr)}/metrics")
        except (SingletonLockError, OSError) as error:  # a bad setting, a port in use
            raise SystemExit(f"celery-singleton-lock: metrics: {error}") from None
    said = check_the_ride(app)  # after the metrics start: its outcome is counted
    if said is not None:
        _said.append(said)


def _at_worker_ready(sender: object = None, **_: object) -> None:
    app = getattr(sender, "app", None)
    if app is None:
        return
    # Again from the pool itself: the receivers may have been connected after worker_init
    # (singleton tasks imported late).
    pool = getattr(sender, "pool", None)
    if pool is not None:
        child_watch.enabled = _has_children(pool)
    for message in check_worker_setup(app):
        logger.warning("celery-singleton-lock: %s", message)
    for url in _serving:  # said here: the worker's logging is not set up at worker_init
        logger.info("celery-singleton-lock metrics on %s", url)
    for level, message in _said:
        logger.log(level, "celery-singleton-lock: %s", message)
    _said.clear()
    timer = getattr(sender, "timer", None)
    if timer is not None:
        follow = functools.partial(events.follow_consumer, sender)
        timer.call_repeatedly(events.REMOTE_CHECK_INTERVAL, follow)
        timer.call_repeatedly(REVOKE_CHECK_INTERVAL, reservations.drop_revoked)
        timer.call_repeatedly(REVOKE_CHECK_INTERVAL, revoked_windows.reopen_revoked)
        # prefork's event loop restores dead workers' unacked messages on a timer; the
        # other pools only when idle (broker/restore.py).
        # The sender is the worker's consumer: its hub is the event loop (None without one).
        restorer = stale_restorer(app) if getattr(sender, "hub", True) is None else None
        if restorer is not None:
            logger.info(
                "celery-singleton-lock: restoring dead workers' unacked messages "
                "every %gs (a pool without an event loop)",
                restorer[0],
            )
            interval, restore, close = restorer
            timer.call_repeatedly(interval, restore)
            _closing.append(close)
        sweep = Sweeper.of(app)
        if sweep is not None:  # messages lost between the broker and a worker
            timer.call_repeatedly(sweep.interval, sweep)
            _closing.append(sweep.close)
        attached = AttachSweep.of(app)
        if attached is not None:  # calls attached to holders that ended
            timer.call_repeatedly(attached.interval, Paced("the attached calls' sweep", attached))
        turns = TurnSweep.of(app)
        if turns is not None:  # a total's slots freed by no run's end (round robin)
            timer.call_repeatedly(turns.INTERVAL, Paced("the waiting rooms' sweep", turns))


def _release_revoked(
    sender: Task | None = None,
    request: Request | None = None,
    terminated: bool = False,
    **_: object,
) -> None:
    """A revoked (or expired) message gives its hold back when the worker drops it, and
    its turn of a total if one was handed to it (sent on its turn, it will never claim
    it): the calls whose turn came instead are sent.

    A terminated running task is handled by ``SingletonRequest.on_failure`` once its
    child is gone.
    """
    if sender is None or not is_singleton(sender) or request is None or terminated:
        return
    store = sender.singleton_context.store
    lock_name, token = header(request, NAME_HEADER), header(request, TOKEN_HEADER)
    revoked_windows.forget(request.id)
    try:
        mode = sender.singleton_options().mode
        # An expired message did no work either: a revoke for reopen_on.
        mode.ended("revoked", store, request)
        # (Celery sends the request's Context here: its attempt is ``retries``)
        ident = Waiter.ident_of(request.id, getattr(request, "retries", 0) or 0)
        forget = functools.partial(mode.forget_turn, store)
        send_turns(sender.app, forget(ident), forget)
        if reservations.drop(request.id, release=True):
            return  # the reservation had replaced the hold: nothing else to give back
        if lock_name and token:
            store.release_token(lock_name, token)
    except SingletonLockError as error:
        logger.warning("revoked %s: release of %s failed (%s)", sender.name, lock_name, error)


def _after_run(
    sender: object = None,
    task_id: str | None = None,
    state: str | None = None,
    **_: object,
) -> None:
    """A run's release that was to ride its result's write, when none was written; then,
    the key free and the outcome stored, the calls attached to the run sent to answer."""
    if isinstance(sender, Task) and task_id is not None:
        release_not_ridden(sender, task_id)
        send_at_end(sender, sender.request, state or "")


def _hand_back_at_shutdown(sender: object = None, **_: object) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        on_receipt(app, None)
    reservations.hand_back()
    while _closing:  # the broker connections the timers used
        with contextlib.suppress(Exception):
            _closing.pop()()


def singleton_stats(state: object = None) -> dict[str, object]:
    """What this library keeps in a worker's main process (``celery inspect singleton_stats``).

    Nothing grows with the number of tasks run: reservations are messages received and
    not yet started, watched children at most the pool's processes.
    """
    return {
        "reservations": len(reservations),
        "watched_children": child_watch.watched(),
        "child_watch": child_watch.enabled,
    }


_RECEIVERS = (
    (signals.worker_init, _at_worker_init),
    (signals.worker_ready, _at_worker_ready),
    (signals.task_revoked, _release_revoked),
    (signals.task_postrun, _after_run),
    (signals.worker_shutdown, _hand_back_at_shutdown),
)


def install() -> None:
    """Connect the receivers (idempotent: each once, by its dispatch uid)."""
    for signal, receiver in _RECEIVERS:
        signal.connect(
            receiver, weak=False, dispatch_uid=f"celery_singleton_lock.{receiver.__name__}"
        )
    if "singleton_stats" not in Panel.data:
        inspect_command(name="singleton_stats")(singleton_stats)
