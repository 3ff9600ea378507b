"""``limit=N``: up to N executions of a key at once, each in a slot of its own.

- publish: no hold; every call is sent.
- receipt: nothing to reserve.
- start: the lowest free slot (``lease.limits.slots``: one script, fences increasing across
  slots); a retry's message first takes back the slot its attempt ran in.
  ``on_contention=wait`` is woken by the release of any slot, first come first served.
- end: the slot is released; a dead child's slot by its worker (any of the N).

An operator's override (``celery singleton limits set NAME --limit M``) replaces N for
the next runs: a lowered limit lets runs above it finish, and starts none until fewer
than M run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..lease import Contended, Lease, LockStore, TakeOver, companion, slot
from .base import Holder, Mode, Start

if TYPE_CHECKING:
    from ..lease.limits.overrides import Override


class Limit(Mode):
    name = "limit"
    checks_dispatch = False

    def __init__(self, limit: int) -> None:
        self.limit = limit

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
        return start.store.slots.try_acquire(
            start.name, widest, start.ttl, token=start.token, entry=start.entry, cap=cap
        )

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
        return waiting.slots.acquire(
            start.name,
            widest,
            start.ttl,
            timeout=timeout,
            token=start.token,
            entry=start.entry,
            cap=cap,
        )

    def running_names(self, name: str, override: Override | None = None) -> list[str]:
        widest = max(self.limit, self.limit_of(override))
        return [slot(name, number) for number in range(1, widest + 1)]

    def new_call(self, held: Mapping[str | None, Holder], answer: str) -> str:
        taken = sum(1 for role in held if (role or "").startswith("slot"))
        if taken >= self.limit:
            return f"accepted; runs when one of its {self.limit} slots frees ({taken} held)"
        return f"accepted; runs at once ({taken} of {self.limit} slots held)"
