"""The options that limit runs: ``limit=``, ``rate=``, ``max_pending=``, ``total_limit=``."""

from __future__ import annotations

from collections.abc import Mapping

from ..exceptions import ConfigurationError
from ..lease.names import MAX_SLOTS
from ..modes import RateSpec


def limit_option(name: str, raw: Mapping[str, object]) -> int | None:
    """``limit=N``: N executions per key at once, never refused at dispatch."""
    return _runs_at_once(name, raw, "limit")


def rate_option(name: str, raw: Mapping[str, object]) -> RateSpec | None:
    """``rate=``: runs started per key per period; every call is sent and none refused."""
    if raw.get("rate") is None:
        return None
    return RateSpec.build(
        name, raw["rate"], raw.get("burst", 1), raw.get("on_limited", "defer"), raw.get("cost")
    )


def max_pending_option(name: str, raw: Mapping[str, object]) -> int | None:
    """``max_pending=N``: at most N calls of a key waiting; past it a call is refused at
    dispatch (``BackpressureError``). Only where every call queues (``rate=``,
    ``limit=``, ``lock="while_executing"``)."""
    cap = raw.get("max_pending")
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ConfigurationError(f"{name}: max_pending must be an int >= 1, got {cap!r}")
    return cap


def total_limit_option(name: str, raw: Mapping[str, object]) -> int | None:
    """``total_limit=M`` next to ``limit=N`` (``limit=1`` too: one run per key): at most M
    runs of the task at once across all its keys."""
    return _runs_at_once(name, raw, "total_limit")


def slotted_limit(limit: int | None, total: int | None) -> int | None:
    """The per-key limit run in slots (``modes.Limit``), or None for plain exclusion.

    ``limit=1`` alone is ``lock="while_executing"``: the run holds the key itself. Next
    to ``total_limit`` it is a counting lease of one slot, so that the task-wide total
    is taken, renewed and released for a dead child as with ``limit=N``.
    """
    return None if limit == 1 and total is None else limit


def _runs_at_once(name: str, raw: Mapping[str, object], option: str) -> int | None:
    """``option``'s count of runs at once (None when not given), checked."""
    value = raw.get(option)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOTS:
        raise ConfigurationError(
            f"{name}: {option} must be an int from 1 to {MAX_SLOTS}, got {value!r}"
        )
    return value
