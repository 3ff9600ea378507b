"""An in-process lock store (``singleton_lock_url = "memory://"``) for ``task_always_eager`` tests.

Same leases, tokens, fences and outcomes as ``RedisLock``, kept in a dict behind a
condition variable. It only excludes within one process: use it to unit-test your own
tasks eagerly, never in production.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._time import to_seconds, ttl_to_ms
from ..exceptions import ConfigurationError
from .clock import SYSTEM_CLOCK, Clock
from .lease import YIELDED, Lease, LostCallback
from .names import (
    DEFAULT_PREFIX,
    Held,
    LockKeys,
    check_limit,
    new_token,
    parse_key,
    slot,
    validate_name,
    validate_prefix,
)
from .outcomes import LOSS, Contended, ExtendResult, ReleaseResult
from .pending import PendingAcquire
from .takeover import FRESH, TakeOver

if TYPE_CHECKING:
    from .history import Record  # kept by none of these stores: taken and not written


def _replaceable(current: str, replace: str | None, shape: tuple[str, str] | None) -> bool:
    if replace is not None and current == replace:
        return True
    return shape is not None and current.startswith(shape[0]) and current.endswith(shape[1])


@dataclass
class _Entry:
    token: str
    expires_at: float  # monotonic; inf while renewed


class MemoryLock:
    """``RedisLock``'s interface over a dict; renewal keeps a lease until it is released."""

    def __init__(
        self,
        *,
        prefix: str = DEFAULT_PREFIX,
        allow_long_ttl: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self.prefix = validate_prefix(prefix)
        self.allow_long_ttl = allow_long_ttl
        self.guard = threading.Condition()
        self.clock = clock or SYSTEM_CLOCK
        self._entries: dict[str, _Entry] = {}
        self._last_fence: dict[str, int] = {}
        self._replaced: dict[str, set[str]] = {}

    def __repr__(self) -> str:
        return f"MemoryLock(prefix={self.prefix!r})"

    @property
    def clock(self) -> Clock:
        """What its leases, waits and rate slots count time on (a test may set a
        ``ManualClock``: it starts where the machine's clock is)."""
        return self._clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        clock.attach(self.guard)
        self._clock = clock

    @property
    def slots(self) -> MemorySlots:
        return MemorySlots(self)

    def keys(self, name: str) -> LockKeys:
        return LockKeys.build(self.prefix, validate_name(name))

    def _live(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at <= self.clock.monotonic():
            del self._entries[key]
            return None
        return entry

    def try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        take: TakeOver = FRESH,
        entry: Record | None = None,
    ) -> Lease | Contended:
        keys = self.keys(name)
        key = keys.lock
        wanted = new_token(token)
        ttl_ms = ttl_to_ms(ttl, allow_long=self.allow_long_ttl)
        with self.guard:
            if take.unless_replaced and take.unless_replaced in self._replaced.get(key, ()):
                return Contended(name, key, "", None, replaced=True)
            live = self._live(key)
            if (
                live is not None
                and live.token != wanted
                and not _replaceable(live.token, take.replace, take.shape)
            ):
                left = live.expires_at - self.clock.monotonic()
                return Contended(
                    name=name,
                    key=key,
                    holder=live.token,
                    retry_after=None if left == float("inf") else left,
                )
            now = self.clock.monotonic()
            fence = 0
            if take.fenced:
                # Keyed by the fence key, which a counting lease's slots share.
                fence = max(time.time_ns() // 1000, self._last_fence.get(keys.fence, 0) + 1)
                self._last_fence[keys.fence] = fence
            self._entries[key] = _Entry(wanted, now + ttl_ms / 1000)
            return Lease.granted(
                name, key, wanted, fence=fence, ttl=ttl_ms / 1000, sent_at=now, clock=self.clock
            )

    def begin_try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        take: TakeOver = FRESH,
        read_late: bool = False,  # answered at once here
        entry: Record | None = None,
    ) -> PendingAcquire:
        return PendingAcquire.settled(self.try_acquire(name, ttl, token=token, take=take))

    def acquire(
        self,
        name: str,
        ttl: object,
        *,
        blocking: bool = True,
        timeout: object | None = None,
        wait: str = "push",
        token: str | None = None,
        take: TakeOver = FRESH,
        renew: bool = False,
        on_lost: LostCallback | None = None,
        entry: Record | None = None,
    ) -> Lease:
        if wait not in ("push", "spin"):
            raise ConfigurationError(f"wait must be 'push' or 'spin', got {wait!r}")
        seconds = None if timeout is None else to_seconds(timeout, what="timeout")
        deadline = None if seconds is None else self.clock.monotonic() + seconds
        with self.guard:
            while True:
                outcome = self.try_acquire(name, ttl, token=token, take=take)
                if isinstance(outcome, Lease):
                    break
                left = None if deadline is None else deadline - self.clock.monotonic()
                if not blocking or (left is not None and left <= 0):
                    raise outcome.error()
                bound = [b for b in (left, outcome.retry_after) if b is not None]
                self.clock.wait(self.guard, min(bound) if bound else None)
        if on_lost is not None:
            outcome.on_lost(on_lost)
        if renew:
            self.renew(outcome)
        return outcome

    def renew(self, lease: Lease) -> None:
        with self.guard:
            entry = self._live(lease.key)
            if entry is not None and entry.token == lease.token:
                entry.expires_at = float("inf")
                lease.renewed(float("inf"))

    def hand_over(self, lease: Lease, ttl: object, *, token: str) -> Lease | Contended:
        lease.mark_released()
        outcome = self.try_acquire(
            lease.name, ttl, token=token, take=TakeOver(replace=lease.token, fenced=False)
        )
        if isinstance(outcome, Contended):
            lease.note_loss("another owner holds it")
        return outcome

    def swap(
        self,
        name: str,
        expected: str,
        ttl: object,
        *,
        token: str,
        record: str | None = None,
        entry: Record | None = None,
    ) -> Lease | Contended:
        keys, ttl_ms = self.keys(name), ttl_to_ms(ttl, allow_long=self.allow_long_ttl)
        with self.guard:
            live = self._live(keys.lock)
            if live is None or live.token != expected:
                left = None if live is None else live.expires_at - self.clock.monotonic()
                holder = "" if live is None else live.token
                return Contended(name, keys.lock, holder, None if left == math.inf else left)
            now = self.clock.monotonic()
            self._entries[keys.lock] = _Entry(token, now + ttl_ms / 1000)
            # Kept for ever: the memory store is for tests.
            self._replaced.setdefault(keys.lock, set()).add(record or expected)
            return Lease.granted(
                name, keys.lock, token, fence=0, ttl=ttl_ms / 1000, sent_at=now, clock=self.clock
            )

    def _drop(self, key: str, matches: Callable[[str], bool]) -> ReleaseResult:
        with self.guard:
            entry = self._live(key)
            if entry is None:
                result = ReleaseResult.EXPIRED
            elif not matches(entry.token):
                return ReleaseResult.NOT_OWNER
            else:
                del self._entries[key]
                result = ReleaseResult.RELEASED
            self.guard.notify_all()
            return result

    def release(self, lease: Lease, *, entry: Record | None = None) -> ReleaseResult:
        again = Lease.require(lease, "release").released
        lease.mark_released()
        result = self._drop(lease.key, lambda token: token == lease.token)
        if result is not ReleaseResult.RELEASED and not again:
            lease.note_loss(LOSS[result])  # as RedisLock: letting go, recorded not reported
        return result

    def release_nowait(self, lease: Lease, *, entry: Record | None = None) -> None:
        self.release(lease)

    def release_token(self, name: str, token: str, *, entry: Record | None = None) -> ReleaseResult:
        return self._drop(self.keys(name).lock, lambda current: current == token)

    def release_matching(
        self,
        name: str,
        prefix: str,
        suffix: str = "",
        *,
        or_shape: tuple[str, str] | None = None,
    ) -> ReleaseResult:
        shapes = [(prefix, suffix)] if or_shape is None else [(prefix, suffix), or_shape]
        if not all(start for start, _ in shapes):
            raise ConfigurationError("release_matching needs a non-empty prefix")
        return self._drop(
            self.keys(name).lock,
            lambda token: any(token.startswith(a) and token.endswith(b) for a, b in shapes),
        )

    def extend(self, lease: Lease, ttl: object | None = None) -> ExtendResult:
        Lease.require(lease, "extend")
        ttl_ms = ttl_to_ms(lease.ttl if ttl is None else ttl, allow_long=self.allow_long_ttl)
        with self.guard:
            entry = self._live(lease.key)
            if entry is None:
                result = ExtendResult.EXPIRED
            elif entry.token != lease.token:
                result = ExtendResult.NOT_OWNER
            else:
                entry.expires_at = self.clock.monotonic() + ttl_ms / 1000
                lease.renewed(entry.expires_at)
                yields = lease.yields_to
                held = yields is not None and self._live(self.keys(yields[0]).lock) is not None
                result = ExtendResult.CANCELLED if held else ExtendResult.EXTENDED
        # Outside the guard: the callbacks may call back into this store.
        if result is ExtendResult.CANCELLED:
            lease.mark_cancelled(YIELDED)
        elif result is not ExtendResult.EXTENDED:
            lease.mark_lost(LOSS[result])
        return result

    def holder(self, name: str, *, entry: Record | None = None) -> str | None:
        with self.guard:
            live = self._live(self.keys(name).lock)
            return None if live is None else live.token

    def holdings(self, batch: int = 0, *, of: str | None = None) -> Iterator[Held]:
        """Every lock held (or ``of``'s), as ``RedisLock.holdings`` lists them (``batch``
        is unused)."""
        now = self.clock.monotonic()
        with self.guard:
            live = [(k, e) for k in list(self._entries) if (e := self._live(k)) is not None]
            fences = dict(self._last_fence)
        for key, entry in live:
            parsed = parse_key(self.prefix, key)
            if parsed is not None and of in (None, parsed[0]):
                name, role = parsed
                fence = fences.get(self.keys(name).fence) if role is None else None
                ttl = None if entry.expires_at == float("inf") else entry.expires_at - now
                yield Held(name, role, key, entry.token, ttl, fence)


class MemorySlots:
    """``Slots`` (counting leases) over a ``MemoryLock``."""

    def __init__(self, store: MemoryLock) -> None:
        self._store = store

    def try_acquire(
        self,
        name: str,
        limit: int,
        ttl: object,
        *,
        token: str | None = None,
        entry: Record | None = None,
        cap: int | None = None,
    ) -> Lease | Contended:
        store, wanted = self._store, new_token(token)
        names = [slot(name, number) for number in range(1, check_limit(limit) + 1)]
        with store.guard:
            # The caller's own slot first (a retry after a lost answer), then in order;
            # none while ``cap`` are held by others (a lowered limit).
            holders = {held: store.holder(held) for held in names}
            mine = [held for held in names if holders[held] == wanted]
            others = [held for held in names if holders[held] not in (None, wanted)]
            full = not mine and cap is not None and len(others) >= cap
            refused: list[Contended] = []
            for held in others if full else mine + [h for h in names if h not in mine]:
                outcome = store.try_acquire(held, ttl, token=wanted)
                if isinstance(outcome, Lease):
                    return outcome
                refused.append(outcome)
        soonest = min(refused, key=lambda o: math.inf if o.retry_after is None else o.retry_after)
        return Contended(name, store.keys(name).lock, soonest.holder, soonest.retry_after)

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
    ) -> Lease:
        seconds = None if timeout is None else to_seconds(timeout, what="timeout")
        deadline = None if seconds is None else self._store.clock.monotonic() + seconds
        wanted = new_token(token)
        with self._store.guard:
            while True:
                outcome = self.try_acquire(name, limit, ttl, token=wanted, cap=cap)
                if isinstance(outcome, Lease):
                    return outcome
                left = None if deadline is None else deadline - self._store.clock.monotonic()
                if left is not None and left <= 0:
                    raise outcome.error()
                bound = [b for b in (left, outcome.retry_after) if b is not None]
                self._store.clock.wait(self._store.guard, min(bound) if bound else None)
