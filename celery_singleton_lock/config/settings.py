"""One object that reads the app's ``singleton_lock_*`` settings, validated once, cached on the app.

Settings come from ``app.conf``, so every way of configuring Celery works, Django's included.
A bad value, or a misspelt ``singleton_lock_*`` key, is refused with a message naming the
setting.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from .._time import to_seconds, ttl_to_ms
from ..exceptions import ConfigurationError
from ..lease import DEFAULT_PREFIX, validate_prefix
from ..lease.redis.servers import server_named
from ..lease.redis.urls import SCHEMES, SENTINEL_SCHEMES, first_url, redact, scheme_of
from .spelling import in_users_words, refuse_unknown_keys

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.utils import Settings

OnRedisError: TypeAlias = Literal["fail_closed", "fail_open"]

DEFAULTS: dict[str, object] = {
    "singleton_lock_url": None,
    "singleton_lock_prefix": DEFAULT_PREFIX,
    "singleton_lock_ttl": 30.0,
    "singleton_lock_queue_ttl": 3600.0,
    "singleton_lock_on_redis_error": "fail_closed",
    "singleton_lock_transport_options": None,
    "singleton_lock_client": None,
    "singleton_lock_replicas": 0,
    "singleton_lock_replica_timeout": 0.5,
    # A worker serves Prometheus metrics on this port (celery_singleton_lock.contrib.metrics).
    "singleton_lock_metrics_port": None,
    "singleton_lock_metrics_addr": "127.0.0.1",
    # A dispatch's hold is taken by the script that pushes its message (broker/transport.py), when
    # the lock store is the broker's Redis server.
    "singleton_lock_ride_broker": True,
    # A singleton message pushed with its hold and then lost between the broker's pop
    # and its unacked record (a worker killed there) is pushed again after this long.
    "singleton_lock_transit_timeout": 10.0,
    # How often a worker looks for calls attached to holders that ended (broker/attached.py):
    # the holder's own worker sends them at its end; this finds those a crash left.
    "singleton_lock_attach_sweep": 0.5,
    # A RabbitMQ server's consumer_timeout (its default), which no client can read: the
    # library's own long waits go in hops shorter than it (config/visibility.py).
    "singleton_lock_consumer_timeout": 1800.0,
    # Each lock's history (lease.history): off unless asked for; its length and lifetime.
    "singleton_lock_history": False,
    "singleton_lock_history_length": 100,
    "singleton_lock_history_ttl": 86400.0,
    # The locks page (``celery singleton web``, celery_singleton_lock.contrib.web).
    "singleton_lock_web_host": "127.0.0.1",
    "singleton_lock_web_port": 5556,
    "singleton_lock_web_prefix": "",
    "singleton_lock_web_allow_release": False,
    "singleton_lock_web_basic_auth": None,
    "singleton_lock_web_refresh": 5.0,
    "singleton_lock_web_secret": None,
}
# Settings of celery-singleton that happen to share our prefix: an app migrating from it
# (or running both) must not be refused for them.
FOREIGN_KEYS = frozenset({"singleton_lock_expiry"})
MEMORY_URL = "memory://"
_CACHE_ATTRIBUTE = "_singleton_lock_config"
# Where Celery keeps each URL setting's connection options: (transport options, TLS).
_SOURCE_OPTIONS = {
    "broker_url": ("broker_transport_options", "broker_use_ssl"),
    "result_backend": ("result_backend_transport_options", "redis_backend_use_ssl"),
}
# The transport options of a broker or backend that mean the same to a redis-py client
# (kombu's others, like visibility_timeout, are about queues, not connections).
_SHARED_OPTIONS = (
    "master_name",
    "sentinel_kwargs",
    "min_other_sentinels",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "health_check_interval",
    "retry_on_timeout",
    "username",
    "password",
)


def _redis_url(value: object) -> str | None:
    """The lock store URL a setting gives, if it points at Redis.

    Brokers may list failover URLs (``redis://a;redis://b``): the first one is used. A
    Sentinel URL lists every sentinel that way, so it is kept whole.
    """
    if isinstance(value, list | tuple):
        value = ";".join(str(v) for v in value)
    if not isinstance(value, str) or not value:
        return None
    first = first_url(value)
    scheme = scheme_of(first)
    if scheme in SENTINEL_SCHEMES:
        return value.strip()
    return first if scheme in SCHEMES else None


def _options(conf: Settings, url: str | None, source: str, explicit: object) -> dict[str, Any]:
    """Client options for ``url``: those of the broker/backend it shares, then the user's."""
    if explicit is not None and not isinstance(explicit, dict):
        raise ConfigurationError(
            f"singleton_lock_transport_options must be a dict of redis-py client options, "
            f"got {type(explicit).__name__}"
        )
    options: dict[str, Any] = {}
    here = None if url is None else server_named(url)
    for setting, (transport, tls) in _SOURCE_OPTIONS.items():
        other = _redis_url(conf.get(setting))
        if url is None or other is None:
            continue
        if setting != source and not (here is not None and here.same_server(server_named(other))):
            continue
        shared = conf.get(transport) or {}
        options.update({k: v for k, v in shared.items() if k in _SHARED_OPTIONS})
        ssl = conf.get(tls)
        if isinstance(ssl, dict):
            options.update(ssl)
        break
    options.update(explicit or {})
    return options


def _replicas(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"singleton_lock_replicas must be an int >= 0 (replicas that must acknowledge each "
            f"lock write), got {value!r}"
        )
    return value


def _client_factory(value: object) -> Callable[[], Any] | None:
    """``singleton_lock_client``: a callable, or the dotted path of one."""
    if value is None or callable(value):
        return value
    if isinstance(value, str) and "." in value:
        module, _, attribute = value.replace(":", ".").rpartition(".")
        try:
            found = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise ConfigurationError(
                f"singleton_lock_client={value!r} cannot be imported ({error})"
            ) from None
        if callable(found):
            return found  # type: ignore[no-any-return]
    raise ConfigurationError(
        f"singleton_lock_client must be a callable returning a redis-py client (or its dotted "
        f"path), got {value!r}"
    )


@dataclass(frozen=True)
class SingletonConfig:
    """The validated ``singleton_lock_*`` settings of one Celery app."""

    url: str | None  # None: no Redis found; an error is raised at first use, not at import
    prefix: str
    ttl: float
    queue_ttl: float
    on_redis_error: OnRedisError
    url_source: str  # which setting the url came from, for error messages
    # redis-py client options (plus Sentinel's master_name/sentinel_kwargs): the
    # broker's or backend's when the store is the same server, then the user's own.
    transport_options: dict[str, Any] = field(default_factory=dict)
    # Builds the client itself (any redis-py client); wins over the URL.
    client_factory: Callable[[], Any] | None = None
    # A dispatch's hold rides its message's push where the broker is the store's server.
    ride_broker: bool = True
    # The broker's URL a producer writes to (its first, of a failover list): read once
    # here, as a dispatch compares it with the lock store's server.
    broker_url: str = ""
    # Replicas that must acknowledge (WAIT) each acquire and renewal, and for how long.
    replicas: int = 0
    replica_timeout: float = 0.5
    # Seconds a message pushed with its hold may be missing before it is pushed again (0: off).
    transit_timeout: float = 10.0
    # Seconds between a worker's sweeps of the calls attached to holders that ended.
    attach_sweep: float = 0.5
    # A RabbitMQ broker's consumer_timeout, in seconds (0: the server has none).
    consumer_timeout: float = 1800.0
    # Each lock keeps its history (a task's own ``history=`` option wins), its entries
    # about this many, expiring this long (s) after the last.
    history: bool = False
    history_length: int = 100
    history_ttl: float = 86400.0

    def __repr__(self) -> str:
        # Error reporters (Sentry, tracebacks with locals) print this from frame locals.
        shown = ", ".join(
            f"{name}={_hidden(name, getattr(self, name))!r}" for name in self.__dataclass_fields__
        )
        return f"SingletonConfig({shown})"

    @classmethod
    def from_app(cls, app: Celery) -> SingletonConfig:
        """Read (once) and cache the app's settings."""
        cached: SingletonConfig | None = getattr(app, _CACHE_ATTRIBUTE, None)
        if cached is None:
            cached = cls.from_conf(app.conf)
            setattr(app, _CACHE_ATTRIBUTE, cached)
        return cached

    @staticmethod
    def forget(app: Celery) -> None:
        """Drop the cached settings: the next use reads ``app.conf`` again (tests)."""
        if hasattr(app, _CACHE_ATTRIBUTE):
            delattr(app, _CACHE_ATTRIBUTE)

    @classmethod
    def from_conf(cls, conf: Settings) -> SingletonConfig:
        """The settings in ``conf``: an explicit value wins over the default; a bad value,
        or a misspelt ``singleton_lock_*`` key, is refused with a message naming the
        setting (as celery-redbeat's ``RedBeatConfig`` does).

        Under Django, ``app.config_from_object("django.conf:settings", namespace="CELERY")``
        with ``CELERY_SINGLETON_LOCK_TTL = 60`` in ``settings.py`` sets ``ttl``."""
        try:
            return cls._from_conf(conf)
        except ConfigurationError as error:
            # Named as the user wrote them: CELERY_SINGLETON_LOCK_TTL under Django.
            spelt = in_users_words(str(error), conf)
            if spelt == str(error):
                raise
            raise ConfigurationError(spelt) from None

    @classmethod
    def _from_conf(cls, conf: Settings) -> SingletonConfig:
        refuse_unknown_keys(conf, DEFAULTS, FOREIGN_KEYS)

        def get(name: str) -> object:
            value = conf.get(name)
            return DEFAULTS[name] if value is None else value

        factory = _client_factory(conf.get("singleton_lock_client"))
        url, source = cls._find_url(conf, get("singleton_lock_url"))
        if factory is not None and url is None:
            url, source = "client://", "singleton_lock_client"
        policy = get("singleton_lock_on_redis_error")
        if policy not in ("fail_closed", "fail_open"):
            raise ConfigurationError(
                f"singleton_lock_on_redis_error={policy!r}: use 'fail_closed' (refuse to run "
                "unlocked when Redis is unreachable) or 'fail_open' (run unlocked and log it)"
            )
        ride = get("singleton_lock_ride_broker")
        if not isinstance(ride, bool):
            raise ConfigurationError(
                f"singleton_lock_ride_broker={ride!r}: use True (a dispatch's hold rides its "
                "message's push on a redis:// broker) or False (kombu's own transport)"
            )
        try:
            prefix = validate_prefix(get("singleton_lock_prefix"))
        except ConfigurationError as error:
            raise ConfigurationError(f"singleton_lock_prefix: {error}") from None
        return cls(
            url=url,
            prefix=prefix,
            ttl=ttl_to_ms(get("singleton_lock_ttl"), what="singleton_lock_ttl") / 1000,
            queue_ttl=ttl_to_ms(get("singleton_lock_queue_ttl"), what="singleton_lock_queue_ttl")
            / 1000,
            on_redis_error=policy,
            url_source=source,
            transport_options=_options(
                conf, url, source, conf.get("singleton_lock_transport_options")
            ),
            client_factory=factory,
            ride_broker=ride,
            broker_url=broker_write_url(conf),
            replicas=_replicas(get("singleton_lock_replicas")),
            replica_timeout=to_seconds(
                get("singleton_lock_replica_timeout"), what="singleton_lock_replica_timeout"
            ),
            transit_timeout=_seconds_or_off(
                "singleton_lock_transit_timeout",
                get("singleton_lock_transit_timeout"),
                "the seconds a message lost between the broker's pop and a worker's receipt "
                "waits before it is pushed again (10 by default), or 0 to push nothing again",
            ),
            consumer_timeout=_consumer_timeout(get("singleton_lock_consumer_timeout")),
            attach_sweep=_attach_sweep(get("singleton_lock_attach_sweep")),
            **_history(get),
        )

    @staticmethod
    def _find_url(conf: Settings, explicit: object) -> tuple[str | None, str]:
        if explicit is not None:
            if explicit == MEMORY_URL:
                return MEMORY_URL, "singleton_lock_url"
            url = _redis_url(explicit)
            if url is None:
                raise ConfigurationError(
                    f"singleton_lock_url must be a {', '.join(s + '://' for s in SCHEMES)} "
                    f"URL, or {MEMORY_URL!r} for eager tests; got {redact(str(explicit))!r}"
                )
            return url, "singleton_lock_url"
        for setting in ("result_backend", "broker_url"):
            url = _redis_url(getattr(conf, setting, None) or conf.get(setting))
            if url is not None:
                return url, setting
        return None, ""

    def require_url(self) -> str:
        """The lock store's URL, or an error saying how to configure one."""
        if self.url is None:
            raise ConfigurationError(
                "celery-singleton-lock needs a Redis server: set singleton_lock_url (e.g. "
                "'redis://localhost:6379/1'; CELERY_SINGLETON_LOCK_URL under Django), or use a "
                f"Redis result backend or broker; use {MEMORY_URL!r} for task_always_eager tests"
            )
        return self.url


def _hidden(name: str, value: object) -> object:
    """``value`` with any password in it replaced by ``***`` (URLs, nested options)."""
    if isinstance(value, dict):
        return {k: _hidden(str(k), v) for k, v in value.items()}
    if "password" in name.lower() and value is not None:
        return "***"
    return redact(value) if name in ("url", "broker_url") and isinstance(value, str) else value


def broker_write_url(conf: Settings) -> str:
    """The broker's URL a producer writes to: its first, of a failover list."""
    return first_url(conf.broker_write_url or conf.broker_url)


def _seconds_or_off(name: str, value: object, use: str) -> float:
    """A timeout in seconds where 0 turns it off; ``use`` says what to write instead."""
    seconds = to_seconds(value, what=name)
    if seconds < 0:
        raise ConfigurationError(f"{name}={value!r}: use {use}")
    return seconds


def _attach_sweep(value: object) -> float:
    seconds = to_seconds(value, what="singleton_lock_attach_sweep")
    if seconds <= 0:
        raise ConfigurationError(
            f"singleton_lock_attach_sweep={value!r}: use the seconds between a worker's "
            "looks for calls attached to holders that ended (0.5 by default), above 0"
        )
    return seconds


def _consumer_timeout(value: object) -> float:
    use = (
        "your RabbitMQ server's consumer_timeout in seconds (rabbitmq.conf gives it in "
        "milliseconds: divide by 1000; 1800 by default), or 0 if it has none"
    )
    seconds = _seconds_or_off("singleton_lock_consumer_timeout", value, use)
    if seconds >= 1_000_000:  # 11.6 days: rabbitmq.conf's milliseconds, copied as they are
        raise ConfigurationError(f"singleton_lock_consumer_timeout={value!r} seconds: use {use}")
    return seconds


def _history(get: Callable[[str], object]) -> dict[str, Any]:
    """``singleton_lock_history`` and its length and lifetime, validated."""
    on, length = get("singleton_lock_history"), get("singleton_lock_history_length")
    if not isinstance(on, bool):
        raise ConfigurationError(f"singleton_lock_history={on!r}: use True or False")
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= 100_000:
        raise ConfigurationError(
            f"singleton_lock_history_length={length!r}: the entries each lock keeps, 1 to 100000"
        )
    ttl = ttl_to_ms(
        get("singleton_lock_history_ttl"), what="singleton_lock_history_ttl", allow_long=True
    )
    return {"history": on, "history_length": length, "history_ttl": ttl / 1000}
