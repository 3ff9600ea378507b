"""Per-name rate limits: GCRA in one script per call, a slot now or the next one reserved.

GCRA (the generic cell rate algorithm: redis-cell's and Stripe's) is exact and keeps O(1)
memory per name; a second GCRA, the gate, lets a run that comes late still start, never more
than the rate lets through. How both work: ``Rates``, as ``lua/rate.lua`` runs them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..outcomes import text
from ..redis import scripts
from ..redis.common import REDIS_ERRORS
from ..redis.store import RedisLock, one_server
from .rate_forms import Charges, Pause, Rate, charges, check_cost, human_period, parse_rate

if TYPE_CHECKING:
    from ..history import Record

How = Literal["take", "reserve", "peek", "start", "due"]

# ``grace`` for a run that starts on its slot however late (a pause held it back).
ANY_LATENESS = -1.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slot:
    """One answer of a rate: when the call may start, and the budget left after it."""

    state: Literal["now", "reserved", "refused"]
    at: float  # the slot, in the rate's clock's seconds (the server's for Redis)
    wait: float  # seconds from now until the slot (0 when now)
    remaining: int  # calls that may start now after this one
    clock: float  # the rate's clock as it answered
    free: float  # the earliest slot of the next call, on that clock
    limiting: int = 0  # which of the name's limits set the slot (its place in the list)
    # A run's start: how to give it back if the run does not start after all.
    charge: Charge | None = None

    @property
    def now(self) -> bool:
        return self.state == "now"


@dataclass(frozen=True)
class Charge:
    """A run's start as its rate counted it: the rate's ``key`` as the start ``left`` it,
    and as it was ``before``. A run that does not start after all (kept waiting for its
    turn) gives it back by writing ``before``, only while the key still reads ``left``:
    a later start built on it keeps it (GCRA has one number per limit, no holes)."""

    key: str
    left: str
    before: str


_STATES: dict[int, Literal["now", "reserved", "refused"]] = {
    1: "now",
    2: "reserved",
    0: "refused",
}


class Rates:
    """The rate limits of one lock store, ``rates_of(store).ask(name, rate, how)``:
    ``scripts.RATE`` on a ``RedisLock`` (``memory://`` included).

    GCRA keeps two numbers per name and limit, the theoretical arrival time (TAT) of the
    next call's slot (the schedule) and of the next run's start (the gate, below), in a key
    beside the name's lock (``LockKeys.rate``: bookkeeping, not a lock the inventory lists)
    that expires once every TAT has passed: O(1) memory, nothing left behind. It is exact:
    with ``limit`` units per ``period`` and a ``burst`` of B, units start no closer than
    ``period / limit`` apart once the burst is spent, and no window of length W holds more
    than B - 1 + ceil(W * limit / period) of them (with B = 1 and one unit a call, at most
    ``limit`` calls in any window of ``period``). A sliding-window counter is approximate
    and a sliding log costs a list entry per call; GCRA needs neither. A call may cost
    several units (``cost``: tokens, bytes): its TAT moves on by that many intervals, so a
    cost above the burst could never start and is refused.

    Several limits of one name (``"60/m"`` and ``"10000/d"``; calls and tokens a minute)
    are decided in one script: a call is charged against every one of them at the latest
    slot any of them gives, or against none. A limit is its place in the list: a rate
    changed in place keeps its schedule.

    At dispatch, three ways to ask (``how``) of the schedule: ``take`` a slot now or be
    refused (``retry_after``); ``reserve`` a slot now or the next free one, counted at
    once, so calls deferred in turn keep their order and never share a slot; ``peek`` at
    the budget without taking. At a run's start, two: ``start`` on the next free slot, and
    whether a slot reserved earlier is ``due``. A run whose slot is ``near`` (less than
    sending the message round would cost) waits for it where it is: ``now``, with a ``wait``.

    A run starts through a second GCRA beside the schedule, the gate, which counts the
    slots runs started on. On its slot if it comes within its ``grace``; later than that
    (its worker was saturated, or died holding it) as soon as the gate has room if that is
    near, else on the next free slot. Slots alone would leave a late run only a new slot,
    and on workers that stay behind every run is late again: the slots pass unused and
    nothing starts. The gate lets through what the schedule would: no window of the slots
    runs start on holds more than the rate (plus ``burst - 1``), however late they come or
    the order they come in; a run a pause kept waiting starts on its slot however late, if
    the gate lets it. The clock is the server's (``TIME``), one for every worker.
    """

    def __init__(self, store: RedisLock) -> None:
        self._redis = store
        self._script = store.client.register_script(scripts.RATE)
        self._keep = store.client.register_script(scripts.KEEP_RATE)

    def ask(
        self,
        name: str,
        rate: Rate | Charges,
        how: How = "take",
        at: float = 0.0,
        *,
        entry: Record | None = None,
        paused: Pause | None = None,
        grace: float = ANY_LATENESS,
        near: float = 0.0,
    ) -> Slot:
        """One script, one round trip (see the class's docstring): ``rate`` is one
        limit (a call costs one unit) or (rate, cost) pairs; ``at`` is the slot a
        ``due`` asks about; ``entry``, the history entry it writes; ``paused``, the
        name's last pause (its schedule moves on by its length, once); ``grace``, how
        late a run may start on its slot (``ANY_LATENESS``: however late); ``near``, how
        soon a run's slot must come for it to wait there (``now``, with ``wait``)."""
        limits = charges(rate)
        check_cost(name, limits)
        began, ended = paused if paused is not None else (0.0, 0.0)
        args: list[int | str] = [how, round(at * 1e6) if how == "due" else 0]
        args += [round(began * 1e6), round(ended * 1e6), _micros(grace), _micros(near)]
        for each, cost in limits:
            interval = max(1, round(each.interval * 1e6))
            units = int(cost) if cost == int(cost) else repr(float(cost))
            args += [interval, (each.burst - 1) * interval, units]
        try:
            reply = self._redis.pipelining.call(self._script, [self.key(name)], args, entry=entry)
        except REDIS_ERRORS as error:
            self._redis.unavailable(error, name)
        state, at, wait, remaining, clock, free, limiting = (int(part) for part in reply[:7])
        charge = None
        if len(reply) > 7:  # a run's start, with the key before it
            charge = Charge(self.key(name), text(reply[7]), text(reply[8]))
        return Slot(
            _STATES[state], at / 1e6, wait / 1e6, remaining, clock / 1e6, free / 1e6,
            limiting - 1, charge,
        )  # fmt: skip

    def key(self, name: str) -> str:
        """The Redis key of ``name``'s rate (``LockKeys.rate``)."""
        return str(self._redis.keys(name).rate)

    def keep(self, name: str, seconds: float) -> None:
        """Keep ``name``'s schedule at least ``seconds`` more, though every slot on it
        has passed (``lua/keep_rate.lua``): a run a pause kept waiting comes round to a
        schedule the resume still has to move on. Without it the key would expire during
        a pause longer than its schedule, and calls made after the resume would take
        slots beside the paused runs' moved ones: over the rate. Never an error: the
        run goes round anyway, and an outage meets its next decision's own script."""
        try:
            self._keep(keys=[self.key(name)], args=[max(1, math.ceil(seconds * 1000))])
        except REDIS_ERRORS as error:
            logger.debug("the schedule of %r not kept: %s", name, error)


def _start(
    how: How, at: float, slot: float, gate: float, *, now: float, grace: float, near: float
) -> tuple[float, float | None]:
    """A run's start (the script's steps): (the schedule's slot, the slot it starts on or
    None). ``due``: on its slot ``at`` within its grace, else the ``gate``'s opening if
    ``near``; ``start``: the later of the schedule's ``slot`` and the gate's, if near."""
    if how == "due":
        if (grace < 0 or now - at <= grace) and gate <= at:
            return slot, at
        opening = max(gate, now)
        return (slot, opening) if opening <= now + near else (max(slot, gate), None)
    slot = max(slot, gate)
    return slot, (max(slot, now) if slot <= now + near else None)


def budget(rate: Rate, ahead: float) -> tuple[int, float]:
    """(calls that may start now, seconds until the next may) of ``rate`` when its
    schedule (the next call's theoretical arrival time) is ``ahead`` seconds from now."""
    tolerance = (rate.burst - 1) * rate.interval
    return _remaining(0.0, tolerance, ahead, rate.interval), max(0.0, ahead - tolerance)


def _micros(seconds: float) -> int:
    return -1 if seconds < 0 else round(seconds * 1e6)


def _remaining(now: float, tolerance: float, tat: float, interval: float) -> int:
    if now + tolerance < tat:
        return 0
    return math.floor((now + tolerance - tat) / interval + 1e-9) + 1


def rates_of(store: object) -> Rates:
    """The rates of ``store`` (one Redis server: a Redlock refused), made once per store."""
    return one_server(store, "rate limits", "one counter", "for rate-limited tasks").helper(Rates)


__all__ = [
    "ANY_LATENESS",
    "Charge",
    "Charges",
    "Pause",
    "Rate",
    "Rates",
    "Slot",
    "budget",
    "charges",
    "check_cost",
    "human_period",
    "parse_rate",
    "rates_of",
]
