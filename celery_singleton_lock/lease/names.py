"""Where a lock lives in Redis: the key layout under a prefix, and the checks on names and tokens.

Pure: no I/O. Every key of one lock shares the hash tag ``{name}``, so a lock's keys
hash to one Redis Cluster slot and its scripts never raise CROSSSLOT.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from urllib.parse import quote, unquote

from ..exceptions import ConfigurationError

DEFAULT_PREFIX = "singleton_lock"
MAX_NAME_LENGTH = 1024
MAX_TOKEN_LENGTH = 256

# Characters kept as they are in a lock name. Everything else is %-escaped, so a name
# built from user data cannot close the hash tag ('{', '}'), match as a glob pattern in
# a SCAN/KEYS of the prefix ('*', '?', '[', ']', '\\') or smuggle in whitespace.
_NAME_SAFE = ":/=@+,;!$&'()|<>^`"
# Names made only of what quote() keeps as it is (its own safe set plus ours).
_needs_quoting = re.compile(r"[^A-Za-z0-9_.~\-:/=@+,;!$&'()|<>^`]").search


# Separates a lock's name from the role of a companion lock (see ``companion``). A
# control character: no derived key contains it, and quote() escapes it in a tag.
ROLE_MARK = "\x1f"
ROLES = ("pending", "throttle")
# A counting lease's slots: "slot1" .. "slot<MAX_SLOTS>" (see ``slot``).
MAX_SLOTS = 100
_SLOT = re.compile(r"slot([1-9][0-9]*)")


def is_role(role: str) -> bool:
    found = _SLOT.fullmatch(role)
    return role in ROLES or (found is not None and int(found.group(1)) <= MAX_SLOTS)


def slot(name: str, number: int) -> str:
    """The name of slot ``number`` (1-based) of the counting lease ``name``.

    A slot is a lock of its own (renewed, released and fenced like any) whose fence,
    signal and waiters keys are ``name``'s: fences increase across every slot and a
    release of any slot wakes the oldest waiter for any.
    """
    return companion(name, f"slot{number}")


def check_limit(limit: object) -> int:
    """``limit`` as a counting lease's number of slots (1 to ``MAX_SLOTS``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SLOTS:
        raise ConfigurationError(f"limit must be an int from 1 to {MAX_SLOTS}, got {limit!r}")
    return limit


def companion(name: str, role: str) -> str:
    """The name of a second lock beside ``name`` (e.g. its pending call's hold).

    Its Redis keys share ``name``'s hash tag (one Cluster slot, so one script may touch
    both) and end in ``:<role>``, which no lock's own key does: they cannot collide.
    """
    if not is_role(role):
        raise ConfigurationError(
            f"unknown companion role {role!r}; one of {list(ROLES)} or slot1..slot{MAX_SLOTS}"
        )
    return f"{name}{ROLE_MARK}{role}"


def split_role(name: str) -> tuple[str, str | None]:
    """(base name, role) of a companion's name; (name, None) for a lock's own name."""
    base, mark, role = name.rpartition(ROLE_MARK)
    if mark and is_role(role):
        return base, role
    return name, None


