"""Where a sync client connects, as a name two clients can compare: ``Server``, ``server_of``.

Riding another client's round trips (a broker's push, a result backend's write) is only
right when both clients reach one server: a standalone address (TCP or unix socket),
or one Sentinel-managed master, named by its service and sentinels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import redis


@dataclass(frozen=True)
class Server:
    """Where a standalone client connects: its address and database (not its password)."""

    # (host, port), a unix socket's path, or "sentinel:<service>@<sentinels>" for the
    # master a Sentinel group names (whichever server that is at the moment)
    address: tuple[str, int] | str
    db: int
    user: str | None = field(default=None, compare=False)  # the ACL user (None: default)

    def same_server(self, other: Server) -> bool:
        """Whether both are one Redis server (their databases may differ)."""
        return self.address == other.address

    def same_user(self, other: Server) -> bool:
        """Whether both are one server as one ACL user: what one client may do to the
        other's keys is what the other may do."""
        return self.same_server(other) and (self.user or "default") == (other.user or "default")


def server_of(client: object) -> Server | None:
    """The server a standalone sync client connects to, or the Sentinel-managed master
    (named by its service and its sentinels: its address can change under it); None for
    any other (Cluster, asyncio)."""
    if not isinstance(client, redis.Redis) or getattr(client, "nodes_manager", None):
        return None
    pool = client.connection_pool
    kwargs: Mapping[str, object] = getattr(pool, "connection_kwargs", {})
    db = kwargs.get("db") or 0
    if not isinstance(db, int):
        db = int(str(db))
    user = kwargs.get("username")
    user = user if isinstance(user, str) and user else None
    service = getattr(pool, "service_name", None)
    if service is not None:
        master = _sentinel_master(str(service), getattr(pool, "sentinel_manager", None))
        return None if master is None else Server(master, db, user)
    path = kwargs.get("path")
    if isinstance(path, str):
        return Server(path, db, user)
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return Server((str(host), int(str(port))), db, user)


def _sentinel_master(service: str, manager: object) -> str | None:
    """One name for a master whichever client asks its sentinels: the service and the
    sentinels' addresses, in order (None when they cannot be read)."""
    nodes = []
    for node in getattr(manager, "sentinels", None) or ():
        found = getattr(getattr(node, "connection_pool", None), "connection_kwargs", {})
        if "host" not in found:
            return None
        nodes.append(f"{found['host']}:{found.get('port', 26379)}")
    return f"sentinel:{service}@{','.join(sorted(nodes))}" if nodes else None
