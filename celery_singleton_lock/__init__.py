"""celery-singleton-lock: stop Celery from doing the same work twice."""

# The one source of the version: pyproject.toml reads it from here.
__version__ = "0.1.0.dev0"

from . import signals
from .decorator import singleton_task
from .exceptions import (
    ArgumentsMismatchError,
    BackpressureError,
    ConfigurationError,
    CostOverBurstError,
    DuplicateTaskError,
    IdempotencyConflictError,
    IdempotencyResultMissingError,
    KeyDerivationError,
    LockLostError,
    LockNotAcquiredError,
    LockStoreConfigurationError,
    LockStoreUnavailableError,
    RateLimitedError,
    SingletonLockError,
    TaskCancelledError,
)
from .keys import KeySpec, derive_key
from .lease import (
    AsyncRedisLock,
    Contended,
    ExtendResult,
    Lease,
    ManualClock,
    MemoryLock,
    RedisLock,
    Redlock,
    ReleaseResult,
)
from .modes import RateLimit
from .policies import (
    ContentionPolicy,
    ContentionState,
    Fail,
    Requeue,
    Skip,
    Wait,
    fail,
    requeue,
    skip,
    wait,
)
from .task import SingletonTask
from .worker.setupchecks import check_worker_setup

__all__ = [
    "ArgumentsMismatchError",
    "AsyncRedisLock",
    "BackpressureError",
    "ConfigurationError",
    "Contended",
    "ContentionPolicy",
    "ContentionState",
    "CostOverBurstError",
    "DuplicateTaskError",
    "ExtendResult",
    "Fail",
    "IdempotencyConflictError",
    "IdempotencyResultMissingError",
    "KeyDerivationError",
    "KeySpec",
    "Lease",
    "LockLostError",
    "LockNotAcquiredError",
    "LockStoreConfigurationError",
    "LockStoreUnavailableError",
    "ManualClock",
    "MemoryLock",
    "RateLimit",
    "RateLimitedError",
    "RedisLock",
    "Redlock",
    "ReleaseResult",
    "Requeue",
    "SingletonLockError",
    "SingletonTask",
    "Skip",
    "TaskCancelledError",
    "Wait",
    "check_worker_setup",
    "derive_key",
    "fail",
    "requeue",
    "signals",
    "singleton_task",
    "skip",
    "wait",
]

import importlib as _importlib
import warnings as _warnings

# Internals this module exported before 0.1: importable from here for one more release,
# with a warning naming where they live.
_MOVED = {
    "LockKeys": "celery_singleton_lock.lease",
    "PendingAcquire": "celery_singleton_lock.lease",
    "Renewer": "celery_singleton_lock.lease",
    "get_renewer": "celery_singleton_lock.lease",
    "SingletonRequest": "celery_singleton_lock.worker",
}


def __getattr__(name: str) -> object:
    where = _MOVED.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _warnings.warn(
        f"celery_singleton_lock.{name} is not part of the task API; import it from {where}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_importlib.import_module(where), name)
