"""redis-py's connections driven directly: a command packed; which clients allow it.

What ``Pipelining`` needs of redis-py below its client API, on its public connection
methods (``send_packed_command``, ``can_read``): a kept connection made ready, forks seen.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import TypeGuard

import redis
from redis.connection import Connection, ConnectionPool

from .calls import Arg
from .replies import TRANSPORT_ERRORS


def pack(encoding: str, args: Sequence[Arg]) -> bytes:
    """One command in RESP, for the str, bytes and int arguments our calls take.

    redis-py's own packer handles every argument type there is, and costs as much CPU
    as the loopback round trip; the bytes are the same (RESP is the wire protocol, not
    a redis-py internal), and ``send_packed_command`` takes them as they are.
    """
    parts = [b"*%d\r\n" % len(args)]
    append = parts.append
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode(encoding)
        elif isinstance(arg, bytes):
            data = arg
        else:
            data = b"%d" % arg
        # The value as it is, copied once by the join (a message's payload is KiBs).
        append(b"$%d\r\n" % len(data))
        append(data)
        append(b"\r\n")
    return b"".join(parts)


# Forks this process has seen: a pipelining inherited over fork tells from it, without
# a getpid() system call on every call, that its owed answers are the parent's.
FORKS_SEEN = [0]


def _count_fork() -> None:
    FORKS_SEEN[0] += 1


os.register_at_fork(after_in_child=_count_fork)


def takes_command_name(pool: ConnectionPool) -> bool:
    # redis-py < 5.3 requires get_connection(command_name); later versions warn on it.
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def drivable(client: object) -> TypeGuard[redis.Redis]:
    """Whether ``client`` is a pooled sync client whose connections we may drive ourselves.

    Clients this module cannot drive directly (cluster, sentinel-managed failover aside,
    single-connection, client-side caching) take redis-py's path for every call."""
    pool = getattr(client, "connection_pool", None)
    return (
        isinstance(client, redis.Redis)
        and getattr(client, "connection", None) is None  # single_connection_client
        and pool is not None
        and getattr(pool, "cache", None) is None  # client-side caching wants its own path
    )


def ready(conn: Connection) -> Connection:
    """A kept connection, as the pool would lend it: every reply on it was read before
    it was kept, so anything readable now is the server closing it (an idle timeout):
    dropped, and connected again as it is used."""
    try:
        if conn.can_read():
            conn.disconnect()  # type: ignore[no-untyped-call]
    except (*TRANSPORT_ERRORS, OSError):
        conn.disconnect()  # type: ignore[no-untyped-call]
    return conn
