"""Celery's Redis result backend, sending a finished run's release with its result.

A run whose result is stored on the lock store's Redis server (the default shape: broker,
results and locks on one server) has its release sent in Celery's write of that result:
the lock is free in the same step as the result is visible, at no round trip of its own.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from celery import states
from celery.backends.redis import RedisBackend as CeleryRedisBackend
from celery.backends.redis import SentinelBackend as CelerySentinelBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str

from ..lease import Server, server_of
from ..lease.attachments import attachments_of
from ..lease.history import Record
from . import versions
from .connection import turned_off
from .pushes import pushes_of
from .result_wait import ReadsAgain
from .ride_scripts import STORE_RESULT
from .waiting_release import ByResultKey, WaitingRelease

if TYPE_CHECKING:
    from celery import Celery, Task
    from celery.app.task import Context

    from ..context import TaskContext
    from ..lease import Lease

BACKEND = "celery_singleton_lock.broker:RedisBackend"
SENTINEL_BACKEND = "celery_singleton_lock.broker:SentinelBackend"
# Celery's backend alias -> this module's backend for it.
_REPLACED = {"redis": BACKEND, "rediss": BACKEND, "sentinel": SENTINEL_BACKEND}

# Results larger than this go as Celery sends them, the release on its own: Celery
# checks the size limit of a value before sending, and a huge value is no common case.
RIDING_LIMIT = 1 << 20

# Celery's result write, with the read of the stored result it sends first in its own step;
# its answer when the stored value is not one it can read (Celery's code reads it then).
UNREADABLE = -1
# The largest stored result the script reads (Redis does nothing else meanwhile): a larger
# one is read by Celery's code, on a round trip of its own.
READ_IN_SCRIPT = 64 * 1024


class RedisBackend(ReadsAgain, CeleryRedisBackend):  # type: ignore[misc]  # Celery is untyped
    """Celery's Redis result backend; a result write with a release pending for its
    task (``release_with_result``) sends the release in the same transaction.

    The release is added to the pipeline Celery sends to store the result (``SET`` +
    ``PUBLISH``, in a transaction). Any run whose result is not written (ignored results,
    ``Ignore``, ``Reject``, a result already stored) is released on its own round trip
    when the task's tracer is done (``task_postrun``), so a release is never lost. It
    behaves exactly as Celery's own for every write no release rides. A singleton
    task's STARTED is stored here too, once the run holds its lease (``store_started``).

    Celery reads the stored result before each write, to leave a success as it is. A write
    a release rides reads it in its own step instead (``lua/store_result.lua``):
    the same answer, a round trip fewer."""

    _singleton_server: Server | None = None
    # result key -> the release riding its write, and the lock store's database: filled
    # by a run as its body ends (``ride_release``) and emptied by the write of its
    # result, or failing that at task_postrun (``release_not_ridden``). By result key, as
    # the next table: Celery keeps a backend per thread, or one for every thread with
    # ``result_backend_thread_safe``, and a run's end and its result's write are on the
    # run's own thread.
    _singleton_releases: ByResultKey[WaitingRelease] | None = None
    # result key -> task id, while a write in progress is to read what is stored itself.
    _singleton_unread: ByResultKey[str] | None = None
    # result key -> whether calls are attached, as the write its release rode said.
    _singleton_told: ByResultKey[bool] | None = None

    def server(self) -> Server | None:
        """Where this backend stores results (None: not one standalone server)."""
        if self._singleton_server is None:
            self._singleton_server = server_of(self.client)
        return self._singleton_server

    def on_task_call(self, producer: object, task_id: str) -> dict[str, object]:
        """Subscribe to nothing as a task is sent (Celery subscribes to every sent task's
        result channel, and unsubscribes when its ``AsyncResult`` is dropped: two
        commands per dispatch, kept for ever by a producer that keeps its results).

        Who waits for a result subscribes as it starts to wait (``get``, ``then``,
        ``join_native`` all go through ``add_pending_result``), and then reads the
        stored result: a result written before the subscription is read, one written
        after it is received. Celery's consumer now and then misses a message published
        as it subscribes, so a wait also reads the stored result again once a second
        after its first (``result_wait.ReadsAgain``)."""
        return {}

    def ride_release(self, task_id: str, waiting: WaitingRelease) -> None:
        """Have the write of ``task_id``'s result send ``waiting``'s release in its own
        transaction."""
        # setdefault: made once, whichever thread comes first.
        releases: ByResultKey[WaitingRelease] = self.__dict__.setdefault(
            "_singleton_releases", ByResultKey()
        )
        releases[self.get_key_for_task(task_id)] = waiting

    def attached_told(self, task_id: str) -> bool | None:
        """Whether the write of ``task_id``'s result said calls are attached beside its
        lock (None: it did not say), forgotten as it is asked (``task_postrun``)."""
        told = self._singleton_told
        return None if told is None else told.pop(self.get_key_for_task(task_id))

    def release_not_ridden(self, task_id: str) -> None:
        """A release that did not ride the write of ``task_id``'s result (none was written),
        sent on its own round trip."""
        if self._singleton_releases:
            self._release_alone(self.get_key_for_task(task_id))

    def _release_alone(self, key: object) -> None:
        releases = self._singleton_releases
        pending = None if releases is None else releases.pop(key)
        if pending is not None:
            pending.alone()

    def _store_result(
        self,
        task_id: str,
        result: object,
        state: str,
        traceback: object = None,
        request: object = None,
        **kwargs: object,
    ) -> object:
        """Celery's (``KeyValueStoreBackend._store_result``), but where a run's release
        rides its result's write, the read of the stored result goes in the write's own
        step; every other write reads first on a round trip of its own, as Celery's.

        Only results this backend encodes as JSON; a stored value the script cannot read
        as Celery's JSON (another serializer, compressed, large) is read by Celery's own
        code after all (``_write_as_celery``)."""
        key = self.get_key_for_task(task_id)
        releases = self._singleton_releases
        if not releases or key not in releases or self.serializer != "json":
            return super()._store_result(
                task_id, result, state, traceback=traceback, request=request, **kwargs
            )
        meta = self._get_result_meta(
            result=result, state=state, traceback=traceback, request=request
        )
        meta["task_id"] = bytes_to_str(task_id)
        unread: ByResultKey[str] = self.__dict__.setdefault("_singleton_unread", ByResultKey())
        unread[key] = task_id
        try:
            self._set_with_state(key, self.encode(meta), state)
        except BackendStoreError as error:
            raise BackendStoreError(str(error), state=state, task_id=task_id) from error
        finally:
            unread.pop(key)
        return result

    def _unread(self, key: object) -> str | None:
        """The task id of ``key``'s write in progress when it is to read what is stored
        itself (``_store_result``); None when Celery read it already."""
        unread = self._singleton_unread
        return None if not unread else unread.get(key)

    def _succeeded(self, task_id: str) -> bool:
        """Celery's read: whether a success is stored for ``task_id``."""
        return bool(self._get_task_meta_for(task_id)["status"] == states.SUCCESS)

    def _write_as_celery(self, key: object, value: object, expires: object, task_id: str) -> None:
        """Celery's read of ``task_id``'s stored result, then its write unless a success
        is stored: for a write that was to read in its own step but cannot."""
        if not self._succeeded(task_id):
            self._write(key, value, expires, None)

    def set(self, key: object, value: object, *args: object, **kwargs: object) -> object:
        releases = self._singleton_releases
        if not releases or key not in releases:
            return super().set(key, value, *args, **kwargs)
        if not isinstance(value, str | bytes) or len(value) > RIDING_LIMIT:
            self._release_alone(key)
            task_id = self._unread(key)
            # Celery's read, which its _store_result left to us
            if task_id is not None and self._succeeded(task_id):
                return None
            return super().set(key, value, *args, **kwargs)
        # Celery >= 5.4 passes the result's own expiry (None: the backend's); 5.3 none.
        expires = args[0] if args else kwargs.pop("expires", None)
        return self.ensure(self._set_releasing, (key, value, expires), **kwargs)

    def _set_releasing(self, key: object, value: object, expires: object) -> None:
        if expires is None:
            expires = self.expires
        releases = self._singleton_releases or ByResultKey()
        pending = releases.pop(key)
        task_id = self._unread(key)
        if pending is None and task_id is not None:
            # Celery's retry of a write whose release went on its own meanwhile.
            self._write_as_celery(key, value, expires, task_id)
            return
        try:
            replies = self._write(key, value, expires, pending, reads=task_id is not None)
        except BaseException as error:
            if pending is None or not pending.unsent(error):
                # Nothing was run (the connection broke): Celery's retry policy sends
                # the write again, the release on it; if it gives up, task_postrun
                # releases on a round trip of its own.
                if pending is not None:
                    releases[key] = pending
                raise
            # The server refused the release as it was queued (an ACL user without the
            # lock's keys), which aborted the transaction: the release alone, first (a
            # write that fails now is tried again without it), then the result.
            pending.alone()
            if task_id is None:
                self._write(key, value, expires, None)
            else:
                self._write_as_celery(key, value, expires, task_id)
            return
        if pending is not None:
            told = pending.told(replies)
            if told is not None:
                self.__dict__.setdefault("_singleton_told", ByResultKey())[key] = told
            replies = pending.read(replies)
        if task_id is not None and replies and replies[0] == UNREADABLE:
            # A stored value the script cannot read as Celery's JSON: Celery's read decides.
            self._write_as_celery(key, value, expires, task_id)
            return
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    def _write(
        self,
        key: object,
        value: object,
        expires: object,
        pending: WaitingRelease | None,
        *,
        reads: bool = False,
    ) -> list[object]:
        """Celery's own write (``SETEX`` or ``SET``, then ``PUBLISH``, one transaction),
        with the pending release first in it; with ``reads`` (its read left to it by
        ``_store_result``), a script that reads, writes and publishes."""
        with self.client.pipeline() as pipe:
            if pending is not None:
                pending.add(pipe)
            seconds = getattr(expires, "total_seconds", None)
            ttl = int(seconds()) if seconds else expires
            if pending is not None and reads:
                # The body, not the digest: nothing to load first, nothing lost to NOSCRIPT.
                pipe.eval(STORE_RESULT, 1, key, value, ttl or 0, READ_IN_SCRIPT)
            else:
                if expires:
                    # SETEX as Celery sends it (redis-py 8 warns on its setex method).
                    pipe.execute_command("SETEX", key, ttl, value)
                else:
                    pipe.set(key, value)
                pipe.publish(key, value)
            replies: list[object] = pipe.execute(raise_on_error=pending is None)
            return replies


