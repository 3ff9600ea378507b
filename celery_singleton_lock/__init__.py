"""celery-singleton-lock: stop Celery from doing the same work twice."""

# The one source of the version: pyproject.toml reads it from here.
__version__ = "0.1.0.dev0"

from . import signals
from .decorator import singleton_task
from .exceptions import (
    ArgumentsMismatchError,
    ConfigurationError,
    DuplicateTaskError,
    KeyDerivationError,
    LockLostError,
    LockNotAcquiredError,
    LockStoreConfigurationError,
    LockStoreUnavailableError,
    SingletonLockError,
)
from .keys import KeySpec, derive_key
from .lease import (
    AsyncRedisLock,
    Contended,
    ExtendResult,
    Lease,
    LockKeys,
    MemoryLock,
    PendingAcquire,
    RedisLock,
    ReleaseResult,
    Renewer,
    get_renewer,
)
from .policies import ContentionState, fail, requeue, skip, wait
from .setupchecks import check_worker_setup
from .task import SingletonTask
from .worker import SingletonRequest

__all__ = [
    "ArgumentsMismatchError",
    "AsyncRedisLock",
    "ConfigurationError",
    "Contended",
    "ContentionState",
    "DuplicateTaskError",
    "ExtendResult",
    "KeyDerivationError",
    "KeySpec",
    "Lease",
    "LockKeys",
    "LockLostError",
    "LockNotAcquiredError",
    "LockStoreConfigurationError",
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
    "skip",
    "wait",
]
