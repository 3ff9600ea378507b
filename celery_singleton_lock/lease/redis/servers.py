"""Where a client or a URL connects, as a name two can compare: ``Server``, ``server_of``.

Riding another client's round trips (a broker's push, a result backend's write) is only
right when both clients reach one server (``Server.same_server``, the one rule): a
standalone address (TCP or unix socket), or one Sentinel-managed master.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

import redis

from .urls import SENTINEL_SCHEMES, STANDALONE_SCHEMES, failover_urls, first_url

# A standalone server's schemes that name a unix socket (redis-py's, kombu's); the
# others name a host and port.
_SOCKET_SCHEMES = ("unix", "redis+socket")


@dataclass(frozen=True)
class Server:
    """Where a standalone client or URL connects: its address and database (not its password)."""

    # (host, port), a unix socket's path, or "sentinel:<service>@<sentinels>" for the
    # master a Sentinel group names (whichever server that is at the moment; a URL's
    # group, whose service the URL does not name: "sentinel:@<sentinels>")
    address: tuple[str, int] | str
    db: int
    user: str | None = field(default=None, compare=False)  # the ACL user (None: default)

    def same_server(self, other: Server | None) -> bool:
        """Whether both are one Redis server (their databases may differ): the one rule
        for riding another client's round trips, and for sharing its options."""
        if other is None:
            return False
        return self.address == other.address or _one_sentinel_group(self.address, other.address)

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


def server_named(url: str) -> Server | None:
    """The server a URL names, its first of a failover list, as ``server_of`` names a
    client's: ``redis://`` and ``valkey://`` forms by host and port (redis-py's defaults
    filled in), sockets by path, a Sentinel group by its sentinels (its master's name is
    not in the URL). None for a Cluster, another scheme, or a URL that cannot be read."""
    first = first_url(url)
    try:
        parts = urlsplit(first)
        scheme = parts.scheme.lower()
        if scheme in SENTINEL_SCHEMES:
            return _sentinels_named(url)
        user = unquote(parts.username) if parts.username else None
        if scheme in _SOCKET_SCHEMES:
            return Server(parts.path, _db(parts), user)
        if scheme in STANDALONE_SCHEMES:
            return Server((parts.hostname or "localhost", parts.port or 6379), _db(parts), user)
    except ValueError:  # a port that is not a number, an unclosed [IPv6 address
        return None
    return None


def _one_sentinel_group(one: tuple[str, int] | str, other: tuple[str, int] | str) -> bool:
    """Whether two Sentinel names are one group's master: the same service, or one named
    by a URL (which names none), and a sentinel in common (a broker's failover list and a
    lock URL that names one of its sentinels: one group, as it was read before the list)."""
    if not (isinstance(one, str) and isinstance(other, str)):
        return False
    if not (one.startswith("sentinel:") and other.startswith("sentinel:")):
        return False
    service, _, nodes = one.removeprefix("sentinel:").partition("@")
    other_service, _, other_nodes = other.removeprefix("sentinel:").partition("@")
    if service and other_service and service != other_service:
        return False
    return bool(set(nodes.split(",")) & set(other_nodes.split(",")))


def _sentinels_named(url: str) -> Server:
    # As _sentinel_master names a client's, less the service: the URL does not name it.
    nodes, db = [], 0
    for one in failover_urls(url):
        parts = urlsplit(one)
        nodes.append(f"{parts.hostname or 'localhost'}:{parts.port or 26379}")
        db = _db(parts) or db  # as the client reads the URL: the last database given
    return Server(f"sentinel:@{','.join(sorted(nodes))}", db)


def _db(parts: SplitResult) -> int:
    """The database a URL selects: its path (``/3``), else ``?db=`` (kombu's sockets:
    ``?virtual_host=``); 0 when it names none."""
    query = dict(parse_qsl(parts.query))
    path = "" if parts.scheme.lower() in _SOCKET_SCHEMES else parts.path.strip("/")
    text = path or query.get("db") or query.get("virtual_host") or "0"
    return int(text) if text.isdigit() else 0


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
