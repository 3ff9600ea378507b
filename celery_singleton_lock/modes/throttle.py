"""``throttle=<seconds>``: at most one accepted call per key and window; runs exclusive.

- publish: a window hold beside the key (``companion(key, "throttle")``) for the
  window's length; nobody takes it over or gives it back: it runs out by itself. A
  call inside the window is refused; the message carries no hold of its own.
- receipt: nothing to reserve (the window is not the message's).
- start: the running lease on the key, as ``while_executing``: two accepted calls of
  consecutive windows never run at once.
- end: the running lease is released; the window runs out on its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._time import human
from ..lease import companion
from ..tokens import NAME_HEADER
from .base import Holder, Mode, PublishHold


class Throttle(Mode):
    name = "throttle"
    hold_role = "throttle"

    def __init__(self, window: float) -> None:
        self.window = window

    def refused_because(self) -> str:
        return f"was accepted less than {self.window:g}s ago"

    def hold(self, name: str, token: str, ttl: float) -> PublishHold:
        # The window, not the queue ttl: it is nobody's to take over or give back.
        return PublishHold(companion(name, "throttle"), self.window, token, {NAME_HEADER: name})

    def held_by_a_run(self, name: str) -> list[str]:
        return [name, companion(name, "throttle")]

    def new_call(self, held: Mapping[str | None, Holder], answer: str) -> str:
        window = held.get(self.hold_role)
        if window is not None:
            return f"refused for {human(window.ttl)} more (the window of {window.task_id})"
        return "accepted"
