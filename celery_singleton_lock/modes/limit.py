"""``limit=N``: up to N executions of a key at once, each in a slot of its own.

An operator's override (``celery singleton limits set``) replaces N for the next runs;
``total_limit=M`` caps every key of the task together (``Total``), ``limit=1`` too (one
slot per key). The stages (publish, receipt, start, end) are in ``Limit``'s docstring.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..exceptions import ConfigurationError
from ..lease import Contended, Lease, LockStore, TakeOver, append_history, companion, slot
from ..lease.limits.overrides import check_weight
from ..lease.limits.turns import Handed, Kept, turns_of
from .base import Mode
from .choosing import GIVEN, Choice, Chosen
from .refusal import HolderRow
from .stages import Call, Start

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
    # How freed slots go to waiting runs: in turn across keys (a waiting room), or to
    # the run that has waited longest (``TOTAL_ORDERS``).
    order: str = "round_robin"
    # A key's share of the turns: a number, or a callable of the task's arguments.
    weight: float | Callable[..., object] = 1.0

    @property
    def round_robin(self) -> bool:
        return self.order == "round_robin"

    def weight_of(self, call: Call) -> float:
        """The weight of ``call``'s key, as the task's ``weight=`` says."""
        weight = self.weight
        if callable(weight):
            args, kwargs = call
            return check_weight(weight(*args, **kwargs), f"{self.name}: weight")
        return check_weight(weight, f"{self.name}: weight")


# total_order=: round robin across keys (the default), or first come, first served.
TOTAL_ORDERS = ("round_robin", "first_come")
# How often a start whose turn is reserved asks again while its key's last run lets its
# slot go (a run's end releases the total's slot first), and for how long at most.
CLAIM_AGAIN = 0.02
CLAIM_FOR = 5.0


class Limit(Mode):
    """Up to N runs of a key at once, each in a slot of its own (and one of ``total``'s, if set).

    - publish: no hold; every call is sent.
    - receipt: nothing to reserve.
    - start: the lowest free slot (``lease.limits.slots``: one script, fences increasing
      across slots); a retry's message first takes back the slot its attempt ran in.
      ``on_contention=wait`` is woken by the release of any slot, first come first served.
      With a ``total_limit`` taken round robin, the key's slot and the total's are its
      turn (``lease.limits.turns``): taken now, or the call is kept in its key's line.
    - end: the slot is released; a dead child's slot by its worker (any of the N); a
      total's slot taken round robin is handed on to the next call in turn.

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

    def take(self, start: Start) -> Lease | Contended | Kept:
        own = None
        if start.role and start.role.startswith("slot"):
            # A retry's message holds the slot its first attempt ran in: take it back.
            taken = start.store.try_acquire(
                companion(start.name, start.role),
                start.ttl,
                token=start.token,
                # Its own hold on that slot (a role: take_over() would take nothing over).
                take=TakeOver(replace=start.queued, shape=start.shape),
                entry=start.entry,
            )
            own = taken if isinstance(taken, Lease) else None
        if start.waiter is not None and self.takes_turns:
            turned = self._take_turn(start)  # (its turn runs in the slot it took back)
            if turned is not None:
                if own is not None and not isinstance(turned, Lease):
                    start.store.release(own)  # it waits its turn as any call, the slot free
                return turned
        if own is not None:  # and one of the total's, as any run
            return self._within_total(start, own)
        widest, cap = self.slots_of(start.override)
        outcome = start.store.slots.try_acquire(
            start.name, widest, start.ttl, token=start.token, entry=start.entry, cap=cap
        )
        return self._within_total(start, outcome)

    @property
    def takes_turns(self) -> bool:
        return self.total is not None and self.total.round_robin

    def weight(self, call: Call, override: Override | None) -> float:
        if override is not None and override.weight is not None:
            return override.weight
        return 1.0 if self.total is None else self.total.weight_of(call)

    def _take_turn(self, start: Start) -> Lease | Kept | Contended | None:
        """The run's turn of the total, in its key's line with every key's (round robin):
        its key's slot and the total's now, or its message kept in the line; contended by
        a run of its own task id (its message again: a copy if that run lives). None: no
        waiting room on this store (first come, first served)."""
        total, waiter = self.total, start.waiter
        turns = turns_of(start.store)
        if total is None or waiter is None or turns is None:
            return None
        widest, cap = self.slots_of(start.override)
        deadline = time.monotonic() + CLAIM_FOR
        while True:
            turn = turns.take(
                total.name, total.limit, start.name, waiter,
                widest=widest, cap=cap, token=start.token, ttl=start.ttl,
                charge=start.charge,
            )  # fmt: skip
            start.handed.extend(turn.handed)
            if isinstance(turn.taken, Contended):
                return turn.taken
            if isinstance(turn.taken, tuple):
                own, every = turn.taken
                start.held.append(every)
                append_history(start.store, start.entry, "started")
                return own
            late = time.monotonic() > deadline
            stays = turn.taken is None and late  # (its turn reserved, its key's slot not free)
            if stays and turns.give_back(
                total.name, total.limit, waiter.ident, waiter.stamp, stays=True, kept=waiter.kept
            ):
                # Its key's slot is not freeing (a limit lowered meanwhile): its turn goes
                # on, and it waits first in its key's line for the next.
                start.handed.extend(turns.hand_out(total.name, total.limit))
            if turn.taken is not None or late:
                kept = turn.taken or Kept(start.name)
                if not kept.started:  # (a kept history says where the call waits)
                    append_history(start.store, start.entry, "waiting", detail="its turn")
                return kept
            time.sleep(CLAIM_AGAIN)  # its key's last run is letting its slot go

    def sent_round(self, start: Start) -> None:
        # A paused or deferred call takes no turn: one handed to it goes to the next key
        # (it comes back as a new call once let go).
        total, waiter = self.total, start.waiter
        turns = turns_of(start.store) if self.takes_turns else None
        if total is None or waiter is None or turns is None:
            return
        if turns.give_back(total.name, total.limit, waiter.ident, waiter.stamp, kept=waiter.kept):
            start.handed.extend(turns.hand_out(total.name, total.limit))

    def waiting(self, store: LockStore) -> dict[str, int]:
        total = self.total
        turns = turns_of(store) if self.takes_turns else None
        return {} if total is None or turns is None else turns.waiting(total.name)

    @property
    def waiting_room(self) -> str | None:
        return self.total.name if self.total is not None and self.takes_turns else None

    def kept_calls(self, store: LockStore) -> dict[str, str]:
        total = self.total
        turns = turns_of(store) if self.takes_turns else None
        return {} if total is None or turns is None else turns.kept(total.name)

    def forget_turn(self, store: LockStore, ident: str) -> list[Handed]:
        total = self.total
        turns = turns_of(store) if self.takes_turns else None
        if total is None or turns is None or not turns.give_back(total.name, total.limit, ident):
            return []
        return turns.hand_out(total.name, total.limit)

    def release_held(self, store: LockStore, lease: Lease, *, eager: bool) -> list[Handed]:
        total = self.total
        turns = turns_of(store) if self.takes_turns and not eager else None
        if total is None or turns is None or not lease.name.startswith(total.name):
            return super().release_held(store, lease, eager=eager)
        return turns.hand_out(total.name, total.limit, ending=lease)

    def hand_out(self, store: LockStore, rooms: Collection[str]) -> list[Handed]:
        total = self.total
        turns = turns_of(store) if self.takes_turns else None
        if total is None or turns is None or total.name not in rooms:
            return []
        return turns.hand_out(total.name, total.limit)

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
    order = chosen.value("total_order") or "round_robin"
    weight = chosen.value("weight")
    return Limit(
        chosen.count("limit"),
        Total(
            f"{chosen.task}#total",
            chosen.count("total_limit"),
            str(order),
            1.0 if weight is None else weight,  # type: ignore[arg-type]
        ),
    )


def _order(raw: Mapping[str, object], option: str, task: str) -> object:
    value = raw.get(option)
    if value is not None and value not in TOTAL_ORDERS:
        raise ConfigurationError(f"{task}: {option}={value!r} must be one of {list(TOTAL_ORDERS)}")
    return value


def _weight(raw: Mapping[str, object], option: str, task: str) -> object:
    value = raw.get(option)
    if value is None or callable(value):
        return value
    return check_weight(value, f"{task}: {option}")


# Picked by a limit run in slots (``limit=1`` alone holds the key: ``while_executing``);
# a limit, like a rate, sets the scope ``while_executing`` (``config.limit_options``).
CHOICE = Choice(
    Limit.name,
    {"limit": GIVEN, "lock": "while_executing"},
    _built,
    reads={"total_order": _order, "weight": _weight},
)
