"""Keys this process was refused recently (``refusals``): a storm's next call asks first."""

from __future__ import annotations

import time


class RecentRefusals:
    """Keys this process was refused recently, until their holder's lease runs out.

    Only picks the order of a dispatch, never its outcome (Redis decides every time):
    a key just refused is likely refused again (a storm of duplicates), and then asking
    first is cheaper than building a message that will not be sent.
    """

    LIMIT = 4096

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def expects(self, lock_name: str) -> bool:
        until = self._until.get(lock_name)
        return until is not None and until > time.monotonic()

    def note(self, lock_name: str, retry_after: float | None) -> None:
        if len(self._until) >= self.LIMIT:
            self._until.clear()  # cheaper than an LRU; a forgotten key costs one overlap
        self._until[lock_name] = time.monotonic() + (1.0 if retry_after is None else retry_after)

    def forget(self, lock_name: str) -> None:
        self._until.pop(lock_name, None)


refusals = RecentRefusals()
