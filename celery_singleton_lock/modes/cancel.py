"""``on_duplicate="cancel"``: the newest call wins; a run in progress is cancelled for it.

- publish: as ``lock="until_executing"`` with ``replace``: a pending hold beside the
  key. A call made while a run is in progress becomes the pending call (and a later
  one replaces its arguments); the pending hold is what cancels the run.
- receipt: the worker reserves the hold, as every holding mode does.
- start: as ``until_executing``: the running lease on the key taken afresh (after the
  run it cancelled has let go: never overlapping), the pending hold let go. The lease
  then yields to the key's pending hold (``Lease.yield_to``): its renewal looks every
  ``CANCEL_CHECK`` seconds, in the renewal's own script, and once a newer call is
  pending the run is cancelled: ``self.lease.cancelled``, ``self.lease.check()`` raises
  ``TaskCancelledError``, ``on_cancel`` is called, and with ``terminate_on_cancel`` a
  prefork child is terminated (``cancels.py``).
- end: the running lease is released however the run ends (a cancelled run ends in
  REVOKED when it raises ``TaskCancelledError``); the pending call then starts, with a
  greater fence.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..lease import Lease, companion
from .base import Holder, Start
from .replace import Replace

# How often a run's renewal looks for a newer call: the longest a cancelled run goes on
# unaware, plus one round trip.
CANCEL_CHECK = 0.25


class Cancel(Replace):
    """The pending call of ``until_executing`` + ``replace``, cancelling the run in
    progress (``terminate``: a prefork child is terminated too)."""

    name = "cancel"

    def __init__(self, *, terminate: bool) -> None:
        super().__init__(pending=True)
        self.terminate = terminate

    def running(self, lease: Lease, start: Start) -> None:
        lease.yield_to(companion(start.name, "pending"), CANCEL_CHECK)

    def new_call(self, held: Mapping[str | None, Holder], answer: str) -> str:
        hold, running = held.get(self.hold_role), held.get(None)
        if hold is None and running is not None:
            return f"accepted; cancels {running.task_id} ({running.state}) and runs after it"
        return super().new_call(held, answer)