class SentinelBackend(RedisBackend, CelerySentinelBackend):  # type: ignore[misc]
    """Celery's Sentinel result backend (the master found through its sentinels), with
    the release riding as on ``RedisBackend``: the lock store on the same master."""


def release_with_result(
    task: Task, request: Context, context: TaskContext, lease: Lease, entry: Record | None = None
) -> bool:
    """Whether ``lease``'s release will ride the write of ``request``'s result (True:
    pending until that write, or ``task_postrun``); False: release it now.

    Rides when the result will be stored by this module's backend, on the lock store's
    server as its own ACL user, and nothing runs before that write that could want the
    lock free: a run with callbacks or a chain sends them before its result is stored.
    """
    backend, pushes = task.backend, pushes_of(context.store)
    if (
        not context.stores.config.ride_broker
        or not versions.TESTED_HERE  # a backend named by its path, on another Celery
        or request.is_eager
        or request.callbacks
        or request.chain
        or request.chord
        or task.ignore_result
        or getattr(request, "ignore_result", False)
        or not isinstance(backend, RedisBackend)
        or pushes is None
        or turned_off(task.app) is not None
    ):
        return False
    server = backend.server()
    if server is None or not pushes.server.same_user(server):
        return False
    release = pushes.riding_release(lease, entry=entry)
    if release is None:
        return False
    asks = None  # whether calls are attached: the run's end looks for them only if so
    if context.options.mode.attaches and attachments_of(context.store) is not None:
        asks = (context.store.keys(lease.name).attached, pushes.databases(server.db))
    backend.ride_release(request.id, WaitingRelease(release, server.db, asks))
    return True


