"""Every error this library raises, under one base that carries the lock's name and Redis key.

Celery ships exceptions between processes (worker child -> main process -> result
backend -> caller), so each class here must survive a pickle round trip with its
attributes intact; the base class's ``__reduce__`` takes care of that for all of them.
"""

from __future__ import annotations


class SingletonLockError(Exception):
    """Base class: ``name`` is the lock's name and ``key`` its Redis key, when known."""

    def __init__(
        self, message: str, *, name: str | None = None, key: str | None = None, **context: object
    ) -> None:
        super().__init__(message)
        self.message = message
        self.name = name
        self.key = key
        for attribute, value in context.items():
            setattr(self, attribute, value)

    def __reduce__(self) -> tuple[object, ...]:
        # Exception's default reduce replays ``args`` only and would drop ``key`` and
        # the context attributes; celery-singleton's errors crashed workers this way.
        state = dict(self.__dict__)
        message = state.pop("message")
        return (_rebuild, (type(self), message, state))

    def __str__(self) -> str:
        return self.message


def _rebuild(
    cls: type[SingletonLockError], message: str, state: dict[str, object]
) -> SingletonLockError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.message = message
    error.name = error.key = None
    error.__dict__.update(state)
    return error


class ConfigurationError(SingletonLockError, ValueError):
    """An option, argument or client setting is invalid; the message says what to change."""


class LockStoreConfigurationError(ConfigurationError):
    """The lock store refused us for how it is set up (topology, replica, auth, pool size).

    Not an outage: retrying cannot help, so it is never subject to
    ``singleton_lock_on_redis_error``; ``url`` says where, without the password.
    """

    url: str


class KeyDerivationError(SingletonLockError, ValueError):
    """A lock key cannot be derived from the task's arguments; ``param`` names the argument."""

    param: str | None


class ArgumentsMismatchError(KeyDerivationError, TypeError):
    """A call's arguments do not fit the task's signature: a TypeError, as Celery raises."""


class LockNotAcquiredError(SingletonLockError):
    """The lock is held by someone else; ``holder`` is its token, ``retry_after`` seconds left."""

    holder: str | None
    retry_after: float | None


class LockStoreUnavailableError(SingletonLockError):
    """The lock store could not be reached; ``url`` says where, without the password."""

    url: str


class LockLostError(SingletonLockError):
    """A lease this process held has expired or been taken; ``reason`` says which."""

    reason: str


class RateLimitedError(SingletonLockError):
    """A call is over its key's rate (``on_limited="raise"``); ``retry_after`` seconds
    until the key's next free slot."""

    retry_after: float


class BackpressureError(SingletonLockError):
    """A key has as many calls waiting as its ``max_pending`` allows: the call was
    refused before anything was published. ``retry_after``: seconds after which a place
    is likely free (one waiting call starts per interval of a rate); ``waiting`` and
    ``cap``: how many wait, and how many may."""

    retry_after: float
    waiting: int
    cap: int


class CostOverBurstError(SingletonLockError, ValueError):
    """A call costs more units than one of its rate limits lets start at once (its
    ``burst``): no slot could ever take it. Raised before anything is sent when the
    call is made, or by the run when its cost is known only then."""


class TaskCancelledError(LockLostError):
    """The run was cancelled by a newer call for its key (``on_duplicate="cancel"``): its
    lease is still held until it ends, and the newer run starts once it has."""


class DuplicateTaskError(SingletonLockError):
    """A task with the same lock key is already queued or running; ``task_id`` is that task."""

    task_id: str | None


class IdempotencyConflictError(SingletonLockError):
    """An idempotency key was first used with other arguments (or another task);
    ``task_id`` is that first call's id, ``idempotency_key`` the key. Raised before
    anything is published."""

    task_id: str
    idempotency_key: str


class IdempotencyResultMissingError(SingletonLockError):
    """A call's idempotency key says its work is done, but the first call's result is no
    longer stored (``result_expires`` shorter than the window, or a result backend that
    forgot it): the work is not done again, and this says so instead of answering."""

    task_id: str
    idempotency_key: str
