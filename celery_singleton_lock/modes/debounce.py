"""``debounce=<seconds>`` (``max_wait=``): one run after a burst of calls, with its last arguments.

The stages (publish, receipt, start, end) are in ``Debounce``'s docstring.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping

from ..exceptions import ConfigurationError
from ..tokens import ETA_HEADER, burst_began, debounced_token
from .choosing import GIVEN, Choice, Chosen, seconds_option
from .replace import REPLACES
from .until_executing import UntilExecuting


class Debounce(UntilExecuting):
    """One run per burst of calls, with the last call's arguments: ``until_executing``'s
    pending hold with ``Replaces``' answer, its message sent again later by each call of
    the burst.

    - publish: the burst's first call is sent with ``countdown=debounce`` and a pending
      hold beside the key whose token also says when the burst began; each later call of
      the burst replaces the queued call's arguments and postpones it (``Replacement``),
      but never past ``max_wait`` after the burst began.
    - receipt: the worker reserves the hold (keeping when the burst began).
    - start: as ``until_executing``: the running lease on the key taken afresh, the pending
      hold let go once it is taken, so a call made during the run starts a new burst.
    - end: the running lease on the key is released.
    """

    name = "debounce"
    refusal = REPLACES

    def __init__(self, debounce: float, max_wait: float | None) -> None:
        super().__init__()
        self.debounce = debounce
        self.max_wait = max_wait

    def prepare(self, task: str, options: MutableMapping[str, object]) -> None:
        """A burst's first call runs ``debounce`` s from now unless a later call replaces it."""
        if options.get("countdown") is not None or options.get("eta") is not None:
            raise ConfigurationError(
                f"{task}: debounce sets each call's countdown; drop countdown= / eta="
            )
        options["countdown"] = self.debounce

    def token(self, task_id: str) -> str:
        return debounced_token(task_id, time.time())

    def successor(
        self, queued_id: str, holder: str, options: dict[str, object], ttl: float, queue_ttl: float
    ) -> tuple[str, float, dict[str, object]]:
        """It runs ``debounce`` s from now, but no later than ``max_wait`` after the burst
        began (kept in the holder's token)."""
        now = time.time()
        began = burst_began(holder) or now
        delay = self.debounce
        if self.max_wait is not None:
            delay = max(0.0, min(delay, began + self.max_wait - now))
        successor = {**options, "countdown": delay}
        given = options.get("headers")
        if isinstance(given, Mapping) and ETA_HEADER in given:
            # The end of this call's own window, which it was to hop to: not the successor's.
            successor["headers"] = {k: v for k, v in given.items() if k != ETA_HEADER}
        return debounced_token(queued_id, began), queue_ttl + delay, successor


def _built(chosen: Chosen) -> Debounce:
    max_wait = chosen.value("max_wait")
    return Debounce(
        chosen.seconds("debounce"), None if max_wait is None else chosen.seconds("max_wait")
    )


# A debounce settles the answer and the scope: a run starts a new burst, so the next
# call queues; the latest arguments of a burst win.
CHOICE = Choice(
    Debounce.name,
    {"debounce": GIVEN, "lock": "until_executing", "on_duplicate": "replace"},
    _built,
    settles=("lock", "on_duplicate"),
    reads={"debounce": seconds_option, "max_wait": seconds_option},
)
