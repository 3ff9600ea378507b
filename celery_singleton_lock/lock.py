"""The lease: a Redis lock with owner tokens, fencing tokens, renewal and push wake-ups.

``RedisLock`` (sync) and ``AsyncRedisLock`` (asyncio) wrap one Redis client and take
leases on any number of lock names under one prefix. They know nothing about Celery.

One round trip per operation: acquire, release and extend are each one Lua script
(EVALSHA). A blocked ``acquire`` sleeps in ``BLPOP`` on the lock's signal list and is
woken by the release, never by a fixed polling interval.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import secrets
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, TypedDict, TypeVar
from urllib.parse import quote

import redis
import redis.asyncio

from . import _scripts
from ._time import full_jitter, to_seconds, ttl_to_ms
from ._wire import Reply, Wire
from .exceptions import ConfigurationError, LockLostError, LockNotAcquiredError
from .renewal import Renewer, get_renewer

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "singleton_lock"
MAX_NAME_LENGTH = 1024
MAX_TOKEN_LENGTH = 256
# Long enough to cover the gap between a waiter's failed acquire and its BLPOP,
# short enough that an unconsumed wake-up does not linger as a key.
SIGNAL_TTL_MS = 2000
# How long a waiter sleeps at most when the holder's key has no TTL (a foreign key).
NO_TTL_RECHECK = 1.0

WaitMode: TypeAlias = Literal["push", "spin"]
LostCallback: TypeAlias = Callable[["Lease"], object]


class ReleaseResult(enum.IntEnum):
    """What ``release`` found; the values are the release script's return codes."""

    RELEASED = 1
    EXPIRED = 0
    NOT_OWNER = -1


class ExtendResult(enum.IntEnum):
    """What ``extend`` found; the values are the extend script's return codes."""

    EXTENDED = 1
    EXPIRED = 0
    NOT_OWNER = -1


_Result = TypeVar("_Result", ReleaseResult, ExtendResult)


class _ScriptArgs(TypedDict):
    keys: list[Any]
    args: list[Any]


def _decode(code: object, result: type[_Result]) -> _Result:
    """The one place script codes become results; an unknown code is a bug, not a result."""
    try:
        return result(int(code))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise RuntimeError(f"{result.__name__}: unexpected script reply {code!r}") from None


_LOSS = {
    ReleaseResult.EXPIRED: "it expired",
    ReleaseResult.NOT_OWNER: "another owner holds it",
    ExtendResult.EXPIRED: "it expired",
    ExtendResult.NOT_OWNER: "another owner holds it",
}


