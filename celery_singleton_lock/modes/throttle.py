"""``throttle=<seconds>``: at most one accepted call per key and window; runs exclusive.

The stages (publish, receipt, start, end) are in ``Throttle``'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._time import human
from ..lease import LockStore, companion
from ..tokens import NAME_HEADER, WINDOW_HEADER, header
from .base import Mode
from .choosing import GIVEN, Choice, seconds_option
from .refusal import HolderRow, Refusal
from .stages import PublishHold


class Throttle(Mode):
    """At most one accepted call per key and window, its run exclusive on the key.

    - publish: a window hold beside the key (``companion(key, "throttle")``) for the
      window's length; nobody takes it over or gives it back: it runs out by itself. A
      call inside the window is refused; the message carries no hold of its own.
    - receipt: nothing to reserve (the window is not the message's).
    - start: the running lease on the key, as ``while_executing``: two accepted calls of
      consecutive windows never run at once.
    - end: the running lease is released; the window runs out on its own, or with
      ``reopen_on`` is given back when the run fails or is revoked (owner-checked: the
      window's token rides in the message), so the next call is accepted at once.
    """

    name = "throttle"
    hold_role = "throttle"

    def __init__(self, window: float, refusal: Refusal | None = None) -> None:
        super().__init__(refusal)
        self.window = window

    def refused_because(self) -> str:
        return f"was accepted less than {self.window:g}s ago"

    def hold(self, name: str, token: str, ttl: float) -> PublishHold:
        # The window, not the queue ttl: it is nobody's to take over; given back only
        # by a run that ends as reopen_on names, which carries its token for that.
        headers: dict[str, object] = {NAME_HEADER: name}
        if self.reopen_on:
            headers[WINDOW_HEADER] = token
        return PublishHold(companion(name, "throttle"), self.window, token, headers)

    def reopen(self, store: LockStore, request: object) -> None:
        name, token = header(request, NAME_HEADER), header(request, WINDOW_HEADER)
        if name and token:  # a message of this window (a copy or a retry has none)
            store.release_token(companion(name, "throttle"), token)

    @classmethod
    def shows(cls, role: str | None, state: str) -> str | None:
        return "throttled" if role == cls.hold_role else None

    def held_by_a_run(self, name: str) -> list[str]:
        return [name, companion(name, "throttle")]

    def new_call(self, held: Mapping[str | None, HolderRow]) -> str:
        window = held.get(self.hold_role)
        if window is not None:
            return f"refused for {human(window.ttl)} more (the window of {window.task_id})"
        return "accepted"


# Picked by a window, with the default lock scope (throttle= with lock= is refused).
CHOICE = Choice(
    Throttle.name,
    {"throttle": GIVEN, "lock": "until_executed"},
    lambda chosen: Throttle(chosen.seconds("throttle"), chosen.as_duplicate),
    reads={"throttle": seconds_option},
)
