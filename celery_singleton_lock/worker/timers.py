"""The worker's timer calls to the lock store, paced while it is out of reach: a failed
call waits out a growing pause before the next, and the outage is logged once.

The timer shares the main process's event loop with handing messages to the pool: a
sweep blocked for the connect timeout every tick would hold the worker back in an outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..exceptions import SingletonLockError

logger = logging.getLogger(__name__)

# The pause after a first failure, doubled after each next one, up to the last.
FIRST_PAUSE = 1.0
LONGEST_PAUSE = 30.0


class Paced:
    """``call`` on a timer, paused after a lock-store error (``SingletonLockError``):
    ``FIRST_PAUSE``, doubling to ``LONGEST_PAUSE``; said once as a warning, and once
    again when a call succeeds."""

    def __init__(self, what: str, call: Callable[[], object]) -> None:
        self.what = what
        self.call = call
        self.pause = 0.0  # 0: the store answered the last call
        self.resume_at = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self.resume_at:
            return
        try:
            self.call()
        except SingletonLockError as error:
            if not self.pause:
                logger.warning(
                    "celery-singleton-lock: %s paused while the lock store is out of reach "
                    "(%s); tried again after %gs, then less and less often",
                    self.what,
                    error,
                    FIRST_PAUSE,
                )
            self.pause = min(LONGEST_PAUSE, self.pause * 2 if self.pause else FIRST_PAUSE)
            self.resume_at = time.monotonic() + self.pause
            return
        if self.pause:
            logger.warning("celery-singleton-lock: %s going on: the lock store answers", self.what)
            self.pause = 0.0