@dataclass(frozen=True)
class LockKeys:
    """The Redis keys of one lock; all share the hash tag ``{name}`` (one cluster slot)."""

    lock: str
    fence: str
    signal: str
    waiters: str

    @property
    def replaced(self) -> str:
        """The tokens ``swap`` took this lock from (a set that expires with the hold)."""
        return f"{self.lock}:replaced"

    @property
    def history(self) -> str:
        """The lock's history (``history``): a stream of what happened to it."""
        return f"{self.lock}:history"

    @property
    def backlog(self) -> str:
        """The calls waiting for the lock (``max_pending``: ``limits.backlog``)."""
        return f"{self.lock}:backlog"

    @property
    def offer(self) -> str:
        """A value offered to the lock's holder (``offers``): a later call's arguments."""
        return f"{self.lock}:offer"

    @property
    def attached(self) -> str:
        """The canvas members attached to the lock's holder (``attachments``): their
        messages, by task id, kept until the holder's end answers or sends them."""
        return f"{self.lock}:attached"

    @property
    def rate(self) -> str:
        """The lock's rate limit (``rates``): its next call's theoretical arrival time."""
        return f"{self.lock}:rate"

    @classmethod
    def build(cls, prefix: str, name: str) -> LockKeys:
        name, role = split_role(name) if ROLE_MARK in name else (name, None)
        if not _needs_quoting(name):
            tag = f"{prefix}:{{{name}}}"  # the common case, at a fraction of quote()'s cost
        else:
            tag = f"{prefix}:{{{quote(name, safe=_NAME_SAFE)}}}"
        if role is None:
            return cls(tag, fence=f"{tag}:fence", signal=f"{tag}:signal", waiters=f"{tag}:waiters")
        if role.startswith("slot"):  # the lock's own fence and wake-ups (see ``slot``)
            return cls(f"{tag}:{role}", f"{tag}:fence", f"{tag}:signal", f"{tag}:waiters")
        own = f"{tag}:{role}"
        return cls(own, fence=f"{own}:fence", signal=f"{own}:signal", waiters=f"{own}:waiters")


def validate_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not prefix:
        raise ConfigurationError(f"prefix must be a non-empty string, got {prefix!r}")
    bad = set(prefix) & set("{}*?[]\\ \t\r\n")
    if bad:
        raise ConfigurationError(
            f"prefix {prefix!r} contains {''.join(sorted(bad))!r}: braces would break the "
            "cluster hash tag and glob characters would break SCAN of our keys; use "
            "letters, digits and ':' '_' '-' '.'"
        )
    return prefix


def validate_name(name: object) -> str:
    if not isinstance(name, str):
        raise ConfigurationError(
            f"lock name must be a str, got {type(name).__name__} {name!r}; derive one with "
            "celery_singleton_lock.keys if it comes from task arguments"
        )
    if not name:
        raise ConfigurationError("lock name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"lock name is {len(name)} characters, more than {MAX_NAME_LENGTH}; hash long "
            "names (celery_singleton_lock.keys does) instead of using them as keys",
            name=name[:64] + "...",
        )
    return name


def new_token(token: object) -> str:
    """``token`` checked, or a fresh random one when it is None."""
    if token is None:
        return secrets.token_hex(16)
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH:
        raise ConfigurationError(
            f"token must be a non-empty str of at most {MAX_TOKEN_LENGTH} characters, "
            f"got {token!r}; leave it out to get a random one"
        )
    return token


@dataclass(frozen=True)
class Held:
    """One held lock: a lock's own key, or a companion of it (its role says which)."""

    name: str  # the lock's name, as the caller gave it (a companion's base name)
    role: str | None  # None, "pending", "throttle", "slot<N>" or "rate"
    key: str  # the Redis key
    token: str  # the holder's token
    ttl: float | None  # seconds left; None when the key has no expiry
    # The lock's last fence, its holder's when running; None for a hold that takes no
    # fence, and for a slot (the slots of a limit share one counter).
    fence: int | None

    @property
    def full_name(self) -> str:
        """The name the store's calls take (``companion(name, role)`` for a companion;
        a rate's is its name's: it is no lock of its own)."""
        return self.name if self.role in (None, "rate") else companion(self.name, self.role)


def parse_key(prefix: str, key: str) -> tuple[str, str | None] | None:
    """(name, role) of a lock's Redis key under ``prefix``; None for bookkeeping keys."""
    head = f"{prefix}:{{"
    close = key.find("}", len(head)) if key.startswith(head) else -1
    if close < 0:
        return None
    # A name is either kept as it is (no '%' in it) or %-escaped whole (see names.py).
    name, rest = unquote(key[len(head) : close]), key[close + 1 :]
    if not rest:
        return name, None
    role = rest[1:]
    return (name, role) if rest[0] == ":" and is_role(role) else None
