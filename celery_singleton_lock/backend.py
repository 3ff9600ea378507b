"""The lock store an app uses, built once from its settings and cached on the app.

Two clients on the same Redis: ``lock`` for the one-round-trip operations, with a
socket timeout so a dispatch never hangs on a partitioned server, and ``waiting`` for
blocking waits (``on_contention=wait``), whose BLPOP may legitimately take longer than
any sensible socket timeout. ``memory://`` gives the in-process store for eager tests.
"""

from __future__ import annotations

import threading
from typing import Any, TypeAlias

import redis

from .config import MEMORY_URL, SingletonConfig
from .lock import RedisLock, redacted_url
from .memory import MemoryLock

Store: TypeAlias = RedisLock | MemoryLock

_CACHE_ATTRIBUTE = "_singleton_lock_backend"
_guard = threading.Lock()

# One round trip should never take this long; past it the store counts as unreachable.
SOCKET_TIMEOUT = 5.0


class Backend:
    """The app's lock store(s), created on first use (not at import, not at fork)."""

    def __init__(self, config: SingletonConfig) -> None:
        self.config = config
        self._lock: Store | None = None
        self._waiting: Store | None = None

    @classmethod
    def for_app(cls, app: Any) -> Backend:
        backend: Backend | None = getattr(app, _CACHE_ATTRIBUTE, None)
        if backend is None:
            with _guard:
                backend = getattr(app, _CACHE_ATTRIBUTE, None)
                if backend is None:
                    backend = cls(SingletonConfig.from_app(app))
                    setattr(app, _CACHE_ATTRIBUTE, backend)
        return backend

    def _build(self, socket_timeout: float | None) -> Store:
        url = self.config.require_url()
        if url == MEMORY_URL:
            if self._lock is not None:
                return self._lock  # one in-process store, or waits would never be woken
            return MemoryLock(prefix=self.config.prefix, allow_long_ttl=True)
        client = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=SOCKET_TIMEOUT,
            health_check_interval=30,
        )
        # Long holds are allowed here because queue holds stretch to cover an ETA; the
        # user-facing ttl and queue_ttl were already validated against the one-day cap.
        return RedisLock(client, prefix=self.config.prefix, allow_long_ttl=True)

    @property
    def lock(self) -> Store:
        if self._lock is None:
            self._lock = self._build(SOCKET_TIMEOUT)
        return self._lock

    @property
    def waiting(self) -> Store:
        if self._waiting is None:
            self._waiting = self._build(None)
        return self._waiting

    def describe(self) -> str:
        """Where the locks live, for messages: never shows a password."""
        if self.config.url == MEMORY_URL:
            return MEMORY_URL
        if self._lock is not None and isinstance(self._lock, RedisLock):
            return redacted_url(self._lock.client)
        return redacted_url(redis.Redis.from_url(self.config.require_url()))
