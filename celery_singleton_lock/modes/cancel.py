"""``on_duplicate="cancel"``: the newest call wins; a run in progress is cancelled for it.

A call made while a run is in progress becomes the pending call, and its hold beside the
key cancels the run. The stages (publish, receipt, start, end) are in ``Cancel``'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..lease import Lease, companion
from .choosing import Choice, flag_option
from .refusal import HolderRow
from .replace import REPLACES
from .stages import PENDING, Start
from .until_executing import UntilExecuting

# How often a run's renewal looks for a newer call: the longest a cancelled run goes on
# unaware, plus one round trip.
CANCEL_CHECK = 0.25


class Cancel(UntilExecuting):
    """The pending call of ``until_executing`` with ``Replaces``' answer, cancelling the
    run in progress (``terminate``: a prefork child is terminated too).

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
      prefork child is terminated (``run/cancels.py``).
    - end: the running lease is released however the run ends (a cancelled run ends in
      REVOKED when it raises ``TaskCancelledError``); the pending call then starts, with a
      greater fence.
    """

    name = "cancel"
    refusal = REPLACES

    def __init__(self, *, terminate: bool) -> None:
        super().__init__()
        self.terminate = terminate

    def running(self, lease: Lease, start: Start) -> None:
        lease.yield_to(companion(start.name, PENDING), CANCEL_CHECK)

    def new_call(self, held: Mapping[str | None, HolderRow]) -> str:
        hold, running = held.get(self.hold_role), held.get(None)
        if hold is None and running is not None:
            return f"accepted; cancels {running.task_id} ({running.state}) and runs after it"
        return super().new_call(held)


# The newest call waits, pending, for the one it cancels: cancel settles the scope.
# ``terminate_on_cancel``: whether a cancelled prefork child is terminated (what it
# cannot go with: ``config.contradictions``).
CHOICE = Choice(
    Cancel.name,
    {"on_duplicate": "cancel", "lock": "until_executing"},
    lambda chosen: Cancel(terminate=chosen.value("terminate_on_cancel") is True),
    settles=("lock",),
    reads={"terminate_on_cancel": flag_option},
)
