"""What a lock store keeps beside its locks (rates, backlogs, overrides...), made once a store."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from ..exceptions import ConfigurationError
from .memory import MemoryLock
from .redis.store import RedisLock
from .redlock.masters import Redlock

OnRedis = TypeVar("OnRedis")
OnMemory = TypeVar("OnMemory")


class PerStore(Generic[OnRedis, OnMemory]):
    """``of(store)``: the helper of ``store`` (a ``RedisLock`` or a ``MemoryLock``), made
    at its first use and kept as long as the store. A Redlock is refused: several
    masters cannot keep one count, one record or one hash, so ``what`` needs one store."""

    def __init__(
        self,
        what: str,
        keeps: str,
        used_by: str,
        on_redis: Callable[[RedisLock], OnRedis],
        on_memory: Callable[[MemoryLock], OnMemory],
    ) -> None:
        self.what, self.keeps, self.used_by = what, keeps, used_by
        self._on_redis, self._on_memory = on_redis, on_memory
        self._made: weakref.WeakKeyDictionary[object, OnRedis | OnMemory] = (
            weakref.WeakKeyDictionary()
        )

    def of(self, store: object) -> OnRedis | OnMemory:
        found = self._made.get(store)
        if found is not None:
            return found
        if isinstance(store, Redlock):
            raise ConfigurationError(
                f"{self.what} need one lock store; {store.where} is a Redlock of several "
                f"masters, which cannot keep {self.keeps}: use a standalone, Sentinel or "
                f"Cluster lock store {self.used_by}"
            )
        if isinstance(store, MemoryLock):
            found = self._on_memory(store)
        elif isinstance(store, RedisLock):
            found = self._on_redis(store)
        else:
            raise ConfigurationError(f"{self.what} need a RedisLock or a MemoryLock, got {store!r}")
        self._made[store] = found
        return found


__all__ = ["PerStore"]
