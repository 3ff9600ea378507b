"""The lock store an app uses, built once from its settings and cached on the app.

Two clients on the same Redis: ``lock``, whose socket timeout keeps a dispatch from hanging on
a partitioned server, and ``waiting``, whose BLPOP (``on_contention=wait``) may take longer
than any sensible socket timeout. ``memory://`` gives the in-process store for eager tests.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigurationError, SingletonLockError
from ..lease import LockStore, MemoryLock, RedisLock, Redlock, client_from_url, describe
from ..lease.redis.urls import (
    REDLOCK_SCHEMES,
    STANDALONE_SCHEMES,
    redact,
    redlock_masters,
    scheme_of,
)
from .settings import MEMORY_URL, SingletonConfig

if TYPE_CHECKING:
    from celery import Celery


_CACHE_ATTRIBUTE = "_singleton_lock_backend"
_guard = threading.Lock()

# One round trip should never take this long; past it the store counts as unreachable.
SOCKET_TIMEOUT = 5.0
# Connections a process opens to a standalone lock store at most. An exchange holds one
# only while its answer is read, so a few serve any number of threads or greenlets; a
# caller finding all in use waits (up to SOCKET_TIMEOUT) rather than opening more. Set
# max_connections in singleton_lock_transport_options to change it.
MAX_CONNECTIONS = 20


class LockStores:
    """The app's lock store(s), created on first use (not at import, not at fork)."""

    def __init__(self, config: SingletonConfig) -> None:
        self.config = config
        self._lock: LockStore | None = None
        self._waiting: LockStore | None = None
        self._building = threading.Lock()

    @classmethod
    def for_app(cls, app: Celery) -> LockStores:
        stores: LockStores | None = getattr(app, _CACHE_ATTRIBUTE, None)
        if stores is None:
            with _guard:
                stores = getattr(app, _CACHE_ATTRIBUTE, None)
                if stores is None:
                    stores = cls(SingletonConfig.from_app(app))
                    setattr(app, _CACHE_ATTRIBUTE, stores)
        return stores

    @staticmethod
    def forget(app: Celery) -> None:
        """Drop the app's cached settings and stores: the next use reads ``app.conf``
        again and connects afresh (a test that changes the lock store's settings)."""
        SingletonConfig.forget(app)
        if hasattr(app, _CACHE_ATTRIBUTE):
            delattr(app, _CACHE_ATTRIBUTE)

    def _client(self, *, waiting: bool) -> Any:
        config = self.config
        if config.client_factory is not None:
            client = config.client_factory()
            if client is None or not hasattr(client, "register_script"):
                raise ConfigurationError(
                    f"singleton_lock_client returned {client!r}, not a redis-py client"
                )
            return client
        options = {
            "socket_timeout": SOCKET_TIMEOUT,
            "socket_connect_timeout": SOCKET_TIMEOUT,
            "health_check_interval": 30,
            **config.transport_options,
        }
        url = config.require_url()
        if scheme_of(url) in REDLOCK_SCHEMES:
            return [_bounded(one, options) for one in redlock_masters(url)]
        if waiting:
            options["socket_timeout"] = None  # a BLPOP waits as long as it was asked to
            return client_from_url(url, options)
        if scheme_of(url) in STANDALONE_SCHEMES:
            return _bounded(url, options)
        return client_from_url(url, options, bounded=True)

    def _build(self, *, waiting: bool) -> LockStore:
        if self.config.require_url() == MEMORY_URL:
            if self._lock is not None:
                return self._lock  # one in-process store, or waits would never be woken
            return MemoryLock(prefix=self.config.prefix, allow_long_ttl=True)
        # Long holds are allowed here because queue holds stretch to cover an ETA; the
        # user-facing ttl and queue_ttl were already validated against the one-day cap.
        client = self._client(waiting=waiting)
        if isinstance(client, list):
            if self.config.replicas:
                raise ConfigurationError(
                    "singleton_lock_replicas waits for each master's replicas; a Redlock's "
                    "majority of masters stands in for them: remove singleton_lock_replicas"
                )
            return Redlock(
                [RedisLock(one, prefix=self.config.prefix, allow_long_ttl=True) for one in client]
            )
        return RedisLock(
            client,
            prefix=self.config.prefix,
            allow_long_ttl=True,
            replicas=self.config.replicas,
            replica_timeout=self.config.replica_timeout,
        )

    @property
    def lock(self) -> LockStore:
        """The store for operations of one round trip, with a socket timeout."""
        # Many threads may dispatch their first call at once: each built store has its own
        # connection pool, so all but one built here would open connections past the bound.
        if self._lock is None:
            with self._building:
                if self._lock is None:
                    self._lock = self._build(waiting=False)
        return self._lock

    @property
    def waiting(self) -> LockStore:
        """The store for blocking waits (``on_contention=wait``), without a socket timeout:
        its BLPOP may take longer than any sensible one (with the user's own client, or a
        Redlock, it is ``lock`` itself)."""
        if self._waiting is None:
            if self.config.client_factory is not None or isinstance(self.lock, Redlock):
                # the user's client: its timeouts are theirs; a Redlock's waits poll
                self._waiting = self.lock
            else:
                with self._building:
                    if self._waiting is None:
                        self._waiting = self._build(waiting=True)
        return self._waiting

    def eviction_policy(self) -> str | None:
        """The lock store's ``maxmemory-policy`` (None for the memory store)."""
        lock = self.lock
        if isinstance(lock, Redlock):  # every master must keep its keys: the first that won't
            policies = []
            for node in lock.nodes:  # one master down at worker start: check the others
                with contextlib.suppress(SingletonLockError):
                    policies.append(node.eviction_policy())
            return next((p for p in policies if p not in (None, "noeviction")), None)
        return lock.eviction_policy() if isinstance(lock, RedisLock) else None

    def describe(self) -> str:
        """Where the locks live, for messages: never shows a password."""
        if self.config.url == MEMORY_URL:
            return MEMORY_URL
        if isinstance(self._lock, RedisLock):
            return describe(self._lock.client)
        return redact(self.config.require_url())


def _bounded(url: str, options: dict[str, Any]) -> Any:
    """A standalone server's client with at most ``max_connections`` connections."""
    options = {"max_connections": MAX_CONNECTIONS, "timeout": SOCKET_TIMEOUT, **options}
    return client_from_url(url, options, bounded=True)  # timeout: the wait for a connection
