"""A BLPOP wait for a wake-up that ends by its timeout plus a grace, whatever the server does.

The waiting client has no socket timeout, since a BLPOP may rightly block longer than
any sensible one; so a frozen server, or one cut off by a partition, would hold
redis-py's ``blpop`` for ever (TCP never says a silent peer is gone).
"""

from __future__ import annotations

import asyncio

import redis
from redis.cluster import RedisCluster

from .calls import Response
from .clients import AsyncClient, SyncClient
from .connections import takes_command_name
from .replies import GRACE


def pop_within(client: SyncClient, key: str, seconds: float) -> Response:
    """``BLPOP key seconds``: its answer, or ``redis.TimeoutError`` once ``seconds +
    GRACE`` have passed without one. None also when a cluster has moved the key (the
    next try follows it the client's own way).

    Past that deadline the connection is dropped and the store counts as unreachable
    (the caller's outage policy applies). A wake-up popped on the server just then is
    lost with it; the waiters it would have woken still wake by their own timeouts,
    which never outlast the holder's ttl.
    """
    if isinstance(client, RedisCluster):  # the node that serves the key
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        client = client.get_redis_connection(node)
    pool = client.connection_pool
    conn = pool.get_connection("BLPOP") if takes_command_name(pool) else pool.get_connection()
    try:
        conn.send_command("BLPOP", key, seconds)  # type: ignore[no-untyped-call]
        answered = conn.can_read(timeout=seconds + GRACE)
        reply = conn.read_response() if answered else None
    except redis.ResponseError as error:
        pool.release(conn)
        if str(error).startswith(("MOVED", "ASK")):
            return None
        raise
    except BaseException:
        # An answer may still come: it must not be read as another's.
        conn.disconnect()  # type: ignore[no-untyped-call]
        pool.release(conn)
        raise
    if not answered:
        conn.disconnect()  # type: ignore[no-untyped-call]
    pool.release(conn)
    if not answered:
        raise unanswered(seconds)
    return reply


def unanswered(seconds: float) -> redis.TimeoutError:
    return redis.TimeoutError(f"BLPOP of {seconds:g}s unanswered after {GRACE:g}s more")


async def pop_within_async(client: AsyncClient, key: str, seconds: float) -> Response:
    """``pop_within`` for an asyncio client (cancelling the read drops its connection)."""
    try:
        return await asyncio.wait_for(client.blpop([key], timeout=seconds), seconds + GRACE)
    except TimeoutError:
        raise unanswered(seconds) from None