def _text(value: object) -> str:
    """Script replies are bytes or str depending on the client's decode_responses."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# -- keys ---------------------------------------------------------------------------

# Characters kept as they are in a lock name. Everything else is %-escaped, so a name
# built from user data cannot close the hash tag ('{', '}'), match as a glob pattern in
# a SCAN/KEYS of the prefix ('*', '?', '[', ']', '\\') or smuggle in whitespace.
_NAME_SAFE = ":/=@+,;!$&'()|<>^`"
# Names made only of what quote() keeps as it is (its own safe set plus ours).
_needs_quoting = re.compile(r"[^A-Za-z0-9_.~\-:/=@+,;!$&'()|<>^`]").search


@dataclass(frozen=True)
class LockKeys:
    """The Redis keys of one lock; all share the hash tag ``{name}`` (one cluster slot)."""

    lock: str
    fence: str
    signal: str
    waiters: str

    @classmethod
    def build(cls, prefix: str, name: str) -> LockKeys:
        if not _needs_quoting(name):
            tag = f"{prefix}:{{{name}}}"  # the common case, at a fraction of quote()'s cost
        else:
            tag = f"{prefix}:{{{quote(name, safe=_NAME_SAFE)}}}"
        return cls(lock=tag, fence=f"{tag}:fence", signal=f"{tag}:signal", waiters=f"{tag}:waiters")


def validate_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not prefix:
        raise ConfigurationError(f"prefix must be a non-empty string, got {prefix!r}")
    bad = set(prefix) & set("{}*?[]\\ \t\r\n")
    if bad:
        raise ConfigurationError(
            f"prefix {prefix!r} contains {''.join(sorted(bad))!r}: braces would break the "
            "cluster hash tag and glob characters would break SCAN of our keys; use "
            "letters, digits and ':' '_' '-' '.'"
        )
    return prefix


def validate_name(name: object) -> str:
    if not isinstance(name, str):
        raise ConfigurationError(
            f"lock name must be a str, got {type(name).__name__} {name!r}; derive one with "
            "celery_singleton_lock.keys if it comes from task arguments"
        )
    if not name:
        raise ConfigurationError("lock name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"lock name is {len(name)} characters, more than {MAX_NAME_LENGTH}; hash long "
            "names (celery_singleton_lock.keys does) instead of using them as keys"
        )
    return name


def _new_token(token: object) -> str:
    if token is None:
        return secrets.token_hex(16)
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH:
        raise ConfigurationError(
            f"token must be a non-empty str of at most {MAX_TOKEN_LENGTH} characters, "
            f"got {token!r}; leave it out to get a random one"
        )
    return token


# -- the lease ----------------------------------------------------------------------


class _LeaseState:
    """The mutable side of a lease: renewed expiry, lost/released flags, callbacks.

    Kept apart so ``Lease`` itself stays immutable and hashable. Pickles without its
    callbacks (a lease sent to another process carries its identity, not its hooks).
    """

    __slots__ = ("callbacks", "expires_at", "lost_reason", "released")

    def __init__(self, expires_at: float) -> None:
        self.expires_at = expires_at
        self.lost_reason: str | None = None
        self.released = False
        self.callbacks: list[LostCallback] = []

    def __getstate__(self) -> dict[str, Any]:
        return {
            "expires_at": self.expires_at,
            "lost_reason": self.lost_reason,
            "released": self.released,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.expires_at = state["expires_at"]
        self.lost_reason = state["lost_reason"]
        self.released = state["released"]
        self.callbacks = []


@dataclass(frozen=True)
class Lease:
    """A held lock: who holds it (``token``), its fencing token, and until when.

    Immutable and free of thread-local state: any thread or process holding this
    handle (it pickles) can release or extend it. ``expires_at`` is on this process's
    ``time.monotonic()`` clock: the server's TTL minus the round trip that set it, so
    it errs early, never late.
    """

    name: str
    key: str
    token: str
    fence: int
    ttl: float
    _state: _LeaseState = field(compare=False, repr=False)

    @property
    def expires_at(self) -> float:
        return self._state.expires_at

    @property
    def lost(self) -> bool:
        """True once the lease is known to be lost or its expiry estimate has passed."""
        return self._state.lost_reason is not None or (
            not self._state.released and self.remaining() <= 0
        )

    def remaining(self) -> float:
        """Seconds until the lease expires unless renewed (0 when already past)."""
        return max(0.0, self._state.expires_at - time.monotonic())

    def check(self) -> None:
        """Raise ``LockLostError`` if this lease can no longer be trusted to be held.

        Call it before a side effect that must not happen twice; pair it with the
        ``fence`` where the store can compare fences, since a check can pass just
        before a pause that outlives the lease.
        """
        reason = self._state.lost_reason
        if reason is None and not self._state.released and self.remaining() <= 0:
            reason = "its ttl ran out without a renewal"
        if reason is not None:
            raise LockLostError(
                f"lease on {self.name!r} (fence {self.fence}) was lost: {reason}",
                key=self.key,
                reason=reason,
            )

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` (from the renewal thread) when the lease is found lost."""
        self._state.callbacks.append(callback)

    def _renewed(self, expires_at: float) -> None:
        self._state.expires_at = expires_at

    def _mark_lost(self, reason: str) -> None:
        state = self._state
        if state.released or state.lost_reason is not None:
            return
        state.lost_reason = reason
        logger.warning("lost %s (fence %d): %s", self.key, self.fence, reason)
        for callback in list(state.callbacks):
            try:
                callback(self)
            except Exception:
                logger.exception("lost-lease callback for %s raised", self.key)


