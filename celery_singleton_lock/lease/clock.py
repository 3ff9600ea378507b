"""The clock a lease counts its time on: the machine's, or a manual one a test moves by hand.

A Redis lease ends on the server's clock, so ``RedisLock`` always counts on the machine's.
``MemoryLock`` (for ``task_always_eager`` tests) keeps its own time on a ``ManualClock``: ttls
run out, windows close and rate slots come due at ``clock.advance(seconds)``, not a real wait.
"""

from __future__ import annotations

import threading
import time
import weakref

from .._time import to_seconds


class Clock:
    """The machine's clocks: ``time.monotonic`` for leases, ``time.time`` for rate slots;
    ``offset`` seconds ahead of them once a test moved a store's time by hand."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def time(self) -> float:
        return time.time() + self.offset

    def later(self, seconds: float) -> Clock:
        """This clock ``seconds`` ahead: where a store goes back to after a manual clock
        moved on by that much (its leases and slots were counted on it)."""
        return Clock(self.offset + seconds)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def attach(self, condition: threading.Condition) -> None:
        """A store's ``condition``, its waits on this clock: nothing to do here."""

    def wait(self, condition: threading.Condition, seconds: float | None) -> None:
        """Wait on ``condition`` (held by the caller) for a notify or ``seconds``."""
        condition.wait(seconds)

    def advanced_since(self, at: float) -> bool:
        """Whether a test moved this clock on since ``monotonic()`` read ``at``: never,
        the machine's runs by itself."""
        return False

    def __repr__(self) -> str:
        return f"Clock(offset={self.offset!r})" if self.offset else "Clock()"


SYSTEM_CLOCK = Clock()

# How long (real seconds) a wait on a manual clock may go unwoken before it is taken as a
# test that forgot to move the clock: an error saying so beats a test that hangs.
STALL = 5.0


class ManualClock(Clock):
    """Time that passes only when the test says: ``advance(seconds)``.

    It starts at the machine's clocks and moves both by hand. A ``sleep`` of code under
    test advances it at once (an eager call waiting for its rate slot returns straight
    away, that much later). A wait for another holder's release wakes on that release or
    on an ``advance`` from another thread; one that nothing wakes within ``stall`` real
    seconds raises, naming the wait, instead of hanging the test.
    """

    def __init__(self, *, stall: float = STALL) -> None:
        super().__init__()
        self.stall = to_seconds(stall, what="stall")
        self.moved = 0.0  # seconds advanced in all
        self._guard = threading.Lock()
        self._monotonic = time.monotonic()
        # On a whole microsecond: the scripts read it in microseconds (TIME), and a slot
        # a whole step on must not round to one microsecond short of it.
        self._time = round(time.time(), 6)
        # The conditions of the stores waiting on this clock: woken by every advance.
        self._waiting: weakref.WeakSet[threading.Condition] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"ManualClock(at={self._monotonic:.3f})"

    def monotonic(self) -> float:
        with self._guard:
            return self._monotonic

    def time(self) -> float:
        with self._guard:
            return self._time

    def advance(self, seconds: object) -> None:
        """Move time on by ``seconds`` (a number or ``timedelta``, never back), then wake
        every wait on this clock to look again."""
        step = to_seconds(seconds, what="advance")
        if step < 0:
            raise ValueError(f"a clock only moves forward: advance({step!r})")
        with self._guard:
            self._monotonic += step
            self._time += step
            self.moved += step
            waiting = list(self._waiting)
        for condition in waiting:
            with condition:
                condition.notify_all()

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advanced_since(self, at: float) -> bool:
        return self.monotonic() != at

    def later(self, seconds: float) -> Clock:
        self.advance(seconds)
        return self

    def attach(self, condition: threading.Condition) -> None:
        """Wake ``condition``'s waits at every advance. Known before any wait on it: a
        waiter holds its condition from its last look until it waits, so an advance in
        between notifies it once it waits, and none is missed."""
        with self._guard:
            self._waiting.add(condition)

    def wait(self, condition: threading.Condition, seconds: float | None) -> None:
        at = self.monotonic()
        if condition.wait(self.stall) or self.monotonic() != at:
            return
        wanted = "a release" if seconds is None else f"a release or {seconds:.3f} s of it"
        raise TimeoutError(
            f"waited {self.stall:.0f} real seconds for {wanted} on a ManualClock that "
            "nothing advanced: call clock.advance(seconds) (from another thread if this one "
            "is blocked), or use try_acquire instead of a blocking acquire"
        )
