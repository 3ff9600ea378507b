"""The options that limit runs: ``limit=``, ``rate=``, ``max_pending=``, ``total_limit=``."""

from __future__ import annotations

from collections.abc import Mapping

from ..exceptions import ConfigurationError
from ..lease.names import MAX_SLOTS
from ..modes import RateSpec


def limit_option(name: str, raw: Mapping[str, object]) -> int | None:
    """``limit=N``: N executions per key at once, never refused at dispatch."""
    limit = _runs_at_once(name, raw, "limit")
    if limit is None:
        return None
    clashes = _dispatch_options(raw)
    if clashes:
        raise ConfigurationError(
            f"{name}: limit={limit} with {', '.join(clashes)}: a limit never refuses a "
            "call at dispatch (every call queues and at most limit run at once); drop "
            f"{', '.join(clashes)}, or use a lock scope without limit"
        )
    return limit


def rate_option(name: str, raw: Mapping[str, object]) -> RateSpec | None:
    """``rate=``: runs started per key per period; every call is sent and none refused."""
    if raw.get("rate") is None:
        given = [option for option in ("burst", "cost", "on_limited") if option in raw]
        if given:
            raise ConfigurationError(
                f"{name}: {' and '.join(given)} without rate: {' and '.join(given)} shape a "
                "rate limit and do nothing alone; write rate='100/m' (or a callable of "
                "the task's arguments) with them, or drop them"
            )
        return None
    clashes = _dispatch_options(raw)
    if clashes:
        raise ConfigurationError(
            f"{name}: rate with {', '.join(clashes)}: a rate never refuses a call at "
            "dispatch (every call is sent and each run waits for its slot); drop "
            f"{', '.join(clashes)}, or drop rate (throttle=... accepts one call per window)"
        )
    return RateSpec.build(
        name, raw["rate"], raw.get("burst", 1), raw.get("on_limited", "defer"), raw.get("cost")
    )


def _dispatch_options(raw: Mapping[str, object]) -> list[str]:
    """The options given that decide a call at dispatch: none apply where every call is
    sent (``limit=``, ``rate=``)."""
    clashes = [option for option in ("throttle", "on_duplicate", "debounce") if option in raw]
    if raw.get("lock", "while_executing") != "while_executing":
        clashes.append(f"lock={raw['lock']!r}")
    if raw.get("dedupe") is True:
        clashes.append("dedupe=True")
    return clashes


def max_pending_option(name: str, raw: Mapping[str, object], lock: str) -> int | None:
    """``max_pending=N``: at most N calls of a key waiting; past it a call is refused at
    dispatch (``BackpressureError``). Only where every call queues (``rate=``,
    ``limit=``, ``lock="while_executing"``)."""
    cap = raw.get("max_pending")
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ConfigurationError(f"{name}: max_pending must be an int >= 1, got {cap!r}")
    if lock != "while_executing":
        raise ConfigurationError(
            f"{name}: max_pending={cap} with lock={lock!r}: it caps the calls queued behind "
            "a rate, a limit or lock='while_executing'; this lock keeps at most one call of "
            "a key waiting already (add rate=... or limit=..., or drop max_pending)"
        )
    return cap


def total_limit_option(name: str, raw: Mapping[str, object], limit: int | None) -> int | None:
    """``total_limit=M`` next to ``limit=N`` (``limit=1`` too: one run per key): at most M
    runs of the task at once across all its keys."""
    total = _runs_at_once(name, raw, "total_limit")
    if total is None:
        return None
    if limit is None:
        raise ConfigurationError(
            f"{name}: total_limit={total} without limit: it caps the runs of every key "
            "together, next to limit=N for each key; write limit=... with it (limit=1 "
            "for one run per key)"
        )
    return total


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