@dataclass(frozen=True)
class Contended:
    """A failed try: ``holder`` owns it ('' if the value is foreign), for ``retry_after`` s."""

    name: str
    key: str
    holder: str
    retry_after: float | None  # seconds; None when the holder's key has no TTL

    def error(self) -> LockNotAcquiredError:
        wait = "no ttl" if self.retry_after is None else f"{self.retry_after:.3f}s left"
        return LockNotAcquiredError(
            f"lock {self.name!r} is held by {self.holder or 'an unknown owner'!r} ({wait})",
            key=self.key,
            holder=self.holder or None,
            retry_after=self.retry_after,
        )


@contextmanager
def _releasing(lease: Lease) -> Iterator[None]:
    """Mark the lease released while its release is in flight, and keep the mark on success.

    Set before sending so that a renewal answered "expired" just after our own delete is
    not reported as a loss; cleared again if the release fails in transport, so the
    handle stays usable for a retry.
    """
    lease._state.released = True
    try:
        yield
    except BaseException:
        lease._state.released = False
        raise


# -- the acquire loop, written once for both clients --------------------------------
# The blocking acquire is a generator of steps ("try", "block", "sleep") so the sync and
# asyncio clients share the decisions and only differ in how they perform I/O.


@dataclass(frozen=True)
class _Call:
    """One validated acquire request."""

    name: str
    keys: LockKeys
    token: str
    ttl_ms: int
    replace: str  # '' for none
    shape: tuple[str, str]  # ('', '') for none
    fenced: bool


def _granted_lease(call: _Call, *, fence: int, sent_at: float) -> Lease:
    """The lease ``call`` holds once granted; its TTL counts from when it was sent."""
    ttl = call.ttl_ms / 1000
    return Lease(
        name=call.name,
        key=call.keys.lock,
        token=call.token,
        fence=fence,
        ttl=ttl,
        _state=_LeaseState(expires_at=sent_at + ttl),
    )


@dataclass(frozen=True)
class _Try:
    announce: bool  # register as a waiter if this try fails (push waits only)


@dataclass(frozen=True)
class _Block:
    seconds: float


@dataclass(frozen=True)
class _Sleep:
    seconds: float


_Step: TypeAlias = _Try | _Block | _Sleep


def _acquire_steps(
    *,
    blocking: bool,
    timeout: float | None,
    wait: WaitMode,
    backoff_base: float,
    backoff_cap: float,
) -> Generator[_Step, Lease | Contended | None, Lease | Contended]:
    deadline = None if timeout is None else time.monotonic() + timeout
    attempt = 0
    announce = blocking and wait == "push"
    while True:
        outcome = yield _Try(announce)
        if outcome is None:
            raise RuntimeError("acquire plan resumed without the outcome of its try")
        if isinstance(outcome, Lease) or not blocking:
            return outcome
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return outcome
        # Never wait past the holder's TTL: a holder that dies without releasing sends
        # no wake-up, so its expiry is the latest moment the lock can become free.
        cap = NO_TTL_RECHECK if outcome.retry_after is None else outcome.retry_after
        bound = cap if left is None else min(cap, left)
        if wait == "push":
            # BLPOP's timeout 0 means "forever"; 1 ms is the finest it honours.
            yield _Block(max(bound, 0.001))
        else:
            delay = full_jitter(attempt, base=backoff_base, cap=backoff_cap)
            yield _Sleep(min(delay, bound))
            attempt += 1


# -- the clients --------------------------------------------------------------------


def redacted_url(client: Any) -> str:
    """Where ``client`` connects, for messages and logs: never includes the password."""
    kwargs: dict[str, Any] = getattr(
        getattr(client, "connection_pool", None), "connection_kwargs", {}
    )
    user = kwargs.get("username")
    auth = f"{user}:***@" if user else ("***@" if kwargs.get("password") else "")
    if "path" in kwargs:
        return f"unix://{auth}{kwargs['path']}?db={kwargs.get('db', 0)}"
    pool_class = getattr(getattr(client, "connection_pool", None), "connection_class", None)
    scheme = "rediss" if pool_class is not None and "SSL" in pool_class.__name__ else "redis"
    host = kwargs.get("host", "localhost")
    return f"{scheme}://{auth}{host}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


