"""``lock="while_executing"`` (``dedupe=False``): never refused at dispatch, one run at a time.

The stages (publish, receipt, start, end) are in ``WhileExecuting``'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Mode
from .choosing import Choice
from .refusal import HolderRow


class WhileExecuting(Mode):
    """Never refused at dispatch; one run of a key at a time.

    - publish: no hold; every call is sent (the per-call ``dedupe=False`` of other modes
      publishes the same way, once).
    - receipt: nothing to reserve.
    - start: the running lease on the key, or ``on_contention`` (wait, requeue, skip, fail).
    - end: the running lease is released.
    """

    name = "while_executing"
    checks_dispatch = False

    def new_call(self, held: Mapping[str | None, HolderRow]) -> str:
        running = held.get(None)
        if running is not None:
            return f"accepted; at execution it meets {running.task_id} ({running.state})"
        return "accepted"


CHOICE = Choice(WhileExecuting.name, {"lock": "while_executing"}, lambda chosen: WhileExecuting())
