"""What a lease operation found: released, extended or contended; script replies decoded."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..exceptions import LockNotAcquiredError


class ReleaseResult(enum.IntEnum):
    """What ``release`` found; the values are the release script's return codes."""

    RELEASED = 1
    EXPIRED = 0
    NOT_OWNER = -1


class ExtendResult(enum.IntEnum):
    """What ``extend`` found; the values are the extend script's return codes."""

    EXTENDED = 1
    CANCELLED = 2  # extended, and the lock it yields to is held: its holder should stop
    EXPIRED = 0
    NOT_OWNER = -1


_Result = TypeVar("_Result", ReleaseResult, ExtendResult)


def decode(code: object, result: type[_Result]) -> _Result:
    """The one place script codes become results; an unknown code is a bug, not a result."""
    try:
        return result(int(code))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise RuntimeError(f"{result.__name__}: unexpected script reply {code!r}") from None


LOSS = {
    ReleaseResult.EXPIRED: "it expired",
    ReleaseResult.NOT_OWNER: "another owner holds it",
    ExtendResult.EXPIRED: "it expired",
    ExtendResult.NOT_OWNER: "another owner holds it",
}


def text(value: object) -> str:
    """Replies are bytes or str depending on the client's decode_responses."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@dataclass(frozen=True)
class Contended:
    """A failed try: ``holder`` owns it ('' if the value is foreign), for ``retry_after`` s."""

    name: str
    key: str
    holder: str
    retry_after: float | None  # seconds; None when the holder's key has no TTL
    replaced: bool = False  # the caller's token was replaced (``RedisLock.swap``)

    @classmethod
    def combined(cls, name: str, key: str, each: Sequence[Contended], ttl_ms: int) -> Contended:
        """A failed try on several masters: the holder most name, the soonest retry (the
        ttl when none was held: the try failed for want of answers or time)."""
        holders = Counter(one.holder for one in each).most_common(1)
        waits = [one.retry_after for one in each if one.retry_after is not None]
        retry = min(waits) if waits else (None if each else ttl_ms / 1000)
        replaced = any(one.replaced for one in each)
        return cls(name, key, holders[0][0] if holders else "", retry, replaced=replaced)

    def error(self) -> LockNotAcquiredError:
        wait = "no ttl" if self.retry_after is None else f"{self.retry_after:.3f}s left"
        return LockNotAcquiredError(
            f"lock {self.name!r} is held by {self.holder or 'an unknown owner'!r} ({wait})",
            name=self.name,
            key=self.key,
            holder=self.holder or None,
            retry_after=self.retry_after,
        )
