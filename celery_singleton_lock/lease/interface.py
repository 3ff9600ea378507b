"""``LockStore``: what the Celery layer asks of a lock store, on Redis, a Redlock or in memory.

``entry`` (a ``history.Record``): the history entry an operation writes in its own
step, on a store that keeps histories; the others take it and write nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from .clock import Clock
from .history import Record
from .lease import Lease, LostCallback
from .names import Held, LockKeys
from .outcomes import Contended, ExtendResult, ReleaseResult
from .pending import PendingAcquire
from .takeover import FRESH, TakeOver, WaitMode


class SlotStore(Protocol):
    """Counting leases of a store (``store.slots``): up to ``limit`` holders of a name
    (``cap``: fewer held at once, the slots above it looked at all the same)."""

    def try_acquire(
        self,
        name: str,
        limit: int,
        ttl: object,
        *,
        token: str | None = None,
        entry: Record | None = None,
        cap: int | None = None,
    ) -> Lease | Contended: ...

    def acquire(
        self,
        name: str,
        limit: int,
        ttl: object,
        *,
        timeout: object | None = None,
        token: str | None = None,
        entry: Record | None = None,
        cap: int | None = None,
    ) -> Lease: ...


class LockStore(Protocol):
    """What the Celery layer asks of a lock store, on Redis or in memory."""

    prefix: str
    clock: Clock  # what its leases' expiry counts on

    @property
    def slots(self) -> SlotStore: ...

    def keys(self, name: str) -> LockKeys: ...

    def try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        take: TakeOver = FRESH,
        entry: Record | None = None,
    ) -> Lease | Contended: ...

    def begin_try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        take: TakeOver = FRESH,
        read_late: bool = False,
        entry: Record | None = None,
    ) -> PendingAcquire: ...

    def acquire(
        self,
        name: str,
        ttl: object,
        *,
        blocking: bool = True,
        timeout: object | None = None,
        wait: WaitMode = "push",
        token: str | None = None,
        take: TakeOver = FRESH,
        renew: bool = False,
        on_lost: LostCallback | None = None,
        entry: Record | None = None,
    ) -> Lease: ...

    def renew(self, lease: Lease) -> None: ...

    def hand_over(self, lease: Lease, ttl: object, *, token: str) -> Lease | Contended: ...

    def swap(
        self,
        name: str,
        expected: str,
        ttl: object,
        *,
        token: str,
        record: str | None = None,
        entry: Record | None = None,
    ) -> Lease | Contended: ...

    def release(self, lease: Lease, *, entry: Record | None = None) -> ReleaseResult: ...

    def release_nowait(self, lease: Lease, *, entry: Record | None = None) -> None: ...

    def release_token(
        self, name: str, token: str, *, entry: Record | None = None
    ) -> ReleaseResult: ...

    def release_matching(
        self,
        name: str,
        prefix: str,
        suffix: str = "",
        *,
        or_shape: tuple[str, str] | None = None,
    ) -> ReleaseResult: ...

    def extend(self, lease: Lease, ttl: object | None = None) -> ExtendResult: ...

    def holder(self, name: str, *, entry: Record | None = None) -> str | None: ...

    def holdings(self, batch: int = ..., *, of: str | None = None) -> Iterator[Held]: ...
