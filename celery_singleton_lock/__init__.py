"""celery-singleton-lock: stop Celery from doing the same work twice."""

from . import signals
from .decorator import singleton_task
from .exceptions import (
    ConfigurationError,
    DuplicateTaskError,
    KeyDerivationError,
    LockLostError,
    LockNotAcquiredError,
    LockStoreUnavailableError,
    SingletonLockError,
)
from .keys import KeySpec, derive_key
from .lock import (
    AsyncRedisLock,
    Contended,
    ExtendResult,
    Lease,
    LockKeys,
    PendingAcquire,
    RedisLock,
    ReleaseResult,
)
from .memory import MemoryLock
from .policies import fail, requeue, wait
from .renewal import Renewer, get_renewer
from .task import SingletonTask
from .worker import SingletonRequest, check_worker_setup

__all__ = [
    "AsyncRedisLock",
    "ConfigurationError",
    "Contended",
    "DuplicateTaskError",
    "ExtendResult",
    "KeyDerivationError",
    "KeySpec",
    "Lease",
    "LockKeys",
    "LockLostError",
    "LockNotAcquiredError",
    "LockStoreUnavailableError",
    "MemoryLock",
    "PendingAcquire",
    "RedisLock",
    "ReleaseResult",
    "Renewer",
    "SingletonLockError",
    "SingletonRequest",
    "SingletonTask",
    "check_worker_setup",
    "derive_key",
    "fail",
    "get_renewer",
    "requeue",
    "signals",
    "singleton_task",
    "wait",
]
