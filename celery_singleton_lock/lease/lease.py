"""The lease handle: who holds a lock, until when on which clock, and how a loss is reported."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeAlias, TypedDict

from ..exceptions import (
    ConfigurationError,
    LockLostError,
    TaskCancelledError,
)
from .clock import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)

LostCallback: TypeAlias = Callable[["Lease"], object]


# Why a lease yielding to another lock was cancelled (``Lease.yield_to``).
YIELDED = "a newer call is waiting for its key"
# Why a lease whose expiry estimate passed with no renewal answered is lost.
RAN_OUT = "its ttl ran out without a renewal"

# This process's clock may run slower than the server's: a lease is taken as ended this
# share of its ttl early, plus a fixed margin (Redlock's clock drift factor and its 2 ms),
# so it never outlives the server's key on a clock up to 1% slow. Real oscillators are
# off by a few hundred parts per million at worst.
CLOCK_DRIFT = 0.01
DRIFT_MARGIN = 0.002


def valid_until(sent_at: float, ttl: float) -> float:
    """When a lease that a request sent at ``sent_at`` (monotonic) granted or renewed for
    ``ttl`` seconds must be taken as ended here: never after the server's key expires."""
    return sent_at + ttl * (1 - CLOCK_DRIFT) - DRIFT_MARGIN


# The renewal thread and the holder's check() can find one loss at the same moment:
# each loss (and cancel) is reported once, whoever finds it first.
_reporting = threading.Lock()
# Signalled once a lost lease's callbacks have run: check() waits for them (REPORT_WAIT).
_reported = threading.Condition(_reporting)
REPORT_WAIT = 1.0


class _State(TypedDict):
    """What of a lease's state survives pickling (callbacks do not)."""

    expires_at: float
    lost_reason: str | None
    released: bool
    cancel_reason: str | None
    yields_to: tuple[str, float] | None


