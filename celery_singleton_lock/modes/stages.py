"""What a mode's stages are handed and hand back: a call's arguments, the hold a dispatch
takes, a replacing call, a waiting execution's hold, a run's ``Start``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..lease import Lease, LockStore, TakeOver

if TYPE_CHECKING:
    from ..lease.history import Record
    from ..lease.limits.overrides import Override
    from ..lease.limits.rates import Charge
    from ..lease.limits.turns import Handed, Waiter


# One call's arguments: positional and keyword, as the task receives them.
Call = tuple[Sequence[object], Mapping[str, object]]
# Where a pending call's hold lives beside its key (the ``HOLD_HEADER`` of its message).
PENDING = "pending"


@dataclass(frozen=True)
class PublishHold:
    """The hold a dispatch takes before its message leaves, and the headers it sends."""

    lock: str  # the lock name held: the key itself, or a companion beside it
    ttl: float
    token: str
    headers: dict[str, object]


@dataclass(frozen=True)
class Replacing:
    """A replacing call's message (``on_duplicate="replace"``): sent under the queued
    call's task id, with the hold passing to it from that call's holder."""

    holder: str  # the queued call's hold, as it is now
    record: str  # what the replaced message will ask by (its queued hold's token)
    task_id: str
    token: str  # the new hold's
    ttl: float
    options: dict[str, object]
    headers: dict[str, object]  # the library's own


@dataclass(frozen=True)
class WaitingHold:
    """The hold beside the key an execution keeps while it waits for the key, and passes
    to its requeued message (``run.holds.PendingHold``): a pending call's.

    ``offered``: later calls replace this call's arguments, so the execution claims the
    hold before it takes the key (no later call can replace it past that point) and runs
    with the arguments a later call left for it meanwhile.
    """

    role: str
    offered: bool = False


@dataclass(frozen=True)
class Start:
    """What one execution knows when it starts, for its mode to take the running lease.

    ``queued`` is the message's own hold (its token header) and ``shape`` that hold's
    reservation by the worker that received it; ``role`` says where the hold lives
    (None: on the key; ``"pending"`` beside it; ``"slotN"`` a retry's slot). ``entry``:
    the history entry the take (or a rate's ask) writes, if the task keeps a history.
    """

    name: str  # the lock's name
    token: str  # the running lease's token
    ttl: float
    queued: str | None
    shape: tuple[str, str] | None
    role: str | None
    store: LockStore
    entry: Record | None = None
    override: Override | None = None  # an operator's (``celery singleton limits set``)
    # Leases the run holds besides its own (a ``total_limit`` slot): renewed and released
    # with it.
    held: list[Lease] = field(default_factory=list)
    # A call that may wait for its turn in a waiting room (``Mode.takes_turns``): its kept
    # message; and the calls whose turn came meanwhile, for the execution to send.
    waiter: Waiter | None = None
    handed: list[Handed] = field(default_factory=list)
    # The start its rate counted for this run (``Mode.admit``): given back if it waits.
    charge: Charge | None = None

    def take_over(self, *, unless_replaced: str | None = None) -> TakeOver:
        """What of the key this message may take over: its own queued hold or reservation.
        A hold beside the key (a role) is not taken over: the lease is taken afresh."""
        if self.role:
            return TakeOver(unless_replaced=unless_replaced)
        return TakeOver(self.queued, self.shape, unless_replaced=unless_replaced)
