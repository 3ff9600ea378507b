"""A redis-py client from a URL for every topology (standalone, Sentinel, Cluster); its description.

``build`` reads redis-py's and Valkey's own URLs, kombu's forms of a socket and of Sentinel,
and ``redis+cluster://`` for a Cluster (kombu has none); ``describe`` says where any of these
clients connects, never with its password.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeAlias, TypeGuard, TypeVar, overload
from urllib.parse import parse_qsl, urlsplit

import redis
import redis.asyncio
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.sentinel import Sentinel, SentinelConnectionPool

from ...exceptions import ConfigurationError, LockStoreUnavailableError
from .urls import (
    CLUSTER_SCHEMES,
    REDLOCK_SCHEMES,
    SCHEMES,
    SENTINEL_SCHEMES,
    STANDALONE_SCHEMES,
    check_db_path,
    check_userinfo,
    credentials,
    failover_urls,
    host_port,
    redact,
    redis_url,
    scheme_of,
    unix_url,
)

# The redis-py clients a lock store takes: standalone (a Sentinel master is one) or
# Cluster, sync or asyncio.
SyncClient: TypeAlias = "redis.Redis | RedisCluster"
AsyncClient: TypeAlias = "redis.asyncio.Redis | AsyncRedisCluster"
Client: TypeAlias = "SyncClient | AsyncClient"
_Standalone = TypeVar("_Standalone", redis.Redis, redis.asyncio.Redis)

# Options that configure how Sentinel is asked, not the connection to the master.
_SENTINEL_OPTIONS = ("master_name", "sentinel_kwargs", "min_other_sentinels")


@overload
def build(
    url: str,
    options: Mapping[str, object] | None = None,
    *,
    asyncio: Literal[False] = False,
    bounded: bool = False,
) -> SyncClient: ...
@overload
def build(
    url: str,
    options: Mapping[str, object] | None = None,
    *,
    asyncio: Literal[True],
    bounded: bool = False,
) -> AsyncClient: ...
def build(
    url: str,
    options: Mapping[str, object] | None = None,
    *,
    asyncio: bool = False,
    bounded: bool = False,
) -> Client:
    """A client for ``url``; ``options`` are redis-py keyword arguments (plus Sentinel's).

    URL forms:

    - ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS),
      ``unix:///path?db=N``: redis-py's own ``from_url`` (``valkey://`` and ``valkeys://``,
      Valkey's forms, are read as ``redis://`` and ``rediss://``);
      ``redis+socket:///path?virtual_host=N``, kombu's form of a socket (a broker's, found
      as the default lock store), is read as ``unix://``.
    - ``sentinel://[[user]:password@]host:26379;sentinel://host2:26379/0`` with
      ``master_name`` (and optionally ``sentinel_kwargs``, ``min_other_sentinels``) in the
      options: kombu's form for a Sentinel broker. The password is the master's; the
      sentinels' own credentials go in ``sentinel_kwargs``.
    - ``redis+cluster://[[user]:password@]host:port[,host2:port2...]``
      (``rediss+cluster://`` for TLS): a Redis Cluster, given by one or more seed nodes.
      kombu has no cluster form; this one keeps the ``redis`` scheme readable and marks
      the topology the way ``redis+socket://`` marks a socket, and a list of seeds
      survives one being down.

    ``bounded``: a standalone sync client gets a ``BlockingConnectionPool`` (its
    ``max_connections`` and ``timeout`` options apply).

    Raises ``ConfigurationError`` naming what is wrong, before any connection is made.
    """
    kwargs: dict[str, Any] = dict(options or {})
    check_userinfo(url)
    url = redis_url(url)
    scheme = scheme_of(url)
    try:
        if scheme in SENTINEL_SCHEMES:
            return _sentinel(url, kwargs, asyncio=asyncio)
        if scheme in CLUSTER_SCHEMES:
            return _cluster(url, kwargs, asyncio=asyncio)
        if scheme in STANDALONE_SCHEMES:
            if scheme in ("redis", "rediss"):
                check_db_path(url)
            if scheme == "redis+socket":
                url = unix_url(url)
            if scheme in ("unix", "redis+socket") and not asyncio:
                _socket_options(kwargs)
            for name in _SENTINEL_OPTIONS:
                kwargs.pop(name, None)  # a broker's Sentinel options, not for this URL
            if bounded and not asyncio:
                # At most max_connections; a caller finding all in use waits for one
                # (up to the pool's timeout) instead of opening another.
                client = redis.Redis(
                    connection_pool=redis.BlockingConnectionPool.from_url(url, **kwargs)
                )
                client.auto_close_connection_pool = True
                return _checked(client)
            if asyncio:
                return _checked(redis.asyncio.Redis.from_url(url, **kwargs))
            return _checked(redis.Redis.from_url(url, **kwargs))
    except TypeError as error:
        raise ConfigurationError(
            f"a lock store option is not one redis-py takes ({error}); check the transport "
            "options given for the lock store"
        ) from None
    except ValueError as error:
        if isinstance(error, ConfigurationError):
            raise
        raise ConfigurationError(f"lock store URL {redact(url)} is not valid: {error}") from None
    raise ConfigurationError(
        f"lock store URL {redact(url)} has scheme {scheme!r}; use one of "
        f"{', '.join(s + '://' for s in SCHEMES if s not in REDLOCK_SCHEMES)}"
        + (" (several masters: Redlock.from_url)" if scheme in REDLOCK_SCHEMES else "")
    )


def _socket_options(options: dict[str, Any]) -> None:
    """redis-py 7 and 8 turn maintenance notifications on for RESP3 connections, then
    refuse to connect a unix socket (it has no host to name): off for a socket, unless
    the options say otherwise. Older redis-py has no such thing."""
    try:
        from redis.maint_notifications import MaintNotificationsConfig  # noqa: PLC0415
    except ImportError:
        return
    options.setdefault("maint_notifications_config", MaintNotificationsConfig(enabled=False))


def _checked(client: _Standalone) -> _Standalone:
    """``client``, once its pool can make a connection from its options.

    redis-py makes connections lazily, so an option it does not take would raise a bare
    TypeError at the first call instead of here. Making one connects to nothing.
    """
    pool = client.connection_pool
    pool.connection_class(**pool.connection_kwargs)
    return client


def _sentinel(url: str, options: dict[str, Any], *, asyncio: bool) -> Client:
    master_name = options.pop("master_name", None)
    if not master_name:
        raise ConfigurationError(
            f"lock store URL {redact(url)} is a Sentinel URL but no master_name was given: set "
            "singleton_lock_transport_options = {'master_name': 'mymaster'} (as kombu's "
            "broker_transport_options does)"
        )
    sentinel_kwargs = options.pop("sentinel_kwargs", None) or {}
    min_other = options.pop("min_other_sentinels", 0)
    nodes: list[tuple[str, int]] = []
    connection: dict[str, Any] = {}
    for one in failover_urls(url):
        part = urlsplit(one)
        if part.scheme.lower() not in SENTINEL_SCHEMES:
            raise ConfigurationError(
                f"lock store URL {redact(url)}: every part must be sentinel://"
            )
        nodes.append(host_port(part.netloc.rpartition("@")[2], 26379, url))
        connection.update(credentials(part))
        if part.path.strip("/"):
            connection["db"] = int(part.path.strip("/"))
        if part.scheme.lower() == "sentinels":
            connection["ssl"] = True
    connection.update(options)
    # Typed as Any: redis-py's annotations of these differ between its versions.
    sentinel_class: Any = AsyncSentinel if asyncio else Sentinel
    client_class: Any = redis.asyncio.Redis if asyncio else redis.Redis
    sentinel = sentinel_class(
        nodes, min_other_sentinels=min_other, sentinel_kwargs=sentinel_kwargs, **connection
    )
    master: Client = sentinel.master_for(master_name, redis_class=client_class)
    return master


def _cluster(url: str, options: dict[str, Any], *, asyncio: bool) -> Client:
    part = urlsplit(url)
    seeds = part.netloc.rpartition("@")[2]
    if part.path.strip("/") not in ("", "0"):
        raise ConfigurationError(
            f"lock store URL {redact(url)}: a cluster has only database 0; drop the /N"
        )
    hosts = [host_port(seed, 6379, url) for seed in seeds.split(",") if seed]
    if not hosts:
        raise ConfigurationError(f"lock store URL {redact(url)} names no cluster node")
    kwargs: dict[str, Any] = {**credentials(part), **dict(parse_qsl(part.query))}
    if part.scheme.lower().startswith("rediss"):
        kwargs["ssl"] = True
    for name in _SENTINEL_OPTIONS:
        options.pop(name, None)
    kwargs.update(options)
    kwargs.pop("db", None)
    node_class: Any = AsyncClusterNode if asyncio else ClusterNode
    cluster_class: Any = AsyncRedisCluster if asyncio else RedisCluster
    try:
        # The sync client asks its seeds for the slot map here, before any call.
        cluster: Client = cluster_class(startup_nodes=[node_class(*h) for h in hosts], **kwargs)
    except RedisClusterException as error:
        if "not enabled" in str(error):
            raise ConfigurationError(
                f"lock store URL {redact(url)} names a server that is not in cluster mode; "
                "for a standalone server write redis://host:port/0"
            ) from None
        raise LockStoreUnavailableError(
            f"lock store at {redact(url)} is unreachable: {error}", url=redact(url)
        ) from error
    return cluster


def _cluster_kwargs(client: object) -> dict[str, object] | None:
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        return None
    kwargs = getattr(manager, "connection_kwargs", None) or getattr(
        client, "connection_kwargs", None
    )
    return dict(kwargs or {})


def _auth(kwargs: Mapping[str, object]) -> str:
    user = kwargs.get("username")
    return f"{user}:***@" if user else ("***@" if kwargs.get("password") else "")


def describe(client: object) -> str:
    """Where ``client`` connects, for messages and logs: never includes the password."""
    cluster = _cluster_kwargs(client)
    if cluster is not None:
        manager = getattr(client, "nodes_manager", None)
        seeds = getattr(manager, "startup_nodes", {})
        names = (
            sorted(seeds)
            if isinstance(seeds, dict)
            else sorted(f"{n.host}:{n.port}" for n in seeds)
        )
        tls = cluster.get("ssl") or "SSL" in getattr(
            cluster.get("connection_class"), "__name__", ""
        )
        scheme = "rediss+cluster" if tls else "redis+cluster"
        return f"{scheme}://{_auth(cluster)}{','.join(names)}"
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {})
    service = getattr(pool, "service_name", None)
    if service is not None:
        sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", [])
        hosts = []
        for sentinel in sentinels:
            found = getattr(getattr(sentinel, "connection_pool", None), "connection_kwargs", {})
            hosts.append(f"{found.get('host', '?')}:{found.get('port', '?')}")
        db = kwargs.get("db", 0)
        return f"sentinel://{_auth(kwargs)}{';'.join(hosts)}/{db} (master {service!r})"
    if "path" in kwargs:
        return f"unix://{_auth(kwargs)}{kwargs['path']}?db={kwargs.get('db', 0)}"
    pool_class = getattr(pool, "connection_class", None)
    scheme = "rediss" if pool_class is not None and "SSL" in pool_class.__name__ else "redis"
    host = kwargs.get("host", "localhost")
    return f"{scheme}://{_auth(kwargs)}{host}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def socket_timeout_of(client: object) -> float | None:
    """The read timeout of ``client``'s connections, whatever its kind."""
    kwargs = _cluster_kwargs(client)
    if kwargs is None:
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    value = kwargs.get("socket_timeout")
    return float(value) if isinstance(value, (int, float)) else None


def is_async(client: object) -> TypeGuard[AsyncClient]:
    return isinstance(client, redis.asyncio.Redis | AsyncRedisCluster)


def eviction_policy(client: SyncClient) -> str | None:
    """The server's ``maxmemory-policy``; None if CONFIG is refused (ACL, managed Redis)."""
    try:
        found: object = client.config_get("maxmemory-policy")
    except redis.ResponseError:
        return None
    if (
        isinstance(found, dict)
        and found
        and not found.keys() & {"maxmemory-policy", b"maxmemory-policy"}
    ):
        found = next(iter(found.values()))  # a cluster client answers per node
    if not isinstance(found, dict):
        return None
    value = found.get("maxmemory-policy") or found.get(b"maxmemory-policy")
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def database_count(client: object) -> int | None:
    """How many databases a standalone server has (``CONFIG GET databases``, asked on
    database 0: the client's own may not exist); None if it cannot be asked."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, redis.ConnectionPool) or isinstance(pool, SentinelConnectionPool):
        return None  # a cluster has database 0 only; a sentinel's pool finds its master
    kwargs = {**pool.connection_kwargs, "db": 0}
    probe = redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    )
    try:
        found: object = probe.config_get("databases")
    except (redis.RedisError, OSError):
        return None
    finally:
        probe.close()
    value = found.get("databases") or found.get(b"databases") if isinstance(found, dict) else None
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
