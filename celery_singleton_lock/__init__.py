"""celery-singleton-lock: stop Celery from doing the same work twice."""

from .exceptions import (
    ConfigurationError,
    DuplicateTaskError,
    KeyDerivationError,
    LockLostError,
    LockNotAcquiredError,
    SingletonLockError,
)
from .keys import KeySpec, derive_key
from .lock import (
    AsyncRedisLock,
    Contended,
    ExtendResult,
    Lease,
    LockKeys,
    RedisLock,
    ReleaseResult,
)
from .renewal import Renewer, get_renewer

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
    "RedisLock",
    "ReleaseResult",
    "Renewer",
    "SingletonLockError",
    "derive_key",
    "get_renewer",
]
