"""``on_duplicate="replace"``: a later call's arguments swapped into the queued call.

The queued call keeps its task id, so every caller holds the ``AsyncResult`` of the run
that will cover its call (how: ``publish.replacement``). ``Replaces`` is what a refused
call gets, composed with either scope that queues a call; its docstring says each stage.
"""

from __future__ import annotations

from collections.abc import Callable

from ..lease import Contended
from ..tokens import is_reservation_of, read_token
from .choosing import Choice
from .refusal import Answer, HolderRow, Refusal
from .until_executed import UntilExecuted
from .until_executing import UntilExecuting


class Replaces(Refusal):
    """A refused call's arguments swapped into the queued call (``on_duplicate="replace"``;
    debounce and cancel compose it too), whatever scope holds it (on the key, or pending
    beside it with ``lock="until_executing"``).

    - publish: a call refused by a queued or reserved holder replaces it (``publish.replacement``);
      one refused by a running holder gets that run's result.
    - receipt: the worker reserves the hold, as every holding mode does.
    - start: a replaced message finds its hold swapped and is dropped quietly; a pending
      call's waiting run takes the arguments later calls leave for it.
    - end: as the scope.
    """

    name = "replace"
    looked_at_start = True  # a replaced message must be looked at when its run starts
    offered = True
    # A canvas member attached to a queued call whose arguments a later call replaces
    # would be answered for arguments it never asked for: members are sent as they are.
    attaches = False

    def answered_by(self, hold: str | None) -> str | None:
        # The answer to a duplicate is a swap: asked as the message is sent.
        return None

    def answer(self, duplicate: Answer, replacement: Callable[[], Answer]) -> Answer:
        return replacement()

    def unless_replaced(self, queued: str | None) -> str | None:
        return queued

    def replaced(self, held: Contended, queued: str | None, token: str, task_id: str) -> bool:
        """The store says so (``replaced``, recorded by the swap), or the hold is held by
        another message of this task id that is not running (not a copy of this one)."""
        if held.replaced:
            return True
        holder = read_token(held.holder)
        if holder.task_id != task_id or holder.state == "running":
            return False  # another call's, or this message's original running: a copy
        if held.holder in (queued, token):
            return False
        return not (queued and is_reservation_of(held.holder, task_id, queued))

    def new_call(self, hold: HolderRow | None) -> str | None:
        if hold is not None and hold.state in ("queued", "reserved"):
            return f"accepted: replaces the arguments of {hold.task_id} ({hold.state})"
        return None


REPLACES = Replaces()


# With either scope that queues a call: on the key, or pending beside it.
CHOICE = Choice(
    "replace",
    {"on_duplicate": "replace", "lock": ("until_executed", "until_executing")},
    lambda chosen: (UntilExecuting if chosen.lock == "until_executing" else UntilExecuted)(
        REPLACES
    ),
)
