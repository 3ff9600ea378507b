"""A rate limit as users write it: calls per period, a burst, and what one call costs.

The one parser of ``rate=`` (Celery's ``rate_limit`` forms, ``"100/m"``, and a few more; one
or a list), ``burst=``, ``cost=`` and ``on_limited=``, for tasks and operators alike; the
schedules a rate keeps per name live in ``rates.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from ...exceptions import ConfigurationError, CostOverBurstError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_CELERY_FORM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*)\s*([smhd])\s*$")
# What a call over its rate gets: deferred at execution, sent with the countdown to its
# slot, or refused at dispatch.
ON_LIMITED = ("defer", "delay", "raise")

# A call's cost: units (a number), or a callable of the task's arguments returning them.
Cost = float | Callable[..., object]


@dataclass(frozen=True)
class Rate:
    """``limit`` calls per ``period`` seconds, up to ``burst`` of them back to back."""

    limit: int
    period: float
    burst: int = 1

    @property
    def interval(self) -> float:
        """Seconds between two calls once the burst is spent."""
        return self.period / self.limit

    def __str__(self) -> str:
        text = f"{self.limit}/{human_period(self.period)}"
        return text if self.burst == 1 else f"{text} (burst {self.burst})"


def human_period(seconds: float) -> str:
    """A period as Celery's rate_limit writes it: ``m`` for 60, ``5m`` for 300."""
    for unit, size in reversed(_UNITS.items()):
        count = seconds / size
        if count >= 1 and count == int(count):
            return unit if count == 1 else f"{int(count)}{unit}"
    return f"{seconds:g}s"


# A name's last pause: when it began and when it ended (seconds since the epoch).
Pause = tuple[float, float]

# What one call is charged: (its rate, the units it costs against it), per limit.
Charges = Sequence[tuple[Rate, float]]


def charges(rate: Rate | Charges, cost: float = 1.0) -> Charges:
    """``ask``'s limits: one ``Rate`` at ``cost`` units, or (rate, cost) pairs already."""
    return [(rate, cost)] if isinstance(rate, Rate) else rate


def burst_for(cost: float) -> int:
    """The least burst a call costing ``cost`` units can start under."""
    return math.ceil(cost)


def check_cost(name: str, limits: Charges) -> None:
    """Refuse a cost no slot could ever take: more units than a limit's burst."""
    for rate, cost in limits:
        if cost > rate.burst:
            raise CostOverBurstError(
                f"{name!r}: a call costing {cost:g} units can never start under {rate}, "
                f"which lets at most {rate.burst} start at once: raise that limit's burst "
                f"to the largest cost (burst={burst_for(cost)}), or split the call"
            )
        if cost < 0:
            raise CostOverBurstError(f"{name!r}: a call's cost must be 0 or more, not {cost:g}")


def listed_rates(value: object) -> Sequence[object]:
    """The rates a ``rate=`` names, in order: a list (or a tuple of them), or one."""
    if isinstance(value, list) or (isinstance(value, tuple) and not _one_rate(value)):
        return value
    return [value]


def _one_rate(value: tuple[object, ...]) -> bool:
    # (100, 60.0) or (100, timedelta(minutes=1)) is one rate; ("60/m", "10000/d") two.
    first, *rest = value if value else (None,)
    return (
        len(value) == 2
        and isinstance(first, int | float)
        and not isinstance(first, bool)
        and isinstance(rest[0], int | float | timedelta)
    )


def parse_rate(value: object, burst: object = 1, *, what: str = "rate") -> Rate:
    """A ``Rate`` from Celery's ``rate_limit`` forms (``"100/m"``, ``"10/s"``, ``"5/h"``; a
    number: per second), ``"100/5m"``, ``(100, timedelta(minutes=1))`` or
    ``(100, 60.0)``, or a ``Rate``; ``burst`` calls may start back to back."""
    if isinstance(value, Rate):
        return value if burst == 1 else Rate(value.limit, value.period, parse_burst(burst, what))
    limit: object
    period: object
    if isinstance(value, str):
        match = _CELERY_FORM.match(value)
        if match is None:
            raise ConfigurationError(
                f"{what}={value!r}: write calls per period the way Celery's rate_limit does, "
                "e.g. '100/m', '10/s', '5/h', or '100/5m'"
            )
        limit = float(match.group(1))
        period = float(match.group(2) or 1) * _UNITS[match.group(3)]
    elif isinstance(value, tuple) and len(value) == 2:
        limit, period = value
        if isinstance(period, timedelta):
            period = period.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        limit, period = value, 1.0
    else:
        raise ConfigurationError(
            f"{what}={value!r}: write '100/m' (Celery's rate_limit form), a number per "
            "second, or (calls, timedelta(...))"
        )
    if isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0:
        raise ConfigurationError(f"{what}={value!r}: the number of calls must be positive")
    if not isinstance(period, int | float) or isinstance(period, bool) or period <= 0:
        raise ConfigurationError(f"{what}={value!r}: the period must be positive")
    if limit != int(limit):  # "0.5/s" is one call every two seconds
        return Rate(1, float(period) / float(limit), parse_burst(burst, what))
    return Rate(int(limit), float(period), parse_burst(burst, what))


def parse_burst(burst: object, what: str) -> int:
    """``burst=``: how many calls may start back to back."""
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ConfigurationError(f"{what}: burst={burst!r} must be a whole number of calls >= 1")
    return burst


def parse_cost(cost: object, what: str, *rates: Rate) -> Cost | None:
    """``cost=`` as given: None, units (0 or more, within every rate's burst), or a
    callable of the task's arguments (checked per call)."""
    if cost is None or callable(cost):
        return cost
    if isinstance(cost, bool) or not isinstance(cost, int | float) or cost < 0:
        raise ConfigurationError(
            f"{what}: cost={cost!r}: give the units a call costs (a number, 0 or more), or "
            "a callable of the task's arguments returning them"
        )
    for rate in rates:
        if cost > rate.burst:
            raise ConfigurationError(
                f"{what}: cost={cost!r} is more than the burst of {rate}: no call could "
                f"ever start; give that limit burst={burst_for(cost)} or more"
            )
    return float(cost)


def parse_on_limited(on_limited: object, what: str) -> str:
    """``on_limited=``: what a call over its rate gets (``ON_LIMITED``)."""
    if on_limited not in ON_LIMITED:
        raise ConfigurationError(
            f"{what}: on_limited={on_limited!r}: choose 'defer' (the default: deferred "
            "at execution), 'delay' (sent with the countdown to its slot) or 'raise'"
        )
    return str(on_limited)
