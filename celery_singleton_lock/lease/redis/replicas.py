"""Replica acknowledgement (``WAIT``): the option, and what too few acknowledgements mean.

As Redisson's ``checkLockSyncedSlaves``: it narrows the window in which a failover loses a
lease, it is not consensus. WAIT does not make a write durable on the replica's disk (one
can acknowledge and die; a failover can promote one that missed it): fencing keeps writes safe.
"""

from __future__ import annotations

import logging
from typing import Any

from ..._time import to_seconds
from ...exceptions import ConfigurationError, LockStoreUnavailableError
from ..lease import Lease
from ..outcomes import Contended
from .calls import Response

logger = logging.getLogger(__name__)


def replicas_option(replicas: object, timeout: object, client: object) -> tuple[int, int] | None:
    """``(replicas, timeout in ms)`` for WAIT, or None when no acknowledgement is asked.

    With ``replicas=N`` every acquire and renewal is followed, on the same connection, by
    ``WAIT N timeout``. An acquire that fewer than N replicas acknowledged is given back
    and reported as contended (``with_acks``); a renewal that fewer acknowledged counts
    as failed (``acknowledged``: retried, and the lease is lost if none succeeds before
    its ttl).
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ConfigurationError(f"replicas must be an int >= 0, got {replicas!r}")
    seconds = to_seconds(timeout, what="replica_timeout")
    if seconds <= 0:
        raise ConfigurationError(f"replica_timeout must be > 0 seconds, got {timeout!r}")
    if not replicas:
        return None
    if hasattr(client, "get_node_from_key"):
        raise ConfigurationError(
            "replicas (WAIT) is not supported on a cluster client: redis-py sends WAIT to "
            "a random node, not the one that took the write; set it to 0 for Cluster"
        )
    return replicas, max(1, round(seconds * 1000))


def acknowledged(
    reply: Response, wanted: tuple[int, int], *, where: str, name: str, key: str
) -> Response:
    """The script's reply, if enough replicas acknowledged it; else the outage error."""
    value, acked = reply
    if acked < wanted[0]:
        raise LockStoreUnavailableError(
            f"only {acked} of {wanted[0]} replicas of the lock store at {where} acknowledged "
            f"the write within {wanted[1]} ms",
            name=name,
            key=key,
            url=where,
            acked=acked,
        )
    return value


def with_acks(store: Any, call: Any, sent_at: float, reply: Response) -> Lease | Contended:
    """A ``RedisLock``'s acquire answered with ``(reply, replicas that acknowledged)``."""
    value, acked = reply
    outcome: Lease | Contended = store.acquired(call, sent_at=sent_at, reply=value)
    if isinstance(outcome, Contended) or acked >= store.replicas[0]:
        return outcome
    # Granted on the primary only: a failover now could hand it out again. Give it back
    # and report it as contended, to be tried again like any held lock.
    logger.warning(
        "acquired %s but only %d of %d replicas acknowledged it: given back",
        outcome.key,
        acked,
        store.replicas[0],
    )
    store.release(outcome)
    return Contended(call.name, call.keys.lock, holder="", retry_after=store.replicas[1] / 1000)
