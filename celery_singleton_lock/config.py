"""One object that reads the app's ``singleton_lock_*`` settings, validated once, cached on the app.

Settings come from ``app.conf``, so every way of configuring Celery works, including
Django's ``app.config_from_object("django.conf:settings", namespace="CELERY")`` with
``CELERY_SINGLETON_LOCK_TTL = 60`` in ``settings.py``. An explicit value wins over the
default; a bad value, or a misspelt ``singleton_lock_*`` key, is refused with a
message naming the setting (as celery-redbeat's ``RedBeatConfig`` does).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias
from urllib.parse import urlsplit

from ._time import ttl_to_ms
from .exceptions import ConfigurationError
from .lock import DEFAULT_PREFIX, validate_prefix

OnRedisError: TypeAlias = Literal["fail_closed", "fail_open"]

DEFAULTS: dict[str, Any] = {
    "singleton_lock_url": None,
    "singleton_lock_prefix": DEFAULT_PREFIX,
    "singleton_lock_ttl": 30.0,
    "singleton_lock_queue_ttl": 3600.0,
    "singleton_lock_on_redis_error": "fail_closed",
}
# Settings of celery-singleton that happen to share our prefix: an app migrating from it
# (or running both) must not be refused for them.
FOREIGN_KEYS = frozenset({"singleton_lock_expiry"})
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+socket")
MEMORY_URL = "memory://"
_CACHE_ATTRIBUTE = "_singleton_lock_config"


def _redis_url(value: object) -> str | None:
    """The first URL of a setting if it points at Redis (brokers may list failovers)."""
    if isinstance(value, list | tuple):
        value = value[0] if value else None
    if not isinstance(value, str) or not value:
        return None
    first = value.split(";", 1)[0].strip()
    return first if urlsplit(first).scheme in REDIS_SCHEMES else None


@dataclass(frozen=True)
class SingletonConfig:
    """The validated ``singleton_lock_*`` settings of one Celery app."""

    url: str | None  # None: no Redis found; an error is raised at first use, not at import
    prefix: str
    ttl: float
    queue_ttl: float
    on_redis_error: OnRedisError
    url_source: str  # which setting the url came from, for error messages

    @classmethod
    def from_app(cls, app: Any) -> SingletonConfig:
        """Read (once) and cache the app's settings."""
        cached: SingletonConfig | None = getattr(app, _CACHE_ATTRIBUTE, None)
        if cached is None:
            cached = cls.from_conf(app.conf)
            setattr(app, _CACHE_ATTRIBUTE, cached)
        return cached

    @classmethod
    def from_conf(cls, conf: Any) -> SingletonConfig:
        _refuse_unknown_keys(conf)

        def get(name: str) -> Any:
            value = conf.get(name)
            return DEFAULTS[name] if value is None else value

        url, source = cls._find_url(conf, get("singleton_lock_url"))
        policy = get("singleton_lock_on_redis_error")
        if policy not in ("fail_closed", "fail_open"):
            raise ConfigurationError(
                f"singleton_lock_on_redis_error={policy!r}: use 'fail_closed' (refuse to run "
                "unlocked when Redis is unreachable) or 'fail_open' (run unlocked and log it)"
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
        )

    @staticmethod
    def _find_url(conf: Any, explicit: object) -> tuple[str | None, str]:
        if explicit is not None:
            if explicit == MEMORY_URL:
                return MEMORY_URL, "singleton_lock_url"
            url = _redis_url(explicit)
            if url is None:
                raise ConfigurationError(
                    f"singleton_lock_url must be a redis://, rediss:// or unix:// URL, or "
                    f"{MEMORY_URL!r} for eager tests; got a {urlsplit(str(explicit)).scheme!r} URL"
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


def _refuse_unknown_keys(conf: Any) -> None:
    names: set[str] = set()
    for key in list(conf.keys()):
        lowered = str(key).lower()
        for prefix in ("celery_singleton_lock_", "singleton_lock_"):
            if lowered.startswith(prefix):
                names.add("singleton_lock_" + lowered[len(prefix) :])
                break
    unknown = sorted(names - DEFAULTS.keys() - FOREIGN_KEYS)
    if unknown:
        hints = {n: difflib.get_close_matches(n, list(DEFAULTS), n=1) for n in unknown}
        described = ", ".join(f"{n} (did you mean {h[0]}?)" if h else n for n, h in hints.items())
        raise ConfigurationError(
            f"unknown celery-singleton-lock setting: {described}; known settings are "
            f"{sorted(DEFAULTS)}"
        )
