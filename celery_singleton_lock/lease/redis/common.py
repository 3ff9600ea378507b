"""What the sync and asyncio stores share: validation, script arguments, replies, the wait plan.

No I/O here. The blocking acquire is a generator of steps ("try", "block", "sleep") so
the two clients share the decisions and differ only in how they perform I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import Generic, NoReturn, TypeAlias, TypedDict, TypeVar

import redis
from redis.commands.core import AsyncScript, Script
from redis.exceptions import RedisClusterException

from ..._time import full_jitter, to_seconds, ttl_to_ms
from ...exceptions import ConfigurationError
from ..clock import SYSTEM_CLOCK, Clock
from ..errors import OUT_OF_RANGE, store_error
from ..lease import YIELDED, Lease, LostCallback, valid_until
from ..names import DEFAULT_PREFIX, LockKeys, new_token, validate_name, validate_prefix
from ..outcomes import LOSS, Contended, ExtendResult, ReleaseResult, decode, text
from ..takeover import TakeOver, WaitMode
from . import scripts
from .calls import Arg, Response
from .clients import Client, database_count, describe, is_async, socket_timeout_of
from .replies import GRACE

logger = logging.getLogger(__name__)

# Long enough to cover the gap between a waiter's failed acquire and its BLPOP,
# short enough that an unconsumed wake-up does not linger as a key.
SIGNAL_TTL_MS = 2000
# How long a waiter sleeps at most when the holder's key has no TTL (a foreign key).
NO_TTL_RECHECK = 1.0
# What redis-py raises: its errors, and the cluster client's own (not RedisErrors).
REDIS_ERRORS = (redis.RedisError, RedisClusterException)


class ScriptArgs(TypedDict):
    keys: list[Arg]
    args: list[Arg]


@dataclass(frozen=True)
class Call:
    """One validated acquire request."""

    name: str
    keys: LockKeys
    token: str
    ttl_ms: int
    replace: str  # '' for none
    shape: tuple[str, str]  # ('', '') for none
    fenced: bool
    unless_replaced: str = ""  # refuse if swap replaced this token ('' for no check)
    clock: Clock = SYSTEM_CLOCK  # the store's: what its leases count on

    @property
    def plain(self) -> bool:
        """A plain hold (a queued message's): none of the acquire script's extra steps."""
        return not (self.fenced or self.replace or self.shape[0] or self.unless_replaced)

    def lease(self, *, fence: int, sent_at: float) -> Lease:
        """The lease this call holds once granted; its TTL counts from when it was sent."""
        return Lease.granted(
            self.name,
            self.keys.lock,
            self.token,
            fence=fence,
            ttl=self.ttl_ms / 1000,
            sent_at=sent_at,
            clock=self.clock,
        )


@dataclass(frozen=True)
class Try:
    announce: bool  # register as a waiter if this try fails (push waits only)


@dataclass(frozen=True)
class Block:
    seconds: float


@dataclass(frozen=True)
class Sleep:
    seconds: float


Step: TypeAlias = Try | Block | Sleep
Plan: TypeAlias = Generator[Step, Lease | Contended | None, Lease | Contended]


def _acquire_steps(
    *,
    blocking: bool,
    timeout: float | None,
    wait: WaitMode,
    backoff_base: float,
    backoff_cap: float,
    clock: Clock,
) -> Plan:
    deadline = None if timeout is None else clock.monotonic() + timeout
    attempt = 0
    announce = blocking and wait == "push"
    while True:
        outcome = yield Try(announce)
        if outcome is None:
            raise RuntimeError("acquire plan resumed without the outcome of its try")
        if isinstance(outcome, Lease) or not blocking:
            return outcome
        left = None if deadline is None else deadline - clock.monotonic()
        if left is not None and left <= 0:
            return outcome
        # Never wait past the holder's TTL: a holder that dies without releasing sends
        # no wake-up, so its expiry is the latest moment the lock can become free.
        cap = NO_TTL_RECHECK if outcome.retry_after is None else outcome.retry_after
        bound = cap if left is None else min(cap, left)
        if wait == "push":
            # BLPOP's timeout 0 means "forever"; 1 ms is the finest it honours.
            yield Block(max(bound, 0.001))
        else:
            delay = full_jitter(attempt, base=backoff_base, cap=backoff_cap)
            yield Sleep(min(delay, bound))
            attempt += 1


# The client a store drives: sync (``RedisLock``) or asyncio (``AsyncRedisLock``).
ClientT = TypeVar("ClientT", bound=Client)
ScriptT = TypeVar("ScriptT", Script, AsyncScript)


class LockBase(Generic[ClientT, ScriptT]):
    """What both clients share: key layout, validation and reply decoding. No I/O."""

    # One server sees every operation on a lock, so its history is whole there (not so
    # for Redlock's masters, nor kept by the memory store).
    keeps_history = True
    # A server other processes reach (a broker may share it); not the memory store's.
    on_a_server = True
    # A server's ttl runs in real time: so does every lease it grants.
    clock: Clock = SYSTEM_CLOCK

    def __init__(
        self,
        client: ClientT,
        *,
        prefix: str = DEFAULT_PREFIX,
        allow_long_ttl: bool = False,
        backoff_base: float = 0.005,
        backoff_cap: float = 0.5,
    ) -> None:
        if not callable(getattr(client, "register_script", None)):
            raise ConfigurationError(
                f"{type(self).__name__} takes a redis-py client, got {type(client).__name__}; "
                f"for a URL write {type(self).__name__}.from_url(url)"
            )
        self.client = client
        self.prefix = validate_prefix(prefix)
        self.allow_long_ttl = allow_long_ttl
        self.backoff_base = to_seconds(backoff_base, what="backoff_base")
        self.backoff_cap = to_seconds(backoff_cap, what="backoff_cap")
        self.where = describe(client)
        # A client with no read timeout (a waiting store's: its BLPOP may rightly block
        # long) would wait for ever on a try's answer from a frozen server: each try of
        # an acquire is bounded as its wait is, by GRACE.
        self.try_within: float | None = GRACE if socket_timeout_of(client) is None else None
        # Per-client registration (EVALSHA; redis-py reloads on NOSCRIPT after a restart).
        self._acquire_script: ScriptT = self._register(scripts.ACQUIRE)
        self._release_script: ScriptT = self._register(scripts.RELEASE)
        self._extend_script: ScriptT = self._register(scripts.EXTEND)
        self._release_matching_script: ScriptT = self._register(scripts.RELEASE_MATCHING)
        self._swap_script: ScriptT = self._register(scripts.SWAP)

    def _register(self, source: str) -> ScriptT:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where}, prefix={self.prefix!r})"

    def keys(self, name: str) -> LockKeys:
        """The Redis keys lock ``name`` uses under this prefix."""
        return LockKeys.build(self.prefix, validate_name(name))

    def unavailable(self, error: Exception, name: str | None = None) -> NoReturn:
        """Raise what ``error`` means: the store is unreachable, or set up wrongly."""
        key = None if name is None else self.keys(name).lock
        count = None
        if OUT_OF_RANGE in str(error) and not is_async(self.client):
            count = database_count(self.client)  # (an asyncio client's error says less)
        raise store_error(error, where=self.where, name=name, key=key, databases=count) from error

    def ttl_ms(self, ttl: object) -> int:
        """``ttl`` in milliseconds, refused if too long unless this store allows it."""
        return ttl_to_ms(ttl, allow_long=self.allow_long_ttl)

    def _acquire_call(self, name: str, ttl: object, token: object, take: TakeOver) -> Call:
        # Validated before the first byte goes to Redis (``take`` checked itself).
        return Call(
            name=name,
            keys=self.keys(name),
            token=new_token(token),
            ttl_ms=self.ttl_ms(ttl),
            replace=take.replace or "",
            shape=take.shape or ("", ""),
            fenced=take.fenced,
            unless_replaced=take.unless_replaced or "",
            clock=self.clock,
        )

    def acquire_request(
        self, name: str, ttl: object, *, token: str, take: TakeOver
    ) -> tuple[Call, ScriptArgs]:
        """A try to be sent on another client's round trip (a riding take): the
        validated call and the acquire script's keys and arguments."""
        call = self._acquire_call(name, ttl, token, take)
        return call, self._acquire_argv(call, Try(announce=False))

    @staticmethod
    def _acquire_argv(call: Call, step: Try) -> ScriptArgs:
        keys = call.keys
        argv: ScriptArgs = {
            "keys": [keys.lock, keys.fence, keys.signal, keys.waiters],
            "args": [
                call.token,
                call.ttl_ms,
                "1" if step.announce else "0",
                call.replace,
                *call.shape,
                "0" if call.fenced else "1",
            ],
        }
        if call.unless_replaced:
            argv["keys"].append(keys.replaced)
            argv["args"].append(call.unless_replaced)
        return argv

    @staticmethod
    def acquired(call: Call, *, sent_at: float, reply: Response) -> Lease | Contended:
        """What the acquire script's ``reply`` to ``call`` means (replicas aside)."""
        if int(reply[0]) == -1:
            return Contended(call.name, call.keys.lock, "", None, replaced=True)
        if int(reply[0]) == 1:
            lease = call.lease(fence=int(reply[1]), sent_at=sent_at)
            logger.debug("acquired %s (fence %d)", lease.key, lease.fence)
            return lease
        pttl = int(reply[2])
        return Contended(
            name=call.name,
            key=call.keys.lock,
            holder=text(reply[1]),
            retry_after=None if pttl < 0 else pttl / 1000,
        )

    def _extend_call(self, lease: Lease, ttl: object | None) -> tuple[list[str], int]:
        """The extend script's keys for ``lease`` (with the lock it yields to, if any)
        and its ttl in milliseconds."""
        Lease.require(lease, "extend")
        keys = self.keys(lease.name)
        chosen = [keys.lock, keys.fence, keys.offer]
        if lease.yields_to is not None:
            chosen.append(self.keys(lease.yields_to[0]).lock)
        return chosen, self.ttl_ms(lease.ttl if ttl is None else ttl)

    @staticmethod
    def granted(outcome: Lease | Contended, on_lost: LostCallback | None) -> Lease:
        """The end of a blocking acquire: the lease, or the error naming the holder."""
        if isinstance(outcome, Contended):
            raise outcome.error()
        if on_lost is not None:
            outcome.on_lost(on_lost)
        return outcome

    def release_argv(self, name: str, token: str) -> ScriptArgs:
        keys = self.keys(name)
        return {"keys": [keys.lock, keys.signal, keys.waiters], "args": [token, SIGNAL_TTL_MS]}

    def _release_matching_argv(
        self, name: str, prefix: str, suffix: str, or_shape: tuple[str, str] | None = None
    ) -> ScriptArgs:
        if not prefix or (or_shape is not None and not or_shape[0]):
            raise ConfigurationError("release_matching needs a non-empty prefix")
        keys = self.keys(name)
        return {
            "keys": [keys.lock, keys.signal, keys.waiters],
            "args": [prefix, suffix, SIGNAL_TTL_MS, *(or_shape or ())],
        }

    @staticmethod
    def _extended(lease: Lease, ttl_ms: int, sent_at: float, reply: Response) -> ExtendResult:
        result = decode(reply, ExtendResult)
        if result in (ExtendResult.EXTENDED, ExtendResult.CANCELLED):
            lease.renewed(valid_until(sent_at, ttl_ms / 1000))
            if result is ExtendResult.CANCELLED:
                lease.mark_cancelled(YIELDED)
        else:
            lease.mark_lost(LOSS[result])
        return result

    @staticmethod
    def release_answer(lease: Lease, reply: Response, *, again: bool = False) -> ReleaseResult:
        """What a release found; ``again``: the lease had been released already, so
        finding it gone is no loss."""
        result = decode(reply, ReleaseResult)
        if result is ReleaseResult.RELEASED:
            logger.debug("released %s (fence %d)", lease.key, lease.fence)
        elif again:
            logger.debug("released %s again: %s", lease.key, result.name)
        else:
            logger.info("release of %s (fence %d): %s", lease.key, lease.fence, result.name)
            lease.note_loss(LOSS[result])  # the holder is letting go: recorded, not reported
        return result

    def acquire_plan(self, blocking: bool, timeout: object | None, wait: object) -> Plan:
        """The steps of an acquire (try, block on the signal, sleep) until it is decided."""
        if wait not in ("push", "spin"):
            raise ConfigurationError(f"wait must be 'push' or 'spin', got {wait!r}")
        seconds = None if timeout is None else to_seconds(timeout, what="timeout")
        if seconds is not None and seconds < 0:
            raise ConfigurationError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        if blocking and wait == "push":
            self._check_socket_timeout(seconds)
        return _acquire_steps(
            blocking=blocking,
            timeout=seconds,
            wait=wait,
            backoff_base=self.backoff_base,
            backoff_cap=self.backoff_cap,
            clock=self.clock,
        )

    def _check_socket_timeout(self, timeout: float | None) -> None:
        socket_timeout = socket_timeout_of(self.client)
        if socket_timeout is None:
            return
        if timeout is None or timeout + 0.1 >= socket_timeout:
            wanted = "forever" if timeout is None else f"up to {timeout:g}s"
            raise ConfigurationError(
                f"this Redis client has socket_timeout={socket_timeout:g}s but acquire() was "
                f"asked to block {wanted} in BLPOP, which would fail with a socket timeout. "
                "Create the client with a larger socket_timeout (or None), pass a shorter "
                "timeout=, or use wait='spin'"
            )