class _LeaseState:
    """The mutable side of a lease: renewed expiry, lost/released flags, callbacks.

    Kept apart so ``Lease`` itself stays immutable and hashable. Pickles without its
    callbacks (a lease sent to another process carries its identity, not its hooks).
    """

    __slots__ = (
        "callbacks",
        "cancel_callbacks",
        "cancel_reason",
        "clock",
        "expires_at",
        "lost_reason",
        "released",
        "reporter",
        "yields_to",
    )

    def __init__(self, expires_at: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.expires_at = expires_at
        self.clock = clock  # what expires_at counts on
        self.lost_reason: str | None = None
        self.released = False
        self.callbacks: list[LostCallback] = []
        self.cancel_reason: str | None = None
        self.cancel_callbacks: list[LostCallback] = []
        self.yields_to: tuple[str, float] | None = None
        self.reporter: int | None = None  # the thread running the on_lost callbacks

    def __getstate__(self) -> _State:
        return {
            "expires_at": self.expires_at,
            "lost_reason": self.lost_reason,
            "released": self.released,
            "cancel_reason": self.cancel_reason,
            "yields_to": self.yields_to,
        }

    def __setstate__(self, state: _State) -> None:
        self.expires_at = state["expires_at"]
        self.lost_reason = state["lost_reason"]
        self.released = state["released"]
        self.cancel_reason = state.get("cancel_reason")
        self.yields_to = state.get("yields_to")
        self.callbacks = []
        self.cancel_callbacks = []
        self.reporter = None
        self.clock = SYSTEM_CLOCK  # a manual clock is one process's: this one counts anew


@dataclass(frozen=True)
class Lease:
    """A held lock: who holds it (``token``), its fencing token, and until when.

    Immutable and free of thread-local state: any thread or process holding this
    handle (it pickles) can release or extend it. ``expires_at`` is on this process's
    ``time.monotonic()`` clock (a ``MemoryLock``'s own clock for its leases): the
    server's TTL counted from before the request that set it, less an allowance for a
    slow clock (``valid_until``), so it errs early, never late.
    """

    name: str
    key: str
    token: str
    fence: int
    ttl: float
    _state: _LeaseState = field(compare=False, repr=False)

    @classmethod
    def granted(
        cls,
        name: str,
        key: str,
        token: str,
        *,
        fence: int,
        ttl: float,
        sent_at: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> Lease:
        """A lease granted by a request sent at ``sent_at`` (on ``clock``): its TTL counts
        from then."""
        return cls(name, key, token, fence, ttl, _LeaseState(valid_until(sent_at, ttl), clock))

    @classmethod
    def handed(
        cls, name: str, key: str, token: str, *, fence: int, ttl: float, expires_at: float
    ) -> Lease:
        """A lease another process of this machine was granted, with its estimate of the
        end (``expires_at``: the monotonic clock is the machine's)."""
        return cls(name, key, token, fence, ttl, _LeaseState(expires_at))

    def copy(self, ttl: float) -> Lease:
        """A handle of its own on the same hold (one Redlock master's view)."""
        copy = Lease.handed(
            self.name, self.key, self.token, fence=self.fence, ttl=ttl, expires_at=self.expires_at
        )
        if self.yields_to is not None:
            copy.yield_to(*self.yields_to)
        return copy

    @classmethod
    def unlocked(cls, name: str, ttl: float, reason: str) -> Lease:
        """A stand-in for a lease that could not be taken (``fail_open``): never held.

        Its token is empty (nothing to release or renew) and ``check()`` raises with
        ``reason``, so code that guards a write with it learns it ran unlocked.
        """
        state = _LeaseState(expires_at=float("inf"))
        state.lost_reason = reason
        return cls(name=name, key="", token="", fence=0, ttl=ttl, _state=state)

    @staticmethod
    def require(value: object, what: str) -> Lease:
        """``value`` if it is a lease, else an error naming what the call takes."""
        if not isinstance(value, Lease):
            raise ConfigurationError(
                f"{what} takes the Lease an acquire returned, got {type(value).__name__} {value!r}"
            )
        return value

    @property
    def expires_at(self) -> float:
        return self._state.expires_at

    @property
    def released(self) -> bool:
        return self._state.released

    @property
    def lost(self) -> bool:
        """True once the lease is known to be lost or its expiry estimate has passed."""
        return self._state.lost_reason is not None or (
            not self._state.released and self.remaining() <= 0
        )

    def remaining(self) -> float:
        """Seconds until the lease expires unless renewed (0 when already past)."""
        return max(0.0, self._state.expires_at - self._state.clock.monotonic())

    @property
    def cancelled(self) -> bool:
        """True once the renewal found the lock this lease yields to held (``yield_to``):
        the lease is still held and renewed; its holder is asked to stop."""
        return self._state.cancel_reason is not None

    @property
    def yields_to(self) -> tuple[str, float] | None:
        """(the lock's name, how often it is looked at) set by ``yield_to``, or None."""
        return self._state.yields_to

    def yield_to(self, name: str, every: float) -> None:
        """Cancel this lease once lock ``name`` is held by anyone: its renewal looks every
        ``every`` seconds (sooner than ttl/3 when shorter), in the same round trip."""
        if every <= 0:
            raise ConfigurationError(f"yield_to: every must be positive, got {every!r}")
        self._state.yields_to = (name, every)

    def check(self) -> None:
        """Raise ``LockLostError`` if this lease can no longer be trusted to be held, and
        ``TaskCancelledError`` (a ``LockLostError``) once it is cancelled.

        Call it before a side effect that must not happen twice; pair it with the
        ``fence`` where the store can compare fences, since a check can pass just
        before a pause that outlives the lease.
        """
        if self._state.lost_reason is None and not self._state.released and self.remaining() <= 0:
            # Reported here too, not only by the renewal thread's deadline a moment
            # later: on_lost has then run before the first check() that raises.
            self.mark_lost(RAN_OUT)
        self._await_report()
        reason = self._state.lost_reason
        if reason is None and self._state.released:
            reason = "its holder released it"
        if reason is not None:
            raise LockLostError(
                f"lease on {self.name!r} (fence {self.fence}) was lost: {reason}",
                name=self.name,
                key=self.key,
                reason=reason,
            )
        cancelled = self._state.cancel_reason
        if cancelled is not None:
            raise TaskCancelledError(
                f"the run holding {self.name!r} (fence {self.fence}) was cancelled: {cancelled}",
                name=self.name,
                key=self.key,
                reason=cancelled,
            )

    def _await_report(self) -> None:
        """Let another thread that is running the on_lost callbacks finish first: then
        they have run by the time check() raises, whoever found the loss."""
        state, deadline = self._state, time.monotonic() + REPORT_WAIT
        with _reported:
            while state.reporter not in (None, threading.get_ident()):
                if not _reported.wait(max(0.0, deadline - time.monotonic())):
                    return

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` once, when the lease is found lost: from the renewal
        thread, or from the thread whose ``check()`` found its ttl run out first."""
        self._state.callbacks.append(callback)

    def on_cancel(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` (from the renewal thread) when the lease is cancelled."""
        self._state.cancel_callbacks.append(callback)

    # -- what a lock store records on the handle (RedisLock, MemoryLock, the renewer) ---
    # Public so that the stores need no reach into the handle; task code has no use
    # for them: a store calls them as its server answers.

    def renewed(self, expires_at: float) -> None:
        """An extend was granted: the lease now runs until ``expires_at`` (monotonic)."""
        self._state.expires_at = expires_at

    def note_loss(self, reason: str) -> None:
        """Record a loss without reporting it (the holder learns it from a result)."""
        self._state.lost_reason = self._state.lost_reason or reason

    def mark_lost(self, reason: str) -> None:
        """Record a loss and report it: a warning and every ``on_lost`` callback, once."""
        state = self._state
        with _reporting:
            if state.released or state.lost_reason is not None:
                return
            state.lost_reason = reason
            state.reporter = threading.get_ident()
        try:
            logger.warning("lost %s (fence %d): %s", self.key, self.fence, reason)
            for callback in list(state.callbacks):
                try:
                    callback(self)
                except Exception:
                    logger.exception("lost-lease callback for %s raised", self.key)
        finally:
            with _reported:
                state.reporter = None
                _reported.notify_all()

    def mark_cancelled(self, reason: str) -> None:
        """Record a cancellation and report it: a log line and every ``on_cancel``
        callback, once. The lease stays held (renewed) until its holder lets go."""
        state = self._state
        with _reporting:
            if state.cancel_reason is not None or state.released:
                return
            state.cancel_reason = reason
        logger.info("cancelled %s (fence %d): %s", self.key, self.fence, reason)
        for callback in list(state.cancel_callbacks):
            try:
                callback(self)
            except Exception:
                logger.exception("cancel callback for %s raised", self.key)

    def mark_released(self) -> None:
        """Released: renewal stops reporting it, ``check()`` no longer raises for its ttl."""
        self._state.released = True

    @contextmanager
    def releasing(self) -> Iterator[bool]:
        """For the stores: marked released while its release is in flight, and kept so on
        success; yields whether it had been released already (a second release).

        Set before sending so that a renewal answered "expired" just after our own delete
        is not reported as a loss; cleared again if the release fails in transport, so
        the handle stays usable for a retry.
        """
        again = self._state.released
        self._state.released = True
        try:
            yield again
        except BaseException:
            self._state.released = again
            raise
