"""The locks page's settings: ``singleton_lock_web_*`` from ``app.conf``, overridden by keywords.

Read once, validated here; a bad value is refused with a ``ConfigurationError`` naming
the setting, as every other ``singleton_lock_*`` setting is.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ...exceptions import ConfigurationError

if TYPE_CHECKING:
    from celery import Celery

NAMES = ("host", "port", "prefix", "allow_release", "basic_auth", "refresh", "secret")


@dataclass(frozen=True)
class WebSettings:
    """Where the page listens, under which path, who may see it, and whether it may release."""

    host: str = "127.0.0.1"  # loopback: a page that can release locks is not for the network
    port: int = 5556
    prefix: str = ""  # the URL path it is served under, e.g. "/locks"
    allow_release: bool = False
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    refresh: float = 5.0  # seconds between the list's refreshes (0: never)
    # Signs the release forms' CSRF tokens; random per process unless set (set it when
    # several processes serve the page, e.g. a Django project's workers).
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @classmethod
    def from_app(cls, app: Celery, **overrides: object) -> WebSettings:
        """The app's ``singleton_lock_web_*`` settings, then ``overrides`` (None: unset)."""
        given: dict[str, object] = {}
        for name in NAMES:
            value = overrides.get(name)
            if value is None:
                value = app.conf.get(f"singleton_lock_web_{name}")
            if value is not None:
                given[name] = value
        unknown = set(overrides) - set(NAMES)
        if unknown:
            raise ConfigurationError(f"unknown page setting(s) {sorted(unknown)}; known: {NAMES}")
        return cls().with_values(given)

    def with_values(self, given: dict[str, object]) -> WebSettings:
        """These settings with ``given`` (by name) validated and put in."""
        checked = {name: _validated(name, value) for name, value in given.items()}
        return replace(self, **checked)  # type: ignore[arg-type]

    def credentials_match(self, user: str, password: str) -> bool:
        if self.basic_auth is None:
            return True
        want_user, want_password = self.basic_auth
        # Both compared in full, in constant time: a mismatch of either tells nothing.
        users = hmac.compare_digest(user.encode(), want_user.encode())
        passwords = hmac.compare_digest(password.encode(), want_password.encode())
        return users and passwords


def _host(setting: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{setting} must be a host name or address, got {value!r}")
    return value


def _port(setting: str, value: object) -> int:
    digits = isinstance(value, int | str) and not isinstance(value, bool) and str(value).isdigit()
    if not digits or not 0 <= int(str(value)) <= 65535:
        raise ConfigurationError(f"{setting} must be a port number, got {value!r}")
    return int(str(value))


def _prefix(setting: str, value: object) -> str:
    if not isinstance(value, str) or any(c in value for c in "?#\\ "):
        raise ConfigurationError(f"{setting} must be a URL path like '/locks', got {value!r}")
    return ("/" + value.strip("/")) if value.strip("/") else ""


def _flag(setting: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{setting} must be True or False, got {value!r}")
    return value


def _seconds(setting: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigurationError(f"{setting} must be seconds (0: never), got {value!r}")
    return float(value)


def _credentials(setting: str, value: object) -> tuple[str, str]:
    if isinstance(value, str) and ":" in value:
        user, _, password = value.partition(":")
    elif isinstance(value, tuple | list) and len(value) == 2:
        user, password = (str(part) for part in value)
    else:
        # Never echo the value: it holds a password.
        raise ConfigurationError(f"{setting} must be 'user:password' or (user, password)")
    if not user or not password:
        raise ConfigurationError(f"{setting} needs both a user and a password ('user:password')")
    return user, password


def _secret(setting: str, value: object) -> bytes:
    if isinstance(value, str) and value:
        return value.encode()
    if isinstance(value, bytes) and value:
        return value
    raise ConfigurationError(f"{setting} must be a non-empty string")  # never shown: a secret


_RULES: dict[str, Callable[[str, object], object]] = {
    "host": _host,
    "port": _port,
    "prefix": _prefix,
    "allow_release": _flag,
    "basic_auth": _credentials,
    "refresh": _seconds,
    "secret": _secret,
}


def _validated(name: str, value: object) -> object:
    return _RULES[name](f"singleton_lock_web_{name}", value)
