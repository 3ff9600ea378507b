"""The running leases this process's runs hold now, per task: how many, and the oldest's take.

Kept for the metrics' gauges: a lease is counted from its take (``lease_acquired``) to its
first end (released, lost or handed to a retry); a second end of the same run (a lost
lease released at the run's end) changes nothing.
"""

from __future__ import annotations

import math
import threading

NONE_HELD = math.inf  # the oldest take's time when nothing is held: the smallest of none


class LeasesHeld:
    """The leases held now in this process, by task name and task id: when each was taken."""

    def __init__(self) -> None:
        self._guard = threading.Lock()  # renewal's thread reports a loss
        self._taken: dict[str, dict[str, float]] = {}

    def taken(self, task: str, task_id: str, at: float) -> tuple[int, float]:
        """Count the run ``task_id`` of ``task`` as holding a lease since ``at`` (seconds
        since the epoch). Returns the task's count and oldest take now."""
        with self._guard:
            self._taken.setdefault(task, {})[task_id] = at
            return self._figures(task)

    def ended(self, task: str, task_id: str) -> tuple[int, float] | None:
        """The run's lease ended. Returns the task's figures now, or None if it was not
        counted as held (ended before, or taken in another process)."""
        with self._guard:
            held = self._taken.get(task, {})
            if held.pop(task_id, None) is None:
                return None
            return self._figures(task)

    def figures(self, task: str) -> tuple[int, float]:
        """How many leases runs of ``task`` hold now, and when the oldest was taken."""
        with self._guard:
            return self._figures(task)

    def _figures(self, task: str) -> tuple[int, float]:
        held = self._taken.get(task, {})
        return len(held), min(held.values(), default=NONE_HELD)
