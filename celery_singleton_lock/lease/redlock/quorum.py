"""``Quorum``: one call on every Redlock master at once, read until a majority settles it.

Each master has a small thread pool of its own, so a frozen master only backs up its own
queue (a call that waited past its deadline is dropped unsent), and a decision never waits
for it once the others have settled the answer.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

from ...exceptions import ConfigurationError, LockStoreUnavailableError

T = TypeVar("T")
U = TypeVar("U")

# Calls in flight per master: a few callers at once; more queue (and are dropped unsent
# when their deadline passes first).
THREADS_PER_MASTER = 4


class NoAnswer(TimeoutError):
    """A master that did not answer within the call's deadline."""


@dataclass(frozen=True)
class Answers(Generic[T]):
    """What each master said (in the masters' order): a value, an error, or ``NoAnswer``."""

    each: list[T | Exception]

    def values(self) -> list[T]:
        return [one for one in self.each if not isinstance(one, Exception)]

    def errors(self) -> list[Exception]:
        return [one for one in self.each if isinstance(one, Exception)]

    def count(self, accept: Callable[[T], bool]) -> int:
        return sum(1 for one in self.values() if accept(one))

    def unanswered(self) -> int:
        return sum(1 for one in self.each if isinstance(one, NoAnswer))

    def column(self: Answers[list[U | Exception]], index: int) -> Answers[U]:
        """Each master's answer to the ``index``-th of several calls it answered at once."""
        return Answers([one if isinstance(one, Exception) else one[index] for one in self.each])


class Quorum:
    """A fan-out over ``count`` masters; ``needed`` (a majority) must agree.

    Fork-safe: a pool child makes its own pools on first use (threads do not survive a
    fork). Under gevent the pools' threads are greenlets, as Celery's patched
    ``threading`` makes them.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.needed = count // 2 + 1
        self._pools: list[ThreadPoolExecutor] = []
        self._pid = 0
        self._guard = threading.Lock()

    def settles(self, answers: Answers[T], yes: Callable[[T], bool]) -> bool:
        """Whether the answers so far decide a majority vote, either way (errors decide
        nothing: they are waited out)."""
        ayes = answers.count(yes)
        noes = len(answers.values()) - ayes
        return ayes >= self.needed or noes > self.count - self.needed

    def agreed(self, answers: Answers[T]) -> bool:
        """One value on a majority, or none can reach one with the masters yet to answer:
        a read settled early by the first majority heard would miss a value still
        landing on the others (a take decided before its slow masters answered)."""
        top = max(Counter(answers.values()).values(), default=0)
        return top >= self.needed or top + answers.unanswered() < self.needed

    def heard(self, answers: Answers[T]) -> bool:
        """A majority answered (a frozen master does not delay a release or a read)."""
        return len(answers.values()) >= self.needed

    def judge(self, answers: Answers[T], where: str, name: str, key: str) -> None:
        """Raise what the errors mean when too few masters answered to decide anything:
        a configuration error first (no retry helps), else the outage."""
        for error in answers.errors():
            if isinstance(error, ConfigurationError):
                raise error
        if len(answers.values()) < self.needed:
            errors = sorted(answers.errors(), key=lambda error: isinstance(error, NoAnswer))
            raise LockStoreUnavailableError(
                f"the lock store at {where} has too few masters answering: "
                f"{len(answers.values())} of {self.count}, {self.needed} needed "
                f"({type(errors[0]).__name__}: {errors[0]})",
                name=name,
                key=key,
                url=where,
            )

    def _executors(self) -> list[ThreadPoolExecutor]:
        if self._pid != os.getpid():
            with self._guard:
                if self._pid != os.getpid():
                    self._pools = [
                        ThreadPoolExecutor(
                            THREADS_PER_MASTER,
                            thread_name_prefix=f"celery-singleton-lock-redlock{i}",
                        )
                        for i in range(self.count)
                    ]
                    self._pid = os.getpid()
        return self._pools

    def ask(
        self,
        calls: Sequence[Callable[[], T]],
        *,
        timeout: float,
        settled: Callable[[Answers[T]], bool] | None = None,
    ) -> Answers[T]:
        """Run ``calls[i]`` on master ``i``'s pool; return once all answered, ``settled``
        says the answers so far decide it, or ``timeout`` seconds passed. Masters that have
        not answered by then count as ``NoAnswer`` (their call may still land later)."""
        deadline = time.monotonic() + timeout
        try:
            futures: list[Future[T]] = [
                pool.submit(_before, deadline, call)
                for pool, call in zip(self._executors(), calls, strict=True)
            ]
        except RuntimeError as error:  # the interpreter is exiting: its pools are shut
            return Answers([NoAnswer(f"not sent: {error}") for _ in calls])
        not_done = set(futures)
        while not_done:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _, not_done = wait(not_done, timeout=left, return_when=FIRST_COMPLETED)
            if settled is not None and not_done and settled(_read(futures)):
                break
        return _read(futures)


class Attempt(Generic[T]):
    """One try over the masters, given back on every master if it fails.

    A decision does not wait for the slow masters, so a take can still be queued in a
    master's pool, or on its way, when the try is given back. Landing after the give-back
    it would hold that master for the ttl under a token nobody renews, and the caller's
    next try would meet its own leftover as the holder. So a call whose turn comes after
    ``give_back`` is not sent, and one whose answer comes after it is undone at once.
    ``undo[i]`` gives master ``i``'s grant back; it must be safe where nothing was granted.
    """

    def __init__(
        self, calls: Sequence[Callable[[], T]], undo: Sequence[Callable[[], object]]
    ) -> None:
        self.given_up = threading.Event()
        self.undo = list(undo)
        self.calls = [
            functools.partial(self._call, call, undo_one)
            for call, undo_one in zip(calls, self.undo, strict=True)
        ]

    def give_back(self, quorum: Quorum, timeout: float) -> None:
        """Give the try up and undo it on every master: those that granted, and any whose
        grant is still on its way."""
        self.given_up.set()
        quorum.ask(self.undo, timeout=timeout, settled=quorum.heard)

    def _call(self, call: Callable[[], T], undo: Callable[[], object]) -> T:
        if self.given_up.is_set():
            raise NoAnswer("the try was given up before this master's turn; not sent")
        answer = call()
        # Set before the give-back is sent: an answer read before this check was on the
        # server before the give-back, which undoes it; one read after is undone here.
        if self.given_up.is_set():
            undo()
        return answer


def _before(deadline: float, call: Callable[[], T]) -> T:
    if time.monotonic() >= deadline:
        raise NoAnswer("its turn came after the deadline; not sent")
    return call()


def _read(futures: Sequence[Future[T]]) -> Answers[T]:
    each: list[T | Exception] = []
    for future in futures:
        if not future.done():
            each.append(NoAnswer("no answer within the deadline"))
            continue
        error = future.exception()
        if error is None:
            each.append(future.result())
        elif isinstance(error, Exception):
            each.append(error)
        else:
            raise error
    return Answers(each)
