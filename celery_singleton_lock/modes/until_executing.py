"""``lock="until_executing"``: one call queued and one running per key.

The stages (publish, receipt, start, end) are in ``UntilExecuting``'s docstring.
"""

from __future__ import annotations

from .base import Mode
from .choosing import Choice
from .stages import PENDING


class UntilExecuting(Mode):
    """One call queued (held beside the key) and one running (holding the key) per key.

    - publish: a queued hold *beside* the key (``companion(key, "pending")``), so a call
      made while another runs is accepted once and queues behind it.
    - receipt: the worker reserves that pending hold (as every holding mode does).
    - start: the running lease is taken on the key afresh; once the run has it, the
      pending hold is let go (the next call may queue, and will see this run's data).
      While the key is busy the execution stays the pending call: it keeps the hold while
      it waits and passes it to its requeued message (``run.holds.PendingHold``).
    - end: the running lease on the key is released.
    """

    name = "until_executing"
    hold_role = PENDING

    def refused_because(self) -> str:
        return "is already queued"

    @classmethod
    def shows(cls, role: str | None, state: str) -> str | None:
        if role == PENDING and state == "running":
            return "reserved"  # an execution waiting for the key keeps its call's place
        return None


CHOICE = Choice(
    UntilExecuting.name,
    {"lock": "until_executing"},
    lambda chosen: UntilExecuting(chosen.as_duplicate),
)
