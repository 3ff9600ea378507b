"""Redis errors told apart: an outage (``LockStoreUnavailableError``) or a misconfiguration.

Only "the server cannot be reached" is an outage, the one case where waiting (or
``fail_open``) makes sense. Everything else the server or the client says no to
(wrong topology, a replica, a refused password or command, a full client pool, a key
of the wrong type) will say no again, so it becomes a ``LockStoreConfigurationError``
whose message says what to change.
"""

from __future__ import annotations

import redis
from redis.exceptions import RedisClusterException

from ..exceptions import LockStoreConfigurationError, LockStoreUnavailableError, SingletonLockError

# Transient server states that end by themselves: a failover or a reload in progress.
_TRANSIENT_REPLIES = ("LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN")


def _hint(error: Exception) -> str | None:  # noqa: PLR0911  (a table: one return per kind)
    """What to change, for an error that is a configuration problem; None for an outage."""
    message = str(error)
    code = getattr(error, "status_code", None) or message.split(" ", 1)[0]
    if isinstance(error, redis.ResponseError):
        if code in ("MOVED", "ASK") or message.startswith(("MOVED", "ASK")):
            return (
                "the server is a Redis Cluster node but the client is not a cluster client: "
                "use a redis+cluster:// URL (or singleton_lock_client returning a RedisCluster)"
            )
        if (
            "SELECT is not allowed in cluster mode" in message
            or "DB index is out of range" in message
        ):
            return "a cluster has only database 0: drop the /N database number from the URL"
        if isinstance(error, redis.exceptions.ReadOnlyError) or code == "READONLY":
            return (
                "the URL points at a read-only replica: point it at the primary, or use a "
                "sentinel:// URL with master_name so the lock store follows failovers"
            )
        if isinstance(error, redis.exceptions.NoPermissionError) or code == "NOPERM":
            return (
                "the ACL user lacks a command or key pattern the lock needs: allow the "
                "commands README.md lists on the lock prefix's keys"
            )
        if code in _TRANSIENT_REPLIES or message.startswith(_TRANSIENT_REPLIES):
            return None
        if "WRONGTYPE" in message:
            return (
                "a key under the lock prefix holds another kind of value: give the locks a "
                "prefix of their own (singleton_lock_prefix)"
            )
        return "the server refused a lock command; check the server version (>= 6.2) and setup"
    if isinstance(error, redis.AuthenticationError) or "invalid username-password" in message:
        return "the lock store refused the credentials: fix the user/password in the URL"
    if isinstance(error, redis.exceptions.AuthenticationWrongNumberOfArgsError):
        return "the server has no ACL users: give only a password in the URL"
    max_connections = getattr(redis.exceptions, "MaxConnectionsError", ())
    if (max_connections and isinstance(error, max_connections)) or message in (
        "Too many connections",
        "No connection available.",
    ):
        return (
            "the client's connection pool is full: raise max_connections (transport option) "
            "or its pool timeout"
        )
    if isinstance(
        error, redis.ConnectionError | redis.TimeoutError | redis.exceptions.ClusterError
    ):
        return None
    if isinstance(error, RedisClusterException):
        return (
            "the cluster client could not use the nodes it was given: check the "
            "redis+cluster:// seeds, and that they are cluster nodes"
        )
    return "redis-py raised an unexpected error; check the lock store's client options"


def store_error(
    error: Exception, *, where: str, name: str | None = None, key: str | None = None
) -> SingletonLockError:
    """The error to raise for ``error`` from the lock store at ``where``."""
    hint = _hint(error)
    if hint is None:
        return LockStoreUnavailableError(
            f"the lock store at {where} is unreachable ({type(error).__name__}: {error})",
            name=name,
            key=key,
            url=where,
        )
    return LockStoreConfigurationError(
        f"the lock store at {where} refused a lock command ({type(error).__name__}: {error}): "
        f"{hint}",
        name=name,
        key=key,
        url=where,
    )