class _LockBase:
    """What both clients share: key layout, validation and reply decoding. No I/O."""

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = DEFAULT_PREFIX,
        allow_long_ttl: bool = False,
        backoff_base: float = 0.005,
        backoff_cap: float = 0.5,
    ) -> None:
        self.client = client
        self.prefix = validate_prefix(prefix)
        self.allow_long_ttl = allow_long_ttl
        self.backoff_base = to_seconds(backoff_base, what="backoff_base")
        self.backoff_cap = to_seconds(backoff_cap, what="backoff_cap")
        # Per-client registration (EVALSHA; redis-py reloads on NOSCRIPT after a restart).
        self._acquire_script = client.register_script(_scripts.ACQUIRE)
        self._release_script = client.register_script(_scripts.RELEASE)
        self._extend_script = client.register_script(_scripts.EXTEND)
        self._release_matching_script = client.register_script(_scripts.RELEASE_MATCHING)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redacted_url(self.client)}, prefix={self.prefix!r})"

    def keys(self, name: str) -> LockKeys:
        """The Redis keys lock ``name`` uses under this prefix."""
        return LockKeys.build(self.prefix, validate_name(name))

    def _ttl_ms(self, ttl: object) -> int:
        return ttl_to_ms(ttl, allow_long=self.allow_long_ttl)

    def _acquire_call(
        self,
        name: str,
        ttl: object,
        token: object,
        replace: object,
        shape: object = None,
        *,
        fenced: bool = True,
    ) -> _Call:
        # Validate everything before the first byte goes to Redis.
        if replace is not None and (not isinstance(replace, str) or not replace):
            raise ConfigurationError(f"replace must be a non-empty token or None, got {replace!r}")
        if shape is not None and not (
            isinstance(shape, tuple)
            and len(shape) == 2
            and all(isinstance(part, str) for part in shape)
            and shape[0]
        ):
            raise ConfigurationError(
                f"replace_shape must be (prefix, suffix) with a non-empty prefix, got {shape!r}"
            )
        return _Call(
            name=name,
            keys=self.keys(name),
            token=_new_token(token),
            ttl_ms=self._ttl_ms(ttl),
            replace=replace or "",
            shape=shape or ("", ""),
            fenced=fenced,
        )

    @staticmethod
    def _acquire_argv(call: _Call, step: _Try) -> _ScriptArgs:
        keys = call.keys
        return {
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

    def _acquired(self, call: _Call, *, sent_at: float, reply: Any) -> Lease | Contended:
        if int(reply[0]) == 1:
            lease = _granted_lease(call, fence=int(reply[1]), sent_at=sent_at)
            logger.debug("acquired %s (fence %d)", lease.key, lease.fence)
            return lease
        pttl = int(reply[2])
        return Contended(
            name=call.name,
            key=call.keys.lock,
            holder=_text(reply[1]),
            retry_after=None if pttl < 0 else pttl / 1000,
        )

    def _extend_call(self, lease: Lease, ttl: object | None) -> tuple[LockKeys, int]:
        return self.keys(lease.name), self._ttl_ms(lease.ttl if ttl is None else ttl)

    @staticmethod
    def _granted(outcome: Lease | Contended, on_lost: LostCallback | None) -> Lease:
        """The end of a blocking acquire: the lease, or the error naming the holder."""
        if isinstance(outcome, Contended):
            raise outcome.error()
        if on_lost is not None:
            outcome.on_lost(on_lost)
        return outcome

    def _release_argv(self, name: str, token: str) -> _ScriptArgs:
        keys = self.keys(name)
        return {
            "keys": [keys.lock, keys.signal, keys.waiters],
            "args": [token, SIGNAL_TTL_MS],
        }

    @staticmethod
    def _extended(lease: Lease, ttl_ms: int, sent_at: float, reply: Any) -> ExtendResult:
        result = _decode(reply, ExtendResult)
        if result is ExtendResult.EXTENDED:
            lease._renewed(sent_at + ttl_ms / 1000)
        else:
            lease._mark_lost(_LOSS[result])
        return result

    @staticmethod
    def _released(lease: Lease, reply: Any) -> ReleaseResult:
        result = _decode(reply, ReleaseResult)
        if result is ReleaseResult.RELEASED:
            logger.debug("released %s (fence %d)", lease.key, lease.fence)
        else:
            logger.info("release of %s (fence %d): %s", lease.key, lease.fence, result.name)
            # Recorded, not reported: the holder is letting go and learns it from the result.
            lease._state.lost_reason = lease._state.lost_reason or _LOSS[result]
        return result

    def _acquire_plan(
        self, blocking: bool, timeout: object | None, wait: object
    ) -> Generator[_Step, Lease | Contended | None, Lease | Contended]:
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
        )

    def _check_socket_timeout(self, timeout: float | None) -> None:
        kwargs = getattr(getattr(self.client, "connection_pool", None), "connection_kwargs", {})
        socket_timeout = kwargs.get("socket_timeout")
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


