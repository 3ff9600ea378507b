"""``on_duplicate="replace"``: a later call's arguments swapped into the queued call.

The queued call keeps its task id, so every caller holds the ``AsyncResult`` of the run
that will cover its call (how: ``publish.replacement``). The stages (publish, receipt, start, end)
are in ``Replace``'s docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..lease import Contended
from ..tokens import is_reservation_of, read_token
from .base import PENDING, Answer, HolderRow, Mode, Start, WaitingHold


class Replace(Mode):
    """A queued call's arguments replaced by a later call's (held on the key, or beside
    it when ``pending``).

    - publish: a queued hold as the lock scope says (on the key, or beside it with
      ``lock="until_executing"``). A call refused by a queued or reserved holder replaces
      it (``Replacement``); one refused by a running holder gets that run's result.
    - receipt: the worker reserves the hold, as every holding mode does.
    - start: a replaced message finds its hold swapped and is dropped quietly; otherwise
      as its scope (``until_executed`` / ``until_executing``).
    - end: as its scope.
    """

    name = "replace"

    def __init__(self, *, pending: bool) -> None:
        self.hold_role = PENDING if pending else None

    def refused_because(self) -> str:
        return "is already queued" if self.hold_role else "is already queued or running"

    # -- publish ----------------------------------------------------------------------

    def answered_by(self, name: str) -> str | None:
        # The answer to a duplicate is a swap: asked as the message is sent.
        return None

    def answer_refused(self, duplicate: Answer, replacement: Callable[[], Answer]) -> Answer:
        return replacement()

    # -- receipt and start ------------------------------------------------------------

    @property
    def starts_at_receipt(self) -> bool:
        # A replaced message must be looked at when its run starts.
        return False

    def unless_replaced(self, queued: str | None) -> str | None:
        return queued

    def waiting_hold(self, role: str | None) -> WaitingHold | None:
        waiting = super().waiting_hold(role)
        return None if waiting is None else WaitingHold(waiting.role, offered=True)

    def replaced(self, held: Contended, start: Start, task_id: str) -> bool:
        """The store says so (``replaced``, recorded by the swap), or the hold is held by
        another message of this task id that is not running (not a copy of this one)."""
        if held.replaced:
            return True
        holder = read_token(held.holder)
        if holder.task_id != task_id or holder.state == "running":
            return False  # another call's, or this message's original running: a copy
        if held.holder in (start.queued, start.token):
            return False
        return not (start.queued and is_reservation_of(held.holder, task_id, start.queued))

    def new_call(self, held: Mapping[str | None, HolderRow], answer: str) -> str:
        hold = held.get(self.hold_role)
        if hold is not None and hold.state in ("queued", "reserved"):
            return f"accepted: replaces the arguments of {hold.task_id} ({hold.state})"
        return super().new_call(held, answer)
