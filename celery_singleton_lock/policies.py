"""What to do when a key is taken: small policy objects that read as configuration.

``on_duplicate`` decides at dispatch and ``on_contention`` at execution (docs/configuration.md
lists their values). A contention policy does no I/O, so it is tested with a state built by
hand, the way tenacity tests its ``stop``/``wait`` policies.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeAlias

from ._time import full_jitter, to_seconds
from .exceptions import ConfigurationError

# "return" the holder's AsyncResult, "raise" DuplicateTaskError, "replace" a queued holder's
# arguments with this call's (it keeps its task id; a running one is never replaced), or
# "cancel" a run in progress.
OnDuplicate: TypeAlias = Literal["return", "raise", "replace", "cancel"]
ON_DUPLICATE: tuple[OnDuplicate, ...] = ("return", "raise", "replace", "cancel")


@dataclass(frozen=True, init=False)
class ContentionState:
    """What a policy knows when an execution finds its lock held by someone else."""

    task_name: str
    name: str  # the lock's name (its Redis key is another thing: the exceptions carry both)
    attempt: int  # how many times this execution was already requeued for this lock (0 first)
    holder: str | None = None  # the holder's task id (its token when there is none)
    retry_after: float | None = None  # seconds the holder's lease has left, when known
    waited: bool = False  # True once a wait for this attempt has timed out

    def __init__(  # noqa: PLR0917  (the fields, as the dataclass took them, and key= of 0.1)
        self,
        task_name: str,
        name: str | None = None,
        attempt: int = 0,
        holder: str | None = None,
        retry_after: float | None = None,
        waited: bool = False,
        *,
        key: str | None = None,
    ) -> None:
        if key is not None:
            warnings.warn(_KEY_RENAMED, DeprecationWarning, stacklevel=2)
            name = name or key
        if name is None:
            raise TypeError("ContentionState() needs name=, the lock's name")
        for field_name, value in (
            ("task_name", task_name),
            ("name", name),
            ("attempt", attempt),
            ("holder", holder),
            ("retry_after", retry_after),
            ("waited", waited),
        ):
            object.__setattr__(self, field_name, value)

    @property
    def key(self) -> str:
        """Deprecated: the lock's name, under its 0.1 spelling; read ``name``."""
        warnings.warn(_KEY_RENAMED, DeprecationWarning, stacklevel=2)
        return self.name


_KEY_RENAMED = (
    "ContentionState.key is the lock's name, now spelt ContentionState.name (key= and .key "
    "go in the next release)"
)


@dataclass(frozen=True)
class Fail:
    """Do not run; end the task in a clear failed state naming the holder."""

    reason: str


@dataclass(frozen=True)
class Skip:
    """Do not run; end quietly: acked, state IGNORED, no failure and no callbacks."""

    reason: str


@dataclass(frozen=True)
class Requeue:
    """Send the task again after ``countdown`` seconds (the slot is freed meanwhile)."""

    countdown: float


@dataclass(frozen=True)
class Wait:
    """Block this worker slot up to ``timeout`` seconds for the holder's release."""

    timeout: float


Decision: TypeAlias = Fail | Skip | Requeue | Wait


class ContentionPolicy(Protocol):
    """A callable from a ``ContentionState`` to a decision (``Fail``, ``Skip``, ``Requeue``
    or ``Wait``): ``fail``, ``skip``, ``requeue(max_tries=..., backoff=..., cap=...)``,
    ``wait(timeout=..., then=...)``, or one of your own."""

    def __call__(self, state: ContentionState) -> Decision: ...


def _held_by(state: ContentionState) -> str:
    return f"{state.name!r} is held by {state.holder or 'another execution'}"


@dataclass(frozen=True)
class fail:  # lower-case on purpose: reads as configuration, on_contention=fail()
    """Give up at once."""

    def __call__(self, state: ContentionState) -> Decision:
        return Fail(f"{_held_by(state)}; on_contention is fail")


@dataclass(frozen=True)
class skip:
    """Drop the contended call quietly, as hand-written ``if not acquired: return`` does.

    The message is acked and ends in Celery's ``IGNORED`` state (not ``SUCCESS``, not
    ``FAILURE``): no traceback, no ``link_error``, no retry. For work that the holder's
    run makes redundant, e.g. a sweep that finds its request already being processed.
    """

    def __call__(self, state: ContentionState) -> Decision:
        return Skip(f"{_held_by(state)}; on_contention is skip")


