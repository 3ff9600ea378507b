"""``rate="100/m"``: at most so many runs of a key start per period, across every worker.

- publish: no hold, every call is sent. ``on_limited="delay"`` reserves the call's slot
  first and sends it with the countdown to it; ``on_limited="raise"`` takes a slot now or
  raises ``RateLimitedError`` before anything is sent. Either way the slot rides in the
  message (``RATE_SLOT_HEADER``) and is not counted again.
- start: a slot before the running lease (``lease.limits.rates``, GCRA: one script). Free now:
  the run goes on. Not yet: the next free slot is reserved for it and the message sent
  again, same task id, to arrive on it; deferred calls so run in the order they were
  deferred, each on a slot of its own. A message carrying a slot only asks the server's
  clock whether it is due, and is sent on again for what is left if it is early (late by
  more than an interval, it is given the next free slot instead). Then
  the inner mode's running lease: one run at a time per key, or ``limit=N``.
- end: as the inner mode. The slot is spent however the run ends; a retry is a new
  start and asks for a slot of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

from ..exceptions import ConfigurationError, RateLimitedError
from ..lease import Contended, Lease, LockStore, Rate, Slot, parse_rate, rates_of
from .base import Call, Holder, Mode, Start

# How long a process keeps what a per-tenant rate callable said for one key: a plan
# change reaches every worker within this, and a hot key costs no call per run.
PLAN_CACHE_SECONDS = 10.0
_PLAN_CACHE_SIZE = 10_000
# A message that reaches its slot later than one interval of its rate, or than this if
# more (its worker died holding it and it was redelivered; the workers were saturated),
# gives the slot up and is given the next free one: late runs must not bunch up. So in
# any window, runs start at most ceil(grace / interval) more often than their slots
# (one more, for rates up to 20 a second).
MIN_GRACE = 0.05
ON_LIMITED = ("defer", "delay", "raise")


@dataclass(frozen=True)
class RateSpec:
    """A task's ``rate=``: one ``Rate`` for every key, or a callable of the call's
    arguments (``plan``) returning a rate in any of ``parse_rate``'s forms, or None for
    no limit on that call's key; ``burst`` applies to a plan's answers too."""

    fixed: Rate | None
    plan: Callable[..., object] | None
    burst: int
    on_limited: str
    _said: dict[str, tuple[Rate | None, float]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def build(cls, task: str, rate: object, burst: object, on_limited: object) -> RateSpec:
        if on_limited not in ON_LIMITED:
            raise ConfigurationError(
                f"{task}: on_limited={on_limited!r}: choose 'defer' (the default: deferred "
                "at execution), 'delay' (sent with the countdown to its slot) or 'raise'"
            )
        if callable(rate):
            parse_rate(1, burst, what=f"{task}: rate")  # the burst, checked now
            return cls(None, rate, int(burst), str(on_limited))  # type: ignore[call-overload]
        fixed = parse_rate(rate, burst, what=f"{task}: rate")
        return cls(fixed, None, fixed.burst, str(on_limited))

    def for_call(
        self, name: str, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> Rate | None:
        """The rate of the call's key ``name`` (a plan's answer, kept a short while)."""
        if self.plan is None:
            return self.fixed
        now = time.monotonic()
        said = self._said.get(name)
        if said is not None and said[1] > now:
            return said[0]
        answer = self.plan(*args, **kwargs)
        rate = None if answer is None else parse_rate(answer, self.burst, what=f"rate for {name}")
        if len(self._said) >= _PLAN_CACHE_SIZE:
            self._said.clear()  # bounded: the hot keys are asked again within a call each
        self._said[name] = (rate, now + PLAN_CACHE_SECONDS)
        return rate


class Rated(Mode):
    """A rate in front of the mode that runs the call (``WhileExecuting`` or ``Limit``)."""

    name = "rate"
    checks_dispatch = False

    def __init__(self, inner: Mode, spec: RateSpec) -> None:
        self.inner = inner
        self.spec = spec

    def __repr__(self) -> str:
        return f"<mode rate over {self.inner.name}>"

    # -- publish ----------------------------------------------------------------------

    def slot_at_publish(
        self,
        store: LockStore,
        name: str,
        call: Call,
        options: MutableMapping[str, object],
    ) -> Slot | None:
        """``on_limited="delay"``: reserve the call's slot and set the countdown to it;
        ``"raise"``: a slot now, or ``RateLimitedError``. A call with its own countdown
        or eta is left to its execution: a slot reserved now could fall before it."""
        how = self.spec.on_limited
        if how == "defer" or options.get("countdown") or options.get("eta"):
            return None
        rate = self.spec.for_call(name, *call)
        if rate is None:
            return None
        slot = rates_of(store).ask(name, rate, "reserve" if how == "delay" else "take")
        if slot.state == "refused":
            raise RateLimitedError(
                f"{name!r} is over its rate of {rate.limit} per {rate.period:g}s; the next "
                f"slot is free in {slot.wait:.3f}s",
                name=name,
                retry_after=slot.wait,
            )
        if slot.wait > 0:
            options["countdown"] = slot.wait
        return slot

    # -- start ------------------------------------------------------------------------

    def admit(self, start: Start, call: Call, slot: float | None) -> Slot | None:
        rate = self.spec.for_call(start.name, *call)
        if rate is None:
            return None
        rates = rates_of(start.store)
        if slot is not None:
            due = rates.ask(start.name, rate, "due", at=slot, entry=start.entry)
            if due.late <= max(rate.interval, MIN_GRACE):
                return due
        return rates.ask(start.name, rate, "reserve", entry=start.entry)

    def take(self, start: Start) -> Lease | Contended:
        return self.inner.take(start)

    def take_waiting(self, start: Start, waiting: LockStore, timeout: float | None) -> Lease:
        return self.inner.take_waiting(start, waiting, timeout)

    # -- end ----------------------------------------------------------------------------

    @property
    def retry_keeps_key(self) -> bool:
        # A retry asks for a slot of its own; held meanwhile, the key would keep every
        # other call of it out for as long as the retry is deferred.
        return False

    def running_names(self, name: str) -> list[str]:
        return self.inner.running_names(name)

    def held_by_a_run(self, name: str) -> list[str]:
        return self.inner.held_by_a_run(name)

    def new_call(self, held: Mapping[str | None, Holder], answer: str) -> str:
        return self.inner.new_call(held, answer) + "; on a slot of its rate"
