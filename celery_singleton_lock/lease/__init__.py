"""The Redis lease: owner-checked, fenced, renewed locks on any redis-py client; no Celery."""

from .clock import Clock, ManualClock
from .interface import LockStore, SlotStore
from .lease import Lease
from .limits.rates import Rate, Slot, parse_rate, rates_of
from .names import DEFAULT_PREFIX, LockKeys, companion, slot, split_role, validate_prefix
from .outcomes import Contended, ExtendResult, ReleaseResult
from .pending import PendingAcquire
from .redis.aio import AsyncRedisLock
from .redis.clients import build as client_from_url
from .redis.clients import describe
from .redis.memory import MemoryLock
from .redis.recording import append as append_history
from .redis.recording import entries as history_entries
from .redis.servers import Server, server_of
from .redis.store import RedisLock
from .redlock.masters import Redlock
from .renewal import Renewer, get_renewer
from .takeover import HOLD, TakeOver

__all__ = [
    "DEFAULT_PREFIX",
    "HOLD",
    "AsyncRedisLock",
    "Clock",
    "Contended",
    "ExtendResult",
    "Lease",
    "LockKeys",
    "LockStore",
    "ManualClock",
    "MemoryLock",
    "PendingAcquire",
    "Rate",
    "RedisLock",
    "Redlock",
    "ReleaseResult",
    "Renewer",
    "Server",
    "Slot",
    "SlotStore",
    "TakeOver",
    "append_history",
    "client_from_url",
    "companion",
    "describe",
    "get_renewer",
    "history_entries",
    "parse_rate",
    "rates_of",
    "server_of",
    "slot",
    "split_role",
    "validate_prefix",
]
