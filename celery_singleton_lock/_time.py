"""Time arithmetic shared by the lease, the policies and the modes: durations in, delays and
readable durations out."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import timedelta

from .exceptions import ConfigurationError

Duration = int | float | timedelta

ONE_DAY = 86400.0


def to_seconds(value: object, *, what: str) -> float:
    """Normalise ``int | float | timedelta`` to float seconds, once, at the edge.

    Refuses what would silently mean something else: ``bool`` (``True`` is not one
    second), strings, NaN and infinities.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{what} must be a number of seconds or a datetime.timedelta, "
            f"got {type(value).__name__} {value!r}"
        )
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{what} must be a finite number of seconds, got {value!r}")
    return seconds


def ttl_to_ms(value: object, *, what: str = "ttl", allow_long: bool = False) -> int:
    """Validate a lease duration and return it in whole milliseconds (>= 1)."""
    seconds = to_seconds(value, what=what)
    if seconds <= 0:
        raise ConfigurationError(
            f"{what} must be positive, got {value!r}: a lease without a TTL would never "
            "free itself when its holder dies"
        )
    if seconds > ONE_DAY and not allow_long:
        raise ConfigurationError(
            f"{what}={seconds:g}s is longer than a day; a dead holder would block the key "
            "that long. Use a shorter ttl with renewal, or pass allow_long_ttl=True if you "
            "really mean it"
        )
    # Round up so a sub-millisecond ttl still means "some time", never PX 0 (an error).
    return max(1, math.ceil(seconds * 1000))


def full_jitter(
    attempt: int,
    *,
    base: float,
    cap: float,
    rng: Callable[[], float] = random.random,
) -> float:
    """Delay before retry number ``attempt`` (0-based): uniform in [0, min(cap, base * 2**n)].

    "Full jitter" from the AWS architecture blog: contenders spread out instead of
    retrying in lockstep, and the expected delay still doubles per attempt.
    """
    ceiling = min(cap, base * (2 ** min(attempt, 62)))
    return float(ceiling * rng())


def human(seconds: float | None) -> str:
    """``42s``, ``5m03s``, ``2h10m``, ``3d04h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"
