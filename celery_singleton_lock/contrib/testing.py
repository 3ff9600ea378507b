"""Helpers for testing your own singleton tasks: hold a call's lock, list, clear and assert.

They work on the task's own app and lock store: ``memory://`` for eager tests
(``task_always_eager``) and Celery's in-process ``celery_worker`` fixture, or a real Redis.
The pytest plugin (``contrib.pytest_plugin``) wraps them in fixtures; all work without pytest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from celery import current_app

from ..config.options import is_singleton
from ..config.stores import LockStores
from ..exceptions import ConfigurationError
from ..lease import Contended, Lease, LockStore, ManualClock, MemoryLock
from ..tokens import running_token
from .locks import LockRow, app_rows, release

if TYPE_CHECKING:
    from celery import Celery

    from ..config.options import SingletonOptions
    from ..task import SingletonTask


HOLDER_WORKER = "testing@celery-singleton-lock"


@dataclass
class HeldCall:
    """What ``hold`` took: the fake holder's task id and its leases."""

    task_id: str
    name: str  # the call's lock name
    leases: list[Lease] = field(default_factory=list)


def _store(app: Celery | None = None) -> LockStore:
    return LockStores.for_app(app or current_app).lock


def _call(
    task: SingletonTask, args: tuple[object, ...], kwargs: dict[str, object]
) -> tuple[SingletonOptions, str]:
    if not is_singleton(task):
        raise TypeError(f"{task!r} is not a singleton task (use @singleton_task or SingletonTask)")
    opts = task.singleton_options()
    return opts, opts.key.derive(args, kwargs)


@contextmanager
def hold(task: SingletonTask, *args: object, **kwargs: object) -> Iterator[HeldCall]:
    """Hold the lock of ``task(*args, **kwargs)`` as a running copy on another worker would.

    A dispatch of that call is then refused (``lock="until_executed"``, the default,
    returns the holder's ``AsyncResult``; ``on_duplicate="raise"`` raises), and an
    execution meets it (``on_contention``). With ``throttle=`` the window is held; with
    ``limit=N`` every slot is. Released on exit.

        with hold(send_invoice, 42) as holder:      # as if another worker ran it
            result = send_invoice.delay(42)
            assert result.id == holder.task_id       # refused: the holder's id comes back
    """
    opts, name = _call(task, args, kwargs)
    store = _store(task.app)
    held = HeldCall(task_id=f"held-{uuid.uuid4()}", name=name)
    token = running_token(held.task_id, HOLDER_WORKER, 0)
    names = opts.mode.held_by_a_run(name)
    try:
        for each in names:
            lease = store.try_acquire(each, task.singleton_context.ttl, token=token)
            if isinstance(lease, Contended):
                raise AssertionError(f"hold: {each!r} is already held by {lease.holder!r}")  # noqa: TRY004  (a test helper fails as an assertion)
            held.leases.append(lease)
        yield held
    finally:
        for lease in held.leases:
            store.release(lease)


@contextmanager
def manual_clock(app: Celery | None = None) -> Iterator[ManualClock]:
    """Let the app's ``memory://`` locks count time only as the test says: yields a
    ``ManualClock`` whose ``advance(seconds)`` runs ttls out, ends throttle windows and
    brings rate slots due at once; an eager call waiting for its slot moves it itself.
    The machine's clock again on exit, ahead by the time advanced (the locks taken
    meanwhile were counted on it).

        with manual_clock() as clock:               # memory:// counts time when told
            clock.advance(60)                       # ttls, windows and rate slots: a minute on
    """
    store = _store(app)
    if not isinstance(store, MemoryLock):
        raise ConfigurationError(
            f"manual_clock needs the memory store (singleton_lock_url = 'memory://'), not "
            f"{store!r}: a Redis server counts its ttls in real time"
        )
    saved = store.clock
    store.clock = clock = ManualClock()
    try:
        yield clock
    finally:
        store.clock = saved.later(clock.moved)


def held_locks(app: Celery | None = None) -> list[LockRow]:
    """Every lock held in the app's store, as ``celery singleton list`` shows them."""
    app = app or current_app
    return list(app_rows(app, _store(app)))


def clear_locks(app: Celery | None = None) -> int:
    """Release every lock in the app's store (owner-checked, one by one); how many."""
    store = _store(app)
    freed = 0
    for row in held_locks(app):
        freed += int(release(store, row))
    return freed


def assert_refused(task: SingletonTask, *args: object, **kwargs: object) -> None:
    """Fail unless a dispatch of ``task(*args, **kwargs)`` would be refused now."""
    opts, name = _call(task, args, kwargs)
    target = opts.mode.hold_name(name)
    if target is None:
        raise AssertionError(f"{task.name} never refuses at dispatch (limit= or dedupe=False)")
    if _store(task.app).holder(target) is None:
        raise AssertionError(
            f"a call of {task.name} with these arguments would be accepted: {target!r} is "
            f"free (held: {[row.name for row in held_locks(task.app)]})"
        )


def assert_locked(task: SingletonTask, *args: object, **kwargs: object) -> None:
    """Fail unless the lock of ``task(*args, **kwargs)`` is held now (queued, reserved
    or running; with ``limit=N``, at least one slot)."""
    opts, name = _call(task, args, kwargs)
    store = _store(task.app)
    if all(store.holder(each) is None for each in opts.mode.running_names(name)):
        raise AssertionError(
            f"{task.name}: {name!r} is not locked "
            f"(held: {[row.name for row in held_locks(task.app)]})"
        )
