"""``limit=N``: up to N executions of a key at once, each in a slot of its own.

An operator's override (``celery singleton limits set``) replaces N for the next runs;
``total_limit=M`` caps every key of the task together (``Total``), ``limit=1`` too (one
slot per key). The stages (publish, receipt, start, end) are in ``Limit``'s docstring.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..lease import Contended, Lease, LockStore, TakeOver, companion, slot
from .base import Mode, Start
from .choosing import GIVEN, Choice, Chosen
from .refusal import HolderRow

if TYPE_CHECKING:
    from ..lease.limits.overrides import Override


@dataclass(frozen=True)
class Total:
    """The task-wide counting lease of ``total_limit``: ``name``'s ``limit`` slots.

    A run holds one of these too, taken after its key's slot (``limit`` for every key
    together): a run that would pass ``limit`` meets ``on_contention`` (``wait`` queues for
    the next free one, first come first served), having given its key's slot back. The
    task-wide slot is renewed and released with the run (``Start.held``), and a dead
    child's by its worker.
    """

    name: str
    limit: int


class Limit(Mode):
    """Up to N runs of a key at once, each in a slot of its own (and one of ``total``'s, if set).

    - publish: no hold; every call is sent.
    - receipt: nothing to reserve.
    - start: the lowest free slot (``lease.limits.slots``: one script, fences increasing
      across slots); a retry's message first takes back the slot its attempt ran in.
      ``on_contention=wait`` is woken by the release of any slot, first come first served.
    - end: the slot is released; a dead child's slot by its worker (any of the N).

    An operator's override (``celery singleton limits set NAME --limit M``) replaces N for
    the next runs: a lowered limit lets runs above it finish, and starts none until fewer
    than M run.
    """

    name = "limit"
    checks_dispatch = False

    def __init__(self, limit: int, total: Total | None = None) -> None:
        self.limit = limit
        self.total = total

    @property
    def overridable(self) -> bool:
        return True

    def take(self, start: Start) -> Lease | Contended:
        if start.role and start.role.startswith("slot"):
            # A retry's message holds the slot its first attempt ran in: take it back.
            own = start.store.try_acquire(
                companion(start.name, start.role),
                start.ttl,
                token=start.token,
                # Its own hold on that slot (a role: take_over() would take nothing over).
                take=TakeOver(replace=start.queued, shape=start.shape),
                entry=start.entry,
            )
            if isinstance(own, Lease):
                return own
        widest, cap = self.slots_of(start.override)
        outcome = start.store.slots.try_acquire(
            start.name, widest, start.ttl, token=start.token, entry=start.entry, cap=cap
        )
        return self._within_total(start, outcome)

    def _within_total(self, start: Start, outcome: Lease | Contended) -> Lease | Contended:
        """The key's slot, and then one of the task's (``total_limit``): without one, the
        key's slot is given back and the run is contended on the total."""
        total = self.total
        if total is None or not isinstance(outcome, Lease):
            return outcome
        gate = start.store.slots.try_acquire(total.name, total.limit, start.ttl, token=start.token)
        if isinstance(gate, Lease):
            start.held.append(gate)
            return outcome
        start.store.release(outcome)
        return gate

    def limit_of(self, override: Override | None) -> int:
        """The limit in force: an operator's, else the code's."""
        return override.limit if override is not None and override.limit else self.limit

    def slots_of(self, override: Override | None) -> tuple[int, int | None]:
        """The slots to look at and how many may be held: a raised limit's slots, or
        the code's with a lowered limit as the cap (runs above it still count)."""
        limit = self.limit_of(override)
        return max(limit, self.limit), (limit if limit < self.limit else None)

    def take_waiting(self, start: Start, waiting: LockStore, timeout: float | None) -> Lease:
        widest, cap = self.slots_of(start.override)
        began = time.monotonic()
        lease = waiting.slots.acquire(
            start.name,
            widest,
            start.ttl,
            timeout=timeout,
            token=start.token,
            entry=start.entry,
            cap=cap,
        )
        total = self.total
        if total is None:
            return lease
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - began))
        try:  # in turn with every run of the task waiting for the total (first come, first served)
            gate = waiting.slots.acquire(
                total.name, total.limit, start.ttl, timeout=left, token=start.token
            )
        except BaseException:
            start.store.release(lease)
            raise
        start.held.append(gate)
        return lease

    def also_held(self, name: str) -> list[str]:
        total = self.total
        return [] if total is None else [slot(total.name, n) for n in range(1, total.limit + 1)]

    def running_names(self, name: str, override: Override | None = None) -> list[str]:
        widest = max(self.limit, self.limit_of(override))
        return [slot(name, number) for number in range(1, widest + 1)]

    def new_call(self, held: Mapping[str | None, HolderRow]) -> str:
        taken = sum(1 for role in held if (role or "").startswith("slot"))
        if taken >= self.limit:
            return f"accepted; runs when one of its {self.limit} slots frees ({taken} held)"
        return f"accepted; runs at once ({taken} of {self.limit} slots held)"


def _built(chosen: Chosen) -> Limit:
    total = chosen.value("total_limit")
    if total is None:
        return Limit(chosen.count("limit"))
    return Limit(chosen.count("limit"), Total(f"{chosen.task}#total", chosen.count("total_limit")))


# Picked by a limit run in slots (``limit=1`` alone holds the key: ``while_executing``);
# a limit, like a rate, sets the scope ``while_executing`` (``config.limit_options``).
CHOICE = Choice(Limit.name, {"limit": GIVEN, "lock": "while_executing"}, _built)
