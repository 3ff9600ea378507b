"""The ``memory://`` lock store: ``RedisLock`` over an in-process fakeredis, for eager tests.

The same Lua scripts as on a server, run by fakeredis through lupa, on the store's own
clock (a test may set a ``ManualClock``). It only excludes within one process: use it to
unit-test your own tasks eagerly, never in production.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from ...exceptions import ConfigurationError
from ..clock import SYSTEM_CLOCK, Clock
from ..lease import Lease
from ..names import DEFAULT_PREFIX
from ..outcomes import ExtendResult, decode
from .common import Block, Sleep
from .store import RedisLock

if TYPE_CHECKING:
    from .clients import SyncClient

# A renewed lease is kept until it is released (no renewal thread here): its key's ttl
# is set this far out, on the store's clock.
KEPT_MS = 10 * 365 * 24 * 3600 * 1000

MISSING = (
    "the memory:// lock store runs the lock scripts in-process with fakeredis, which is "
    "not installed: pip install 'celery-singleton-lock[memory]'"
)


def _fake_client(now: Callable[[], float], on_write: Callable[[], None]) -> SyncClient:
    try:
        from .fake import fake_client  # noqa: PLC0415  (fakeredis is an extra)
    except ImportError as error:
        raise ConfigurationError(MISSING) from error
    return fake_client(now, on_write)


class MemoryLock(RedisLock):
    """``RedisLock`` over a server of its own in this process; renewal keeps a lease
    until it is released, and a blocking acquire waits on the store's clock."""

    # Its history is not kept for the operators' views: nothing outside this process reads it.
    keeps_history = False
    # No broker reaches its server: nothing rides.
    on_a_server = False

    def __init__(
        self,
        *,
        prefix: str = DEFAULT_PREFIX,
        allow_long_ttl: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self.guard = threading.Condition()
        self._clock = clock or SYSTEM_CLOCK
        self._writes = 0  # counted under the guard: a waiter looks again after any write
        client = _fake_client(self._now, self._written)
        super().__init__(client, prefix=prefix, allow_long_ttl=allow_long_ttl)
        self.clock = self._clock

    def __repr__(self) -> str:
        return f"MemoryLock(prefix={self.prefix!r})"

    @property
    def clock(self) -> Clock:
        """What its leases, waits, ttls and rate slots count time on (a test may set a
        ``ManualClock``: it starts where the machine's clock is)."""
        return self._clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        clock.attach(self.guard)
        self._clock = clock
        self.pipelining.clock = clock

    def _now(self) -> float:  # the server's time: the clock of the moment, as a test sets it
        return self.clock.time()

    def _written(self) -> None:
        with self.guard:
            self._writes += 1
            self.guard.notify_all()

    def pause(self, name: str, step: Block | Sleep, since: float) -> None:
        """``RedisLock.pause`` on the store's clock: woken by a release (its wake-up in
        the list, or any write after it) or by the clock moving since the try."""
        with self.guard:
            writes = self._writes
        if isinstance(step, Block) and self.client.lpop(self.keys(name).signal) is not None:
            return
        with self.guard:
            if self._writes == writes and not self.clock.advanced_since(since):
                self.clock.wait(self.guard, step.seconds)

    def renew(self, lease: Lease) -> None:
        """Keep ``lease`` until it is released, with no renewal thread: its key's ttl
        set ``KEPT_MS`` out by the extend script."""
        keys, _ = self._extend_call(lease, None)
        reply = self.pipelining.call(self._extend_script, keys, [lease.token, KEPT_MS])
        if decode(reply, ExtendResult) is ExtendResult.EXTENDED:
            self._keep(keys[0], lease.token)
            lease.renewed(math.inf)

    def _keep(self, key: str, token: str) -> None:
        """No ttl on ``key`` while ``token`` holds it, as a lease kept until its release
        reads (its holder's ttl, a refused call's retry_after: none). Watched: a release
        and another take between the extend and this leave the newcomer's ttl alone."""
        with self.client.pipeline() as pipe:
            pipe.watch(key)
            if pipe.get(key) != token.encode():
                return
            pipe.multi()
            pipe.persist(key)
            with contextlib.suppress(redis.WatchError):
                pipe.execute()

    def eviction_policy(self) -> str | None:
        """None: nothing is evicted from this store."""
        return None


__all__ = ["KEPT_MS", "MemoryLock"]