def store_started(task: Task, request: Context) -> None:
    """STARTED, as Celery's tracer would have stored it (same meta, same condition), by
    a singleton task once it holds its lease (``SingletonTask.on_bound`` says why)."""
    if task.ignore_result or getattr(request, "ignore_result", False):
        return
    task.backend.store_result(
        request.id,
        {"pid": os.getpid(), "hostname": request.hostname},
        states.STARTED,
        request=request,
    )


def release_not_ridden(task: Task, task_id: str) -> None:
    """At the end of ``task_id``'s trace: a release that rode no result write (no
    result written) is sent on its own round trip."""
    backend = task.backend
    if isinstance(backend, RedisBackend):
        backend.release_not_ridden(task_id)


def missed_ride(app: Celery, store: Server, *, enabled: bool) -> str | None:
    """Why a run of ``app`` releases on a round trip of its own although its results are
    stored on the lock store's server (at ``store``) as its user; None when it rides, is
    turned off, or the backend is another class (the app's own)."""
    backend = app.backend
    if not enabled or type(backend) not in (CeleryRedisBackend, CelerySentinelBackend):
        return None
    server = server_of(backend.client)
    if server is None or not server.same_user(store):
        return None
    return (
        "the result backend is the lock store's Redis but was made before a singleton task "
        "was bound (app.backend read first): each run's release is a round trip of its own "
        "instead of riding the result's write. Define or import the singleton tasks "
        "before anything reads app.backend"
    )


def install(app: Celery) -> None:
    """From now on ``app`` resolves ``redis://`` and ``rediss://`` result backends to
    ``RedisBackend``, ``sentinel://`` to ``SentinelBackend`` (a backend made before keeps
    its class; one the app names by class, or an alias the app's loader overrides
    itself, is kept). Through Celery's per-app table of backend aliases
    (``app.loader.override_backends``): no other app is changed."""
    loader = app.loader
    overrides = dict(getattr(loader, "override_backends", None) or {})
    missing = {
        alias: replacement for alias, replacement in _REPLACED.items() if alias not in overrides
    }
    if missing:
        loader.override_backends = {**overrides, **missing}


def uninstall(app: Celery) -> None:
    """Undo ``install``: the aliases it added resolve to Celery's backends again."""
    loader = app.loader
    overrides = dict(getattr(loader, "override_backends", None) or {})
    kept = {alias: name for alias, name in overrides.items() if _REPLACED.get(alias) != name}
    if kept != overrides:
        loader.override_backends = kept


__all__ = [
    "BACKEND",
    "SENTINEL_BACKEND",
    "RedisBackend",
    "SentinelBackend",
    "install",
    "missed_ride",
    "release_not_ridden",
    "release_with_result",
    "uninstall",
]
