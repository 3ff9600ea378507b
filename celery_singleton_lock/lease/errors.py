"""Redis errors told apart: an outage (``LockStoreUnavailableError``) or a misconfiguration.

Only "the server cannot be reached" is an outage, the one case where waiting (or
``fail_open``) makes sense. Everything else the server or the client says no to will say no
again, so it becomes a ``LockStoreConfigurationError`` whose message says what to change.
"""

from __future__ import annotations

import redis
from redis.exceptions import ClusterError, RedisClusterException

from ..exceptions import LockStoreConfigurationError, LockStoreUnavailableError, SingletonLockError

# A standalone server's answer to SELECT past its last database.
OUT_OF_RANGE = "DB index is out of range"

# What a server's refusal means, by its error code or text: what to change, or None
# for a transient state that ends by itself (a failover or a reload in progress).
_REPLY_HINTS: tuple[tuple[tuple[str, ...], str | None], ...] = (
    (
        ("MOVED", "ASK"),
        "the server is a Redis Cluster node but the client is not a cluster client: use a "
        "redis+cluster:// URL (or singleton_lock_client returning a RedisCluster)",
    ),
    (
        ("SELECT is not allowed",),
        "a cluster has only database 0: drop the /N database number from the URL",
    ),
    (
        (OUT_OF_RANGE,),
        "the server has no database of the URL's /N: a server has as many as its "
        "`databases` setting (16 unless configured), numbered from 0; write a number "
        "below that, or raise `databases` in the server's configuration",
    ),
    (
        ("READONLY",),
        "the URL points at a read-only replica: point it at the primary, or use a "
        "sentinel:// URL with master_name so the lock store follows failovers",
    ),
    (
        ("NOPERM",),
        "the ACL user lacks a command or key pattern the lock needs: allow the commands "
        "README.md lists on the lock prefix's keys",
    ),
    (
        ("WRONGPASS", "NOAUTH", "invalid password", "invalid username-password"),
        "the lock store refused the credentials: fix the user/password in the URL",
    ),
    (
        ("wrong number of arguments for 'auth'",),
        "the server has no ACL users: give only a password",
    ),
    (
        # Valkey 9.1+ without its Lua engine module; EVAL and the rest renamed away
        # (rename-command, a managed service); a build with scripting disabled.
        (
            "Could not find scripting engine",
            "unknown command 'eval",
            "unknown command 'script",
            "Lua scripting disabled",
        ),
        "the server runs no Lua scripts, and every lock operation is one (EVAL, EVALSHA, "
        "SCRIPT LOAD): on Valkey 9.1 or newer load its Lua engine module (or use a build "
        "with Lua); where those commands are renamed or disabled, allow them; or point "
        "singleton_lock_url at a server that runs scripts",
    ),
    (("LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN"), None),
    (
        ("WRONGTYPE",),
        "a key under the lock prefix holds another kind of value: give the locks a prefix "
        "of their own (singleton_lock_prefix)",
    ),
)
_POOL_FULL = ("Too many connections", "No connection available.")


# The code of each error class, for redis-py versions whose errors carry no status_code.
_CLASS_CODES: tuple[tuple[type[Exception], str], ...] = (
    (redis.exceptions.MovedError, "MOVED"),
    (redis.exceptions.AskError, "ASK"),
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.NoPermissionError, "NOPERM"),
    (redis.exceptions.NoScriptError, "NOSCRIPT"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.AuthenticationError, "WRONGPASS"),
)


# An ACL's refusal of a command a script runs, in the words of servers that give it no
# NOPERM code there (Redis 7.0: "The user executing the script can't run this command or
# subcommand"; and for a key or, on Valkey 9.1, a database the user may not use).
_ACL_WORDS = (
    "user executing the script can't",  # Redis 7.0: a command, a key or a channel
    "has no permissions to",  # Redis 7.2+ and Valkey, NOPERM's words after the code
    "no permissions to access",
)


def is_refusal(error: Exception, code: str) -> bool:
    """Whether ``error`` is the server refusing with this error code (``NOPERM``, ...),
    also from inside a script, where the code may follow the script's own words."""
    if not isinstance(error, redis.ResponseError):
        return False
    message = str(error)
    found = str(getattr(error, "status_code", None) or message.split(" ", 1)[0])
    for kind, known in _CLASS_CODES:
        if isinstance(error, kind):
            found = known
            break
    if found == code or code in message:
        return True
    return code == "NOPERM" and any(words in message.lower() for words in _ACL_WORDS)


def _matches(mark: str, code: str, message: str) -> bool:
    if mark.isupper():  # an error code: the reply's first word
        return code == mark or message.startswith(mark)
    return mark.lower() in message.lower()


def _reply_hint(error: Exception, message: str) -> str | None:
    code = str(getattr(error, "status_code", None) or message.split(" ", 1)[0])
    for kind, known in _CLASS_CODES:
        if isinstance(error, kind):
            code = known
            break
    for marks, hint in _REPLY_HINTS:
        if any(_matches(mark, code, message) for mark in marks):
            return hint
    return "the server refused a lock command; check the server version (>= 6.2) and setup"


def _hint(error: Exception) -> str | None:
    """What to change, for an error that is a configuration problem (wrong topology, a
    replica, a refused password or command, a full client pool, a key of the wrong type:
    each says no again); None for an outage."""
    message = str(error)
    if isinstance(error, redis.ResponseError | redis.AuthenticationError):
        return _reply_hint(error, message)
    max_connections = getattr(redis.exceptions, "MaxConnectionsError", ())
    if (max_connections and isinstance(error, max_connections)) or message in _POOL_FULL:
        return (
            "the client's connection pool is full: raise max_connections (transport option) "
            "or its pool timeout"
        )
    if isinstance(error, redis.ConnectionError | redis.TimeoutError | ClusterError):
        return None
    if isinstance(error, RedisClusterException):
        if "cannot be connected" in message or "not covered" in message.lower():
            return None  # every seed unreachable, or a slot's node down: an outage
        return (
            "the cluster client could not use the nodes it was given: check the "
            "redis+cluster:// seeds, and that they are cluster nodes"
        )
    return "redis-py raised an unexpected error; check the lock store's client options"


def store_error(
    error: Exception,
    *,
    where: str,
    name: str | None = None,
    key: str | None = None,
    databases: int | None = None,
) -> SingletonLockError:
    """The error to raise for ``error`` from the lock store at ``where`` (``databases``:
    how many the server has, when a database number was out of range)."""
    hint = _hint(error)
    if databases is not None:  # asked only for a database number out of range
        hint = (
            f"the server has {databases} databases, 0 to {databases - 1}: write one of "
            "those as the URL's /N, or raise `databases` in the server's configuration"
        )
    if hint is None:
        return LockStoreUnavailableError(
            f"the lock store at {where} is unreachable ({type(error).__name__}: {error})",
            name=name,
            key=key,
            url=where,
        )
    # (redis-py's "unknown command" repeats the script's arguments: noise in a message)
    said = str(error).split(", with args beginning with", 1)[0]
    return LockStoreConfigurationError(
        f"the lock store at {where} refused a lock command ({type(error).__name__}: {said}): "
        f"{hint}",
        name=name,
        key=key,
        url=where,
    )