class RedisLock(_LockBase):
    """Leases on named locks in one Redis, one round trip per operation.

    Fencing tokens: each successful acquire of a name returns a ``fence`` strictly
    greater than every earlier fence of that name. The script takes
    ``max(server TIME in microseconds, last fence + 1)``; the last fence is kept in one
    key per lock that expires with the lease (refreshed by each extend), so fencing
    state is bounded by the number of locks held within the last ``ttl``, never one
    key per name forever. Assumptions: the Redis server's clock does not step back
    by more than the time between two acquisitions of one name, and at most one
    acquisition of a name per microsecond (a lock round trip takes far longer), and
    fences below 2**53 (Lua numbers are doubles; TIME in microseconds gets there in the
    year 2255). A
    server restart with persistence off loses the state but not monotonicity, as the
    fence restarts from the clock.

    Safety rests on a single Redis primary: a failover to a replica that missed the
    last write can hand the same lock out twice. Fences exist to catch exactly that.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        allow_long_ttl: bool = False,
        backoff_base: float = 0.005,
        backoff_cap: float = 0.5,
        renewer: Renewer | None = None,
    ) -> None:
        if isinstance(client, redis.asyncio.Redis):
            raise ConfigurationError("RedisLock needs a sync redis.Redis; use AsyncRedisLock")
        super().__init__(
            client,
            prefix=prefix,
            allow_long_ttl=allow_long_ttl,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
        )
        self._renewer = renewer
        self._wire = Wire(client)

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, **client_options: Any
    ) -> RedisLock:
        """Connect to ``url``: ``redis://``, ``rediss://`` or ``unix://``, user/password allowed."""
        return cls(redis.Redis.from_url(url, **client_options), prefix=prefix)

    @property
    def renewer(self) -> Renewer:
        return self._renewer if self._renewer is not None else get_renewer()

    def try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        replace: str | None = None,
        replace_shape: tuple[str, str] | None = None,
        fenced: bool = True,
    ) -> Lease | Contended:
        """One attempt, one round trip: a ``Lease``, or ``Contended`` naming the holder.

        ``replace``: a token the caller may take over, e.g. the hold its own queued
        message took at dispatch; the lock passes from that token to the new lease in
        one step, with a new fence. ``replace_shape``: or any token starting with
        ``prefix`` and ending with ``suffix`` (a hold whose random part is unknown here).
        ``fenced=False``: a hold that only keeps others out and never guards a write
        skips the fencing work (its ``fence`` is 0).
        """
        return self.begin_try_acquire(
            name, ttl, token=token, replace=replace, replace_shape=replace_shape, fenced=fenced
        ).outcome()

    def begin_try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        replace: str | None = None,
        replace_shape: tuple[str, str] | None = None,
        fenced: bool = True,
    ) -> PendingAcquire:
        """``try_acquire`` in two halves: send now, ``.outcome()`` reads the answer.

        The round trip overlaps whatever the caller does in between (Celery's dispatch
        builds its message meanwhile). Validation errors raise here, before anything is
        sent; transport errors may raise from either half.
        """
        call = self._acquire_call(name, ttl, token, replace, replace_shape, fenced=fenced)
        return self._send_try(call, _Try(announce=False))

    def _send_try(self, call: _Call, step: _Try) -> PendingAcquire:
        sent_at = time.monotonic()
        if call.fenced or call.replace or call.shape[0] or step.announce:
            reply = self._wire.send(self._acquire_script, **self._acquire_argv(call, step))
        else:
            # A plain hold (a queued message's) needs none of the script's extra steps.
            reply = self._wire.send_hold(
                call.keys.lock,
                call.token,
                call.ttl_ms,
                lambda: self._acquire_script(**self._acquire_argv(call, step)),
            )
        return PendingAcquire(self, call, sent_at, reply)

    def _try(self, call: _Call, step: _Try) -> Lease | Contended:
        return self._send_try(call, step).outcome()

    def acquire(
        self,
        name: str,
        ttl: object,
        *,
        blocking: bool = True,
        timeout: object | None = None,
        wait: WaitMode = "push",
        token: str | None = None,
        replace: str | None = None,
        replace_shape: tuple[str, str] | None = None,
        renew: bool = False,
        on_lost: LostCallback | None = None,
    ) -> Lease:
        """Take the lock, waiting up to ``timeout`` seconds (None: as long as it takes).

        ``wait="push"`` sleeps in BLPOP and is woken by the release (it holds one pooled
        connection while it waits); ``wait="spin"`` retries with exponential backoff
        and full jitter. Either way no wait outlasts the holder's TTL. With
        ``renew=True`` the process's renewal thread keeps the lease alive until
        ``release``. Raises ``LockNotAcquiredError`` naming the holder on failure.
        """
        call = self._acquire_call(name, ttl, token, replace, replace_shape)
        plan = self._acquire_plan(blocking, timeout, wait)
        step = next(plan)
        try:
            while True:
                if isinstance(step, _Try):
                    step = plan.send(self._try(call, step))
                elif isinstance(step, _Block):
                    self.client.blpop([call.keys.signal], timeout=step.seconds)
                    step = next(plan)
                else:
                    time.sleep(step.seconds)
                    step = next(plan)
        except StopIteration as done:
            lease = self._granted(done.value, on_lost)
        if renew:
            self.renewer.add(self, lease)
        return lease

    def renew(self, lease: Lease) -> None:
        """Keep ``lease`` alive from the process's renewal thread until it is released."""
        self.renewer.add(self, lease)

    def hand_over(self, lease: Lease, ttl: object, *, token: str) -> Lease | Contended:
        """Pass the lock from ``lease`` to ``token`` in one step (e.g. to a retry's message).

        Stops renewing ``lease``; on success it counts as released. ``Contended`` means
        ``lease`` had already lost the lock to someone else.
        """
        self.renewer.discard(lease)
        with _releasing(lease):
            outcome = self.try_acquire(lease.name, ttl, token=token, replace=lease.token)
        if isinstance(outcome, Contended):
            lease._state.lost_reason = lease._state.lost_reason or _LOSS[ReleaseResult.NOT_OWNER]
        return outcome

    def release(self, lease: Lease) -> ReleaseResult:
        """Delete the lock if ``lease`` still owns it, and wake one waiter.

        A transport error propagates and leaves the lease as it was, so the caller can
        retry with the same handle (unlike redis-py #4258, nothing is forgotten first).
        """
        with _releasing(lease):
            reply = self._send_release(lease).get()
        return self._released(lease, reply)

    def release_nowait(self, lease: Lease) -> None:
        """``release`` without waiting for the answer: it is read with this thread's next
        call (a lost lease is logged then). The release itself reaches Redis at once.

        For the end of a task, where nobody acts on the result: the pool child is free
        for its next task a round trip sooner.
        """
        with _releasing(lease):
            reply = self._send_release(lease, whole=True)
        self._wire.defer(reply, lambda answer: self._released(lease, answer))

    def _send_release(self, lease: Lease, *, whole: bool = False) -> Reply:
        argv = self._release_argv(lease.name, lease.token)
        # Stop renewing first: a renewal racing the release must not report a loss.
        self.renewer.discard(lease)
        return self._wire.send(self._release_script, **argv, whole=whole)

    def release_token(self, name: str, token: str) -> ReleaseResult:
        """Release ``name`` if ``token`` holds it: for a holder known only by its token."""
        argv = self._release_argv(name, token)
        return _decode(self._wire.call(self._release_script, **argv), ReleaseResult)

    def release_matching(self, name: str, prefix: str, suffix: str = "") -> ReleaseResult:
        """Release ``name`` if its token starts with ``prefix`` and ends with ``suffix``.

        For releasing on behalf of a dead holder whose token shape is known but not its
        random part; the prefix must be specific enough to name that holder alone.
        """
        if not prefix:
            raise ConfigurationError("release_matching needs a non-empty prefix")
        keys = self.keys(name)
        reply = self._wire.call(
            self._release_matching_script,
            keys=[keys.lock, keys.signal, keys.waiters],
            args=[prefix, suffix, SIGNAL_TTL_MS],
        )
        return _decode(reply, ReleaseResult)

    def extend(self, lease: Lease, ttl: object | None = None) -> ExtendResult:
        """Reset the lease's TTL to ``ttl`` (default: its own) if it still owns the lock."""
        keys, ttl_ms = self._extend_call(lease, ttl)
        sent_at = time.monotonic()
        reply = self._wire.call(
            self._extend_script, keys=[keys.lock, keys.fence], args=[lease.token, ttl_ms]
        )
        return self._extended(lease, ttl_ms, sent_at, reply)

    def holder(self, name: str) -> str | None:
        """The token currently holding ``name`` (None when free)."""
        value = self.client.get(self.keys(name).lock)
        return None if value is None else _text(value)

    @contextmanager
    def hold(
        self, name: str, ttl: object, *, renew: bool = True, **options: Any
    ) -> Iterator[Lease]:
        """``with lock.hold("name", ttl=30) as lease:`` acquire, renew, release on exit."""
        lease = self.acquire(name, ttl, renew=renew, **options)
        try:
            yield lease
        finally:
            self.release(lease)


