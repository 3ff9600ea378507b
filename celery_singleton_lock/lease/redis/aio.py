"""``AsyncRedisLock``: the asyncio twin of ``RedisLock``, on any asyncio redis-py client."""

from __future__ import annotations

import asyncio
import time

from redis.commands.core import AsyncScript

from ...exceptions import ConfigurationError
from ..lease import Lease, LostCallback
from ..names import DEFAULT_PREFIX
from ..outcomes import Contended, ExtendResult, ReleaseResult, text
from ..renewal import cadence, next_delay
from ..takeover import FRESH, TakeOver, WaitMode
from .calls import run_script_async
from .clients import AsyncClient, build, is_async
from .common import REDIS_ERRORS, Block, Call, LockBase, Try
from .replies import Unanswered
from .waits import pop_within_async


class AsyncRedisLock(LockBase[AsyncClient, AsyncScript]):
    """Same scripts, same semantics as ``RedisLock``, ``await`` each call.

    Takes ``redis.asyncio.Redis`` (standalone or from ``Sentinel.master_for``) and
    ``redis.asyncio.cluster.RedisCluster``. Renewal runs as one asyncio task per renewed
    lease on the caller's event loop.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        allow_long_ttl: bool = False,
        backoff_base: float = 0.005,
        backoff_cap: float = 0.5,
    ) -> None:
        if not is_async(client):
            raise ConfigurationError(
                "AsyncRedisLock needs an asyncio client (redis.asyncio.Redis or "
                "redis.asyncio.cluster.RedisCluster); use RedisLock for a sync one"
            )
        super().__init__(
            client,
            prefix=prefix,
            allow_long_ttl=allow_long_ttl,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
        )
        self._renewals: dict[str, asyncio.Task[None]] = {}

    def _register(self, source: str) -> AsyncScript:
        return self.client.register_script(source)

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, **client_options: object
    ) -> AsyncRedisLock:
        """Connect to ``url``: any form ``clients.build`` takes (standalone, Sentinel, Cluster)."""
        return cls(build(url, client_options, asyncio=True), prefix=prefix)

    async def try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        take: TakeOver = FRESH,
    ) -> Lease | Contended:
        """See ``RedisLock.try_acquire``."""
        call = self._acquire_call(name, ttl, token, take)
        return await self._try(call, Try(announce=False))

    async def _try(self, call: Call, step: Try, within: float | None = None) -> Lease | Contended:
        sent_at = time.monotonic()
        try:
            argv = self._acquire_argv(call, step)
            sent = run_script_async(self.client, self._acquire_script, **argv)
            # Connecting included: cancelled, redis-py drops the connection.
            reply = await (sent if within is None else asyncio.wait_for(sent, within))
        except TimeoutError:
            self.unavailable(Unanswered(f"a call unanswered after {within:g}s"), call.name)
        except REDIS_ERRORS as error:
            self.unavailable(error, call.name)
        return self.acquired(call, sent_at=sent_at, reply=reply)

    async def acquire(
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
    ) -> Lease:
        """See ``RedisLock.acquire``."""
        call = self._acquire_call(name, ttl, token, take)
        plan = self.acquire_plan(blocking, timeout, wait)
        step = next(plan)
        try:
            while True:
                if isinstance(step, Try):
                    step = plan.send(await self._try(call, step, self.try_within))
                elif isinstance(step, Block):
                    try:
                        await pop_within_async(self.client, call.keys.signal, step.seconds)
                    except REDIS_ERRORS as error:
                        self.unavailable(error, name)
                    step = next(plan)
                else:
                    await asyncio.sleep(step.seconds)
                    step = next(plan)
        except StopIteration as done:
            lease = self.granted(done.value, on_lost)
        if renew:
            self._renewals[lease.token] = asyncio.create_task(self._renew(lease))
        return lease

    async def _renew(self, lease: Lease) -> None:
        delay: float | None = cadence(lease)
        while delay is not None:
            await asyncio.sleep(delay)
            try:
                # Never longer than what is left of the lease: a stalled server must
                # not keep the holder believing it still holds the lock.
                result: ExtendResult | Exception = await asyncio.wait_for(
                    self.extend(lease), timeout=max(lease.remaining(), 0.001)
                )
            except (TimeoutError, Exception) as error:
                result = error
            delay = next_delay(lease, result)

    async def release(self, lease: Lease) -> ReleaseResult:
        """See ``RedisLock.release``."""
        argv = self.release_argv(Lease.require(lease, "release").name, lease.token)
        renewal = self._renewals.pop(lease.token, None)
        if renewal is not None:
            renewal.cancel()
        with lease.releasing() as again:
            try:
                reply = await run_script_async(self.client, self._release_script, **argv)
            except REDIS_ERRORS as error:
                self.unavailable(error, lease.name)
        return self.release_answer(lease, reply, again=again)

    async def extend(self, lease: Lease, ttl: object | None = None) -> ExtendResult:
        """See ``RedisLock.extend``."""
        keys, ttl_ms = self._extend_call(lease, ttl)
        sent_at = time.monotonic()
        try:
            reply = await run_script_async(
                self.client, self._extend_script, keys, [lease.token, ttl_ms]
            )
        except REDIS_ERRORS as error:
            self.unavailable(error, lease.name)
        return self._extended(lease, ttl_ms, sent_at, reply)

    async def holder(self, name: str) -> str | None:
        """The token currently holding ``name`` (None when free)."""
        try:
            value = await self.client.get(self.keys(name).lock)
        except REDIS_ERRORS as error:
            self.unavailable(error, name)
        return None if value is None else text(value)
