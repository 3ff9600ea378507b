"""Operators' overrides of a name's limits (a rate, a limit, a pause), kept in the lock store.

An operator changes a limit without a deploy (``celery singleton limits set``). Every
process reads the overrides at most every ``REFRESH`` seconds and hands them to the scripts
of its next decisions, as their arguments: a change reaches every decision within a second.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from ...exceptions import ConfigurationError
from ..errors import store_error
from ..names import MAX_SLOTS
from ..outcomes import text
from ..redis.common import REDIS_ERRORS
from ..redis.store import RedisLock, one_server
from .rates import Rate

logger = logging.getLogger(__name__)

# How old the overrides a process decides with may be, at most (seconds).
REFRESH = 0.5
# How often a run kept waiting by a pause looks again (seconds): a resume lets it go
# within this.
RECHECK = 1.0
# The largest and smallest weights a key may have (a share of a total's turns against
# weight 1). Below the smallest a key's pass grows by so much a turn that adding 1/weight
# to it soon changes it no more: the key would be served at every turn.
MAX_WEIGHT = 1000.0
MIN_WEIGHT = 0.001


@dataclass(frozen=True)
class Override:
    """What an operator set for ``target``: rates in place of the code's (in its order),
    a limit in place of ``limit=N``, a weight in place of ``weight=`` (a key's share of a
    ``total_limit``'s turns), and whether its runs wait out a pause (``paused``)."""

    target: str
    rates: tuple[Rate, ...] | None = None
    limit: int | None = None
    paused: bool = False
    changed_at: float = 0.0  # seconds since the epoch
    changed_by: str = ""
    # The last pause: when it began, and when it ended (None while it lasts).
    paused_at: float | None = None
    resumed_at: float | None = None
    weight: float | None = None

    def __post_init__(self) -> None:
        if self.weight is not None:
            check_weight(self.weight, f"limits for {self.target!r}: weight")
        if self.limit is not None and not 1 <= self.limit <= MAX_SLOTS:
            raise ConfigurationError(
                f"limits for {self.target!r}: limit={self.limit} must be from 1 to {MAX_SLOTS}"
            )
        if self.rates is not None and not self.rates:
            raise ConfigurationError(
                f"limits for {self.target!r}: give at least one rate, or reset the override"
            )

    @property
    def empty(self) -> bool:
        """Changes nothing, and no run waits on its last resume: removed when saved."""
        nothing = self.rates is None and self.limit is None and self.weight is None
        nothing = nothing and not self.paused
        return nothing and self.resumed_at is None

    @property
    def pause(self) -> tuple[float, float] | None:
        """The last pause, once ended: when it began, and when the runs it kept waiting go
        on again: one ``RECHECK`` after the resume, when each has looked again (so every
        one of them is on time, and they go in the order they came)."""
        if self.paused_at is None or self.resumed_at is None:
            return None
        return self.paused_at, self.resumed_at + RECHECK

    def moved(self, at: float, reserved_at: float) -> float:
        """Where a time ``at`` fixed at ``reserved_at`` (a rate slot, or when a run was
        first paused) is after the last pause: time stood still for the key, so one
        fixed before the pause's end and falling after its start is as much later as
        the pause lasted."""
        began, ended = self.paused_at, self.resumed_at
        if began is None or ended is None or reserved_at >= ended or at <= began:
            return at
        # In whole microseconds, as the rate's script moves the schedule (``rates.ask``):
        # a slot and the schedule after it stay exactly one interval apart.
        length = round((ended + RECHECK) * 1e6) - round(began * 1e6)
        return (round(at * 1e6) + length) / 1e6

    def describe(self) -> str:
        """What it changes, as ``limits list`` shows it: ``rate 10/m, 500/d; paused``."""
        said = []
        if self.rates is not None:
            said.append("rate " + ", ".join(str(rate) for rate in self.rates))
        if self.limit is not None:
            said.append(f"limit {self.limit}")
        if self.weight is not None:
            said.append(f"weight {self.weight:g}")
        if self.paused:
            said.append("paused")
        elif self.resumed_at is not None:
            said.append("resumed")
        return "; ".join(said) or "nothing"

    def dumps(self) -> str:
        rates = None if self.rates is None else [[r.limit, r.period, r.burst] for r in self.rates]
        return json.dumps(
            {
                "rates": rates,
                "limit": self.limit,
                "paused": self.paused,
                "at": self.changed_at,
                "by": self.changed_by,
                "paused_at": self.paused_at,
                "resumed_at": self.resumed_at,
                **({} if self.weight is None else {"weight": self.weight}),
            },
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, target: str, raw: str) -> Override:
        said = json.loads(raw)
        rates = said.get("rates")
        return cls(
            target,
            None if rates is None else tuple(Rate(int(n), float(p), int(b)) for n, p, b in rates),
            said.get("limit"),
            bool(said.get("paused")),
            float(said.get("at") or 0.0),
            str(said.get("by") or ""),
            said.get("paused_at"),
            said.get("resumed_at"),
            None if said.get("weight") is None else float(said["weight"]),
        )


class Overrides:
    """On a ``RedisLock`` (standalone, Sentinel or Cluster).

    An override is one field of one hash, ``<prefix>:limits``, keyed by its target (a lock
    name, a key template or a task name), its value a small JSON object. A process reads
    the whole hash (one HGETALL, only for tasks with a rate or a limit) and passes what it
    found to its decisions' scripts as arguments, so on a Cluster the hash may live in a
    slot of its own (a decision's script sees only its key's slot). Overrides are few
    (what an operator set), so the hash stays small.
    """

    def __init__(self, store: RedisLock) -> None:
        self._store = store
        self.key = f"{store.prefix}:limits"
        # The overrides as last read, and when: read again once older than ``REFRESH``.
        self._guard = threading.Lock()
        self._found: dict[str, Override] = {}
        self._read_at = float("-inf")

    def current(self) -> Mapping[str, Override]:
        now = time.monotonic()
        if now - self._read_at < REFRESH:
            return self._found
        with self._guard:
            if now - self._read_at >= REFRESH:
                try:
                    self._found = self.read()
                except REDIS_ERRORS as error:
                    # The decision's own script meets the outage and its policy; until
                    # then the last overrides read stand.
                    logger.debug("overrides not read: %s", error)
                self._read_at = now
        return self._found

    def find(self, name: str, families: Iterable[str], *, fresh: bool = False) -> Override | None:
        """The override of the lock ``name``: each value its own, else its key template's,
        else its task's (``families``), paused if any of them is; ``fresh``: read now,
        not as last read."""
        if fresh:
            self.forget()
        found = self.current()
        if not found:
            return None
        chain = [found[target] for target in (name, *families) if target in found]
        if len(chain) < 2:
            return chain[0] if chain else None
        return merged(chain)

    def forget(self) -> None:
        """Read again at the next decision (after this process changed one)."""
        self._read_at = float("-inf")

    def read(self) -> dict[str, Override]:
        raw = self._store.client.hgetall(self.key) or {}
        found = {}
        for target, value in raw.items():
            name = text(target)
            try:
                found[name] = Override.loads(name, text(value))
            except (ValueError, TypeError, KeyError) as error:
                logger.warning("override of %r unreadable (%s): ignored", name, error)
        return found

    def all(self) -> dict[str, Override]:
        """Every override, read now (the CLI, the locks page)."""
        try:
            return self.read()
        except REDIS_ERRORS as error:
            raise store_error(error, where=self._store.where) from error

    def save(self, override: Override) -> None:
        """Store ``override`` (one that changes nothing is removed)."""
        client = self._store.client
        try:
            if override.empty:
                client.hdel(self.key, override.target)
            else:
                client.hset(self.key, override.target, override.dumps())
        except REDIS_ERRORS as error:
            raise store_error(error, where=self._store.where) from error
        self.forget()


def check_weight(value: object, what: str) -> float:
    """A weight: a number from ``MIN_WEIGHT`` to ``MAX_WEIGHT`` (a key's share of a
    total's turns against weight 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{what} must be a number, got {value!r}")
    if not MIN_WEIGHT <= value <= MAX_WEIGHT:
        raise ConfigurationError(
            f"{what} must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g} (a key's share "
            f"of the turns against weight 1: 0.5 is one turn to another key's two), "
            f"got {value!r}"
        )
    return float(value)


def merged(chain: list[Override]) -> Override:
    """Overrides of one lock, the most specific first, as one: a rate or a limit from the
    first that sets it; paused or not as the latest pause or resume among them said (a
    pause of the whole task after a key's resume pauses the key too)."""
    said = [each for each in chain if each.paused or each.resumed_at is not None]
    last = max(said, key=_said_at, default=None)
    return replace(
        chain[0],
        target=(last or chain[0]).target,
        rates=next((each.rates for each in chain if each.rates is not None), None),
        limit=next((each.limit for each in chain if each.limit is not None), None),
        weight=next((each.weight for each in chain if each.weight is not None), None),
        paused=last is not None and last.paused,
        paused_at=None if last is None else last.paused_at,
        resumed_at=None if last is None else last.resumed_at,
    )


def _said_at(override: Override) -> float:
    """When an override last said pause or resume."""
    if override.paused:
        return override.paused_at or 0.0
    return override.resumed_at or 0.0


def changed(
    old: Override | None,
    target: str,
    *,
    rates: tuple[Rate, ...] | None = None,
    limit: int | None = None,
    paused: bool | None = None,
    weight: float | None = None,
    by: str = "",
) -> Override:
    """``old`` with what is given changed (the rest kept), stamped now; a pause and a
    resume are timed (``Override.due``)."""
    base = old if old is not None else Override(target)
    now = time.time()
    paused_at, resumed_at = base.paused_at, base.resumed_at
    if paused and not base.paused:
        paused_at, resumed_at = now, None
    elif paused is False:
        # A resume (of this target's pause, or said of a key whose task or template is
        # paused: the latest said wins, ``merged``).
        resumed_at = now if base.paused or base.resumed_at is None else base.resumed_at
    return replace(
        base,
        rates=base.rates if rates is None else rates,
        limit=base.limit if limit is None else limit,
        weight=base.weight if weight is None else weight,
        paused=base.paused if paused is None else paused,
        changed_at=now,
        changed_by=by,
        paused_at=paused_at,
        resumed_at=resumed_at,
    )


def overrides_of(store: object) -> Overrides:
    """The overrides of ``store`` (one Redis server: a Redlock refused), made once."""
    return one_server(store, "run-time limits", "one hash", "to change limits at run time").helper(
        Overrides
    )


__all__ = [
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "RECHECK",
    "REFRESH",
    "Override",
    "Overrides",
    "changed",
    "check_weight",
    "merged",
    "overrides_of",
]