@dataclass(frozen=True)
class requeue:
    """Re-send with exponential backoff and full jitter, at most ``max_tries`` times, then fail.

    The delay before try ``n`` is uniform in ``[0, min(cap, backoff * 2**n)]``, never
    shorter than ``floor`` so a requeue loop cannot spin the broker.
    """

    max_tries: int = 10
    backoff: float = 1.0
    cap: float = 60.0
    floor: float = 0.05
    rng: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_tries, bool) or not isinstance(self.max_tries, int):
            raise ConfigurationError(f"requeue(max_tries=) must be an int, got {self.max_tries!r}")
        if self.max_tries < 0:
            raise ConfigurationError(f"requeue(max_tries=) must be >= 0, got {self.max_tries}")
        for name in ("backoff", "cap", "floor"):
            seconds = to_seconds(getattr(self, name), what=f"requeue({name}=)")
            if seconds < 0:
                raise ConfigurationError(f"requeue({name}=) must be >= 0, got {seconds}")
            object.__setattr__(self, name, seconds)

    def __call__(self, state: ContentionState) -> Decision:
        if state.attempt >= self.max_tries:
            return Fail(f"{_held_by(state)}; gave up after {state.attempt} requeues")
        delay = full_jitter(state.attempt, base=self.backoff, cap=self.cap, rng=self.rng)
        return Requeue(countdown=max(self.floor, delay))


@dataclass(frozen=True)
class wait:
    """Block up to ``timeout`` seconds for the push wake-up, then hand over to ``then``.

    Never the default: a waiting task occupies a worker slot for the whole wait.
    """

    timeout: float = 10.0
    then: ContentionPolicy = field(default_factory=requeue)

    def __post_init__(self) -> None:
        seconds = to_seconds(self.timeout, what="wait(timeout=)")
        if seconds <= 0:
            raise ConfigurationError(f"wait(timeout=) must be positive, got {self.timeout!r}")
        object.__setattr__(self, "timeout", seconds)
        object.__setattr__(self, "then", contention_policy(self.then))

    def __call__(self, state: ContentionState) -> Decision:
        if state.waited:
            return self.then(state)
        return Wait(timeout=self.timeout)


# The strings on_contention takes: each policy with its defaults.
_SHORTCUTS: dict[str, Callable[[], ContentionPolicy]] = {
    "fail": fail,
    "skip": skip,
    "requeue": requeue,
    "wait": wait,
}


def contention_policy(value: object) -> ContentionPolicy:
    """Turn an ``on_contention`` option into a policy; refuse anything else clearly."""
    if isinstance(value, str):
        if value in _SHORTCUTS:
            return _SHORTCUTS[value]()
    elif isinstance(value, fail | skip | requeue | wait) or (
        callable(value) and not isinstance(value, type)
    ):
        return value
    raise ConfigurationError(
        f"on_contention={value!r} is not a policy; use one of {sorted(_SHORTCUTS)} or "
        "a policy object: fail(), skip(), requeue(max_tries=5, backoff=1, cap=60), "
        "wait(timeout=10, then=skip())"
    )


def longest_requeue(policy: ContentionPolicy) -> float | None:
    """The longest countdown a built-in ``on_contention`` policy requeues with (None: it
    never requeues, or it is the user's own and its countdowns are unknown)."""
    if isinstance(policy, wait):
        return longest_requeue(policy.then)
    if isinstance(policy, requeue) and policy.max_tries > 0:
        # Try n waits at most min(cap, backoff * 2**n), and the last try is max_tries - 1.
        ceiling = min(policy.cap, policy.backoff * 2.0 ** min(policy.max_tries - 1, 62))
        return max(policy.floor, ceiling)
    return None


def decided_ahead(policy: ContentionPolicy, state: ContentionState) -> Decision | None:
    """What a built-in ``policy`` will decide for ``state``, asked before the holder is
    known (theirs rest on the attempt and the wait alone): the take that meets the
    contention records it. None for a policy of the user's own, which may read more."""
    return policy(state) if isinstance(policy, fail | skip | requeue | wait) else None


def described(decision: Decision) -> str:
    """A decision as the log line and a lock's history say it."""
    if isinstance(decision, Wait):
        return f"wait up to {decision.timeout:g}s"
    if isinstance(decision, Requeue):
        return f"requeue in {decision.countdown:.2f}s"
    return "skip" if isinstance(decision, Skip) else "fail"


def on_duplicate_option(value: object) -> OnDuplicate:
    """Validate an ``on_duplicate`` option."""
    if value not in ON_DUPLICATE:
        raise ConfigurationError(
            f"on_duplicate={value!r} is not supported; use one of {list(ON_DUPLICATE)}"
        )
    return value