class PendingAcquire:
    """An acquire that was sent and whose answer has not been read (``begin_try_acquire``).

    ``outcome()`` reads it once and returns the same ``Lease`` or ``Contended`` after.
    Read it even when no longer interested: it returns the pooled connection, and a
    ``Lease`` it grants holds the lock until released or expired.
    """

    __slots__ = ("_call", "_lock", "_outcome", "_reply", "_sent_at")

    def __init__(self, lock: _LockBase, call: _Call, sent_at: float, reply: Reply) -> None:
        self._lock = lock
        self._call = call
        self._sent_at = sent_at
        self._reply: Reply | None = reply
        self._outcome: Lease | Contended | None = None

    @classmethod
    def settled(cls, outcome: Lease | Contended) -> PendingAcquire:
        """One whose answer is already known (stores without a wire, e.g. memory)."""
        pending = cls.__new__(cls)
        pending._reply = None
        pending._outcome = outcome
        return pending

    @property
    def name(self) -> str:
        return self._call.name if self._outcome is None else self._outcome.name

    def presumed(self) -> Lease | None:
        """The lease this grants if the answer is yes, before it is read: to renew at once.

        None when the answer is known to be no. Unfenced acquires only (a fence comes
        from the answer). Renewing a presumed lease that was refused is harmless: its
        extend is owner-checked.
        """
        if self._outcome is not None:
            return self._outcome if isinstance(self._outcome, Lease) else None
        call = self._call
        if call.fenced:
            raise RuntimeError("presumed() needs an unfenced acquire whose answer is unread")
        return _granted_lease(call, fence=0, sent_at=self._sent_at)

    def outcome(self) -> Lease | Contended:
        if self._outcome is None:
            assert self._reply is not None  # noqa: S101  (set for every unsettled one)
            reply = self._reply.get()
            self._outcome = self._lock._acquired(self._call, sent_at=self._sent_at, reply=reply)
        return self._outcome


