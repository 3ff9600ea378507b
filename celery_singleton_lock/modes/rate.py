"""``rate="100/m"``: at most so many runs of a key start per period, across every worker.

Several limits (``rate=["60/m", "10000/d"]``) and a cost per call (``cost=``, or a
``RateLimit``'s own) are one ask: every limit must admit the run, in one script. The
stages (publish, receipt, start, end) are in ``Rated``'s docstring.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

from ..exceptions import ConfigurationError, RateLimitedError
from ..lease import Contended, Lease, LockStore, Rate, Slot, parse_rate, rates_of
from ..lease.limits.overrides import Override
from ..lease.limits.rate_forms import Cost, listed_rates, parse_burst, parse_cost, parse_on_limited
from ..lease.limits.rates import ANY_LATENESS, Charges, How, check_cost
from ..lease.limits.turns import Handed, Kept
from .base import Mode
from .refusal import HolderRow
from .stages import Call, Start

# How long a process keeps what a per-tenant rate callable said for one key: a plan
# change reaches every worker within this, and a hot key costs no call per run.
PLAN_CACHE_SECONDS = 10.0
_PLAN_CACHE_SIZE = 10_000
# A message that reaches its slot later than one interval of its rate, or than this if
# more (its worker died holding it and it was redelivered; the workers were saturated),
# does not start on it: late runs must not bunch up with the runs after them. It starts
# when the runs that started leave room (the rate's gate) if that is near, else on the
# next free slot.
# So in any window, runs start at most ceil(grace / interval) more often than the rate
# (one more, for rates up to 20 a second).
MIN_GRACE = 0.05
# A run whose slot comes within this waits for it in its worker (its pool child or
# thread held that long) rather than being sent round the broker to it, which costs
# about as much and may arrive late.
NEAR = 0.05
# How late a paused key's waiting message may come round (a queue that far behind)
# and still find its rate's schedule to move on: its key is one short string, and the
# first decision after the resume sets its expiry back to the schedule's.
HELD_COMES_ROUND = 3600.0
# A call sent on its turn waits in its worker for the rate's next start, one interval
# away at most, up to this long (its turn reserved meanwhile); a slower rate defers it.
TURN_NEAR = 2.0
# An eager call waits for its slot wherever it is (the caller waits): up to a day.
EAGER_NEAR = 86400.0
# The role a key's rate is listed under (``lease.redis.inventory``): ``{N}:rate``.
RATE_ROLE = "rate"
# What a call refused because its key is paused is told to wait (``retry_after``): the
# pause has no end known in advance.
PAUSED_RETRY = 1.0


class RateLimit:
    """One of a task's rate limits, with a burst or a cost of its own.

    ``rate=["500/m", RateLimit("200000/m", burst=20_000, cost=count_tokens)]``: 500 calls
    a minute, and 200,000 tokens a minute where each call costs what ``count_tokens``
    says of its arguments. A limit given as a bare rate takes the task's ``burst=`` and
    ``cost=`` (one unit a call when none is given).
    """

    __slots__ = ("burst", "cost", "rate")

    def __init__(self, rate: object, *, burst: int = 1, cost: Cost | None = None) -> None:
        self.rate = parse_rate(rate, burst, what="RateLimit")
        self.burst = self.rate.burst
        self.cost = parse_cost(cost, f"RateLimit({rate!r})", self.rate)

    def __repr__(self) -> str:
        cost = "" if self.cost is None else f", cost={self.cost!r}"
        return f"RateLimit({str(self.rate)!r}{cost})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RateLimit):
            return NotImplemented
        return (self.rate, self.cost) == (other.rate, other.cost)

    def __hash__(self) -> int:
        return hash(self.rate)


def rate_limits(value: object, burst: object, what: str) -> tuple[RateLimit, ...]:
    """A ``rate=`` (or a plan's answer): one rate in any of ``parse_rate``'s forms, a
    ``RateLimit``, or a list of them; a bare rate takes ``burst``."""
    items = listed_rates(value)
    if not items:
        raise ConfigurationError(f"{what}=[]: give at least one rate, e.g. '100/m'")
    return tuple(
        item if isinstance(item, RateLimit) else _bare(item, burst, what) for item in items
    )


def _bare(item: object, burst: object, what: str) -> RateLimit:
    rate = parse_rate(item, burst, what=what)
    return RateLimit(rate, burst=rate.burst)


@dataclass(frozen=True)
class RateSpec:
    """A task's ``rate=``: its limits for every key, or a callable of the call's
    arguments (``plan``) returning them in any of ``rate_limits``' forms, or None for no
    limit on that call's key; ``burst`` and ``cost`` apply to the limits that do not
    say their own, a plan's answers too."""

    limits: tuple[RateLimit, ...] | None
    plan: Callable[..., object] | None
    burst: int
    on_limited: str
    cost: Cost | None = None
    _said: dict[str, tuple[tuple[RateLimit, ...] | None, float]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def build(
        cls, task: str, rate: object, burst: object, on_limited: object, cost: object = None
    ) -> RateSpec:
        how = parse_on_limited(on_limited, task)
        if callable(rate):
            each = parse_burst(burst, f"{task}: rate")  # checked now; a plan's rates take it
            return cls(None, rate, each, how, parse_cost(cost, task, Rate(1, 1.0, each)))
        limits = rate_limits(rate, burst, f"{task}: rate")
        bare = [limit.rate for limit in limits if limit.cost is None]
        return cls(limits, None, limits[0].burst, how, parse_cost(cost, task, *bare))

    @property
    def costs(self) -> bool:
        """Whether a call may cost other than one unit (checked at dispatch then; a
        plan's own costs are known only when it is asked, at execution)."""
        return self.cost is not None or any(limit.cost is not None for limit in self.limits or ())

    def limits_of(
        self, name: str, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> tuple[RateLimit, ...] | None:
        """The limits of the call's key ``name`` (a plan's answer, kept a short while)."""
        if self.plan is None:
            return self.limits
        now = time.monotonic()
        said = self._said.get(name)
        if said is not None and said[1] > now:
            return said[0]
        answer = self.plan(*args, **kwargs)
        limits = None if answer is None else rate_limits(answer, self.burst, f"rate for {name}")
        if len(self._said) >= _PLAN_CACHE_SIZE:
            self._said.clear()  # bounded: the hot keys are asked again within a call each
        self._said[name] = (limits, now + PLAN_CACHE_SECONDS)
        return limits

    def for_call(
        self,
        name: str,
        args: Sequence[object],
        kwargs: Mapping[str, object],
        override: Override | None = None,
    ) -> Charges | None:
        """What the call of key ``name`` is charged: (rate, units) per limit; None when
        its key has no limit. An operator's rates (``override``) stand in for the code's
        in order, each with the cost of the code's limit in its place. A cost no limit
        could take raises ``CostOverBurstError``."""
        limits = self.limits_of(name, args, kwargs)
        if override is not None and override.rates is not None:
            costs = [limit.cost for limit in limits or ()]
            priced = [
                (rate, costs[i] if i < len(costs) else None)
                for i, rate in enumerate(override.rates)
            ]
        elif limits is None:
            return None
        else:
            priced = [(limit.rate, limit.cost) for limit in limits]
        said: dict[int, float] = {}  # a callable shared by several limits is asked once
        charged = [(rate, self._units(cost, args, kwargs, said)) for rate, cost in priced]
        check_cost(name, charged)
        return charged

    def _units(
        self,
        cost: Cost | None,
        args: Sequence[object],
        kwargs: Mapping[str, object],
        said: dict[int, float],
    ) -> float:
        cost = self.cost if cost is None else cost
        if cost is None:
            return 1.0
        if not callable(cost):
            return cost
        if id(cost) not in said:
            units = cost(*args, **kwargs)
            if isinstance(units, bool) or not isinstance(units, int | float):
                raise ConfigurationError(
                    f"cost {getattr(cost, '__name__', cost)!r} returned {units!r}: return "
                    "the units the call costs (a number, 0 or more)"
                )
            said[id(cost)] = float(units)
        return said[id(cost)]


class Rated(Mode):
    """A rate in front of the mode that runs the call (``WhileExecuting`` or ``Limit``).

    - publish: no hold, every call is sent. ``on_limited="delay"`` reserves the call's
      slot first and sends it with the countdown to it; ``on_limited="raise"`` takes a slot
      now or raises ``RateLimitedError`` before anything is sent. Either way the slot rides
      in the message (``RATE_SLOT_HEADER``) and is not counted again.
    - receipt: nothing to reserve.
    - start: a slot before the running lease (``lease.limits.rates``, GCRA: one script).
      Free now: the run goes on. Not yet: the next free slot is reserved for it and the
      message sent again, same task id, to arrive on it; deferred calls so run in the order
      they were deferred, each on a slot of its own. A message carrying a slot asks whether
      it is due on the server's clock: early, it is sent on again for what is left; within
      its grace, it starts on it; later (a saturated or dead worker), it starts now if the
      runs that started leave room, else it is given the next free slot. Then the inner
      mode's running lease: one run at a time per key, or ``limit=N``; a run kept waiting
      for its turn gives its start back, and starts as a late run does on its turn.
    - end: as the inner mode. The slot is spent however the run ends; a retry is a new
      start and asks for a slot of its own.
    """

    name = "rate"
    checks_dispatch = False

    def __init__(self, inner: Mode, spec: RateSpec) -> None:
        self.inner = inner
        self.spec = spec

    def __repr__(self) -> str:
        return f"<mode rate over {self.inner.name}>"

    # -- publish ----------------------------------------------------------------------

    @property
    def overridable(self) -> bool:
        return True

    @property
    def asks_at_publish(self) -> bool:
        return self.spec.on_limited != "defer"

    def slot_at_publish(
        self,
        store: LockStore,
        name: str,
        call: Call,
        options: MutableMapping[str, object],
        override: Override | None = None,
    ) -> Slot | None:
        """``on_limited="delay"``: reserve the call's slot and set the countdown to it;
        ``"raise"``: a slot now, or ``RateLimitedError``. A call with its own countdown
        or eta is left to its execution: a slot reserved now could fall before it, and so
        is a call of a paused key (``"raise"`` refuses it)."""
        rates = rates_of(store)  # one server's, or a Redlock refused before anything is sent
        how = self.spec.on_limited
        if override is not None and override.paused and how == "raise":
            raise RateLimitedError(
                f"{name!r} is paused by an operator ({override.target!r}, "
                f"{override.changed_by or 'someone'}); resume it with: celery singleton "
                f"limits set {override.target!r} --resume",
                name=name,
                retry_after=PAUSED_RETRY,
            )
        paused = override is not None and override.paused
        if how == "defer" or paused or options.get("countdown") or options.get("eta"):
            if self.spec.costs:  # a cost no slot could take: refused before it is sent
                self.spec.for_call(name, *call, override)
            return None
        limits = self.spec.for_call(name, *call, override)
        if limits is None:
            return None
        pause = override.pause if override is not None else None
        if how == "delay":
            slot = rates.ask(name, limits, "reserve", paused=pause)
        else:
            slot = rates.ask(name, limits, "take", paused=pause)
        if slot.state == "refused":
            rate, units = limits[slot.limiting]
            cost = "" if units == 1 else f" (this call costs {units:g})"
            raise RateLimitedError(
                f"{name!r} is over its rate of {rate}{cost}; the next slot is free in "
                f"{slot.wait:.3f}s",
                name=name,
                retry_after=slot.wait,
            )
        if slot.wait > 0:
            options["countdown"] = slot.wait
        return slot

    # -- start ------------------------------------------------------------------------

    def admit(
        self,
        start: Start,
        call: Call,
        slot: float | None,
        *,
        held: bool = False,
        eager: bool = False,
        turned: bool = False,
    ) -> Slot | None:
        limits = self.spec.for_call(start.name, *call, start.override)
        if limits is None:
            return None
        rates = rates_of(start.store)
        pause = start.override.pause if start.override is not None else None
        # A run that waited out a pause is as late as every other that waited with it
        # (they come round on one cadence): kept on its slot, they keep their order.
        grace = ANY_LATENESS if held else max(min(r.interval for r, _ in limits), MIN_GRACE)
        how: How = "start" if slot is None else "due"
        near = EAGER_NEAR if eager else NEAR  # (an eager call carries no slot)
        if turned and slot is None:
            # Sent on its turn, its start given back as it was kept: it starts as the runs
            # that started leave room (the gate: as a late run, never on the schedule's
            # slots the calls deferred behind it hold), waiting for that here where it is
            # at most one start's interval away, else deferred as any.
            how, slot, grace = "due", 0.0, 0.0
            wait = max(r.interval * units for r, units in limits)
            near = max(near, NEAR + wait) if wait <= TURN_NEAR else near
        # A kept history says a run was deferred once, when its slot was reserved: a
        # carried slot not due for a while yet is a hop of that wait (``run/resend.defer``),
        # while a late one may be deferred anew (recorded).
        early = slot is not None and slot > start.store.clock.time() + near
        entry = None if early else start.entry
        return rates.ask(
            start.name, limits, how, at=slot or 0.0, entry=entry, paused=pause,
            grace=grace, near=near,
        )  # fmt: skip

    def waits_out_pause(self, start: Start, seconds: float) -> None:
        # The resume moves the schedule on by the pause's length (rate.lua), at the first
        # decision after it: kept until then, however long the pause.
        rates_of(start.store).keep(start.name, seconds + HELD_COMES_ROUND)

    def sent_round(self, start: Start) -> None:
        self.inner.sent_round(start)

    def take(self, start: Start) -> Lease | Contended | Kept:
        return self.inner.take(start)

    def take_waiting(self, start: Start, waiting: LockStore, timeout: float | None) -> Lease:
        return self.inner.take_waiting(start, waiting, timeout)

    # -- what an operator sees ----------------------------------------------------------

    @classmethod
    def shows(cls, role: str | None, state: str) -> str | None:
        # The rate key holds the next run's arrival time: no call's.
        return "limited" if role == RATE_ROLE else None

    # -- end ----------------------------------------------------------------------------

    @property
    def retry_keeps_key(self) -> bool:
        # A retry asks for a slot of its own; held meanwhile, the key would keep every
        # other call of it out for as long as the retry is deferred.
        return False

    def running_names(self, name: str, override: Override | None = None) -> list[str]:
        return self.inner.running_names(name, override)

    def also_held(self, name: str) -> list[str]:
        return self.inner.also_held(name)

    @property
    def takes_turns(self) -> bool:
        return self.inner.takes_turns

    def weight(self, call: Call, override: Override | None) -> float:
        return self.inner.weight(call, override)

    def release_held(self, store: LockStore, lease: Lease, *, eager: bool) -> list[Handed]:
        return self.inner.release_held(store, lease, eager=eager)

    def hand_out(self, store: LockStore, rooms: Collection[str]) -> list[Handed]:
        return self.inner.hand_out(store, rooms)

    def forget_turn(self, store: LockStore, ident: str) -> list[Handed]:
        return self.inner.forget_turn(store, ident)

    def waiting(self, store: LockStore) -> dict[str, int]:
        return self.inner.waiting(store)

    def kept_calls(self, store: LockStore) -> dict[str, str]:
        return self.inner.kept_calls(store)

    @property
    def waiting_room(self) -> str | None:
        return self.inner.waiting_room

    def held_by_a_run(self, name: str) -> list[str]:
        return self.inner.held_by_a_run(name)

    def new_call(self, held: Mapping[str | None, HolderRow]) -> str:
        return self.inner.new_call(held) + "; on a slot of its rate"