class AsyncRedisLock(_LockBase):
    """The asyncio twin of ``RedisLock``: same scripts, same semantics, ``await`` each call.

    Renewal runs as one asyncio task per renewed lease on the caller's event loop.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        allow_long_ttl: bool = False,
        backoff_base: float = 0.005,
        backoff_cap: float = 0.5,
    ) -> None:
        if not isinstance(client, redis.asyncio.Redis):
            raise ConfigurationError("AsyncRedisLock needs a redis.asyncio.Redis; use RedisLock")
        super().__init__(
            client,
            prefix=prefix,
            allow_long_ttl=allow_long_ttl,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
        )
        self._renewals: dict[str, asyncio.Task[None]] = {}

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, **client_options: Any
    ) -> AsyncRedisLock:
        """Connect to ``url``: ``redis://``, ``rediss://`` or ``unix://``, user/password allowed."""
        return cls(redis.asyncio.Redis.from_url(url, **client_options), prefix=prefix)

    async def try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        replace: str | None = None,
        replace_shape: tuple[str, str] | None = None,
    ) -> Lease | Contended:
        """See ``RedisLock.try_acquire``."""
        call = self._acquire_call(name, ttl, token, replace, replace_shape)
        return await self._try(call, _Try(announce=False))

    async def _try(self, call: _Call, step: _Try) -> Lease | Contended:
        sent_at = time.monotonic()
        reply = await self._acquire_script(**self._acquire_argv(call, step))
        return self._acquired(call, sent_at=sent_at, reply=reply)

    async def acquire(
        self,
        name: str,
        ttl: object,
        *,
        blocking: bool = True,
        timeout: object | None = None,
        wait: WaitMode = "push",
        token: str | None = None,
        replace: str | None = None,
        replace_shape: tuple[str, str] | None = None,
        renew: bool = False,
        on_lost: LostCallback | None = None,
    ) -> Lease:
        """See ``RedisLock.acquire``."""
        call = self._acquire_call(name, ttl, token, replace, replace_shape)
        plan = self._acquire_plan(blocking, timeout, wait)
        step = next(plan)
        try:
            while True:
                if isinstance(step, _Try):
                    step = plan.send(await self._try(call, step))
                elif isinstance(step, _Block):
                    await self.client.blpop([call.keys.signal], timeout=step.seconds)
                    step = next(plan)
                else:
                    await asyncio.sleep(step.seconds)
                    step = next(plan)
        except StopIteration as done:
            lease = self._granted(done.value, on_lost)
        if renew:
            self._renewals[lease.token] = asyncio.create_task(self._renew(lease))
        return lease

    async def _renew(self, lease: Lease) -> None:
        delay: float | None = lease.ttl / 3
        while delay is not None:
            await asyncio.sleep(delay)
            try:
                result: ExtendResult | Exception = await self.extend(lease)
            except redis.RedisError as error:
                result = error
            delay = Renewer.next_delay(lease, result)

    async def release(self, lease: Lease) -> ReleaseResult:
        """See ``RedisLock.release``."""
        argv = self._release_argv(lease.name, lease.token)
        renewal = self._renewals.pop(lease.token, None)
        if renewal is not None:
            renewal.cancel()
        with _releasing(lease):
            reply = await self._release_script(**argv)
        return self._released(lease, reply)

    async def extend(self, lease: Lease, ttl: object | None = None) -> ExtendResult:
        """See ``RedisLock.extend``."""
        keys, ttl_ms = self._extend_call(lease, ttl)
        sent_at = time.monotonic()
        reply = await self._extend_script(keys=[keys.lock, keys.fence], args=[lease.token, ttl_ms])
        return self._extended(lease, ttl_ms, sent_at, reply)

    async def holder(self, name: str) -> str | None:
        """The token currently holding ``name`` (None when free)."""
        value = await self.client.get(self.keys(name).lock)
        return None if value is None else _text(value)
