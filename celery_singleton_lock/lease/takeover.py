"""How a take is made: what it may take the key over from (``TakeOver``), how it waits.

Every store's ``try_acquire``, ``begin_try_acquire`` and ``acquire`` take this one value
rather than four keywords each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from ..exceptions import ConfigurationError


@dataclass(frozen=True)
class TakeOver:
    """What a take may take the key over from, and what it makes.

    A queued message's hold becomes its running lease in one step (the take passes the
    key from the hold's token to the lease's); a hold whose random part the taker cannot
    know is named by its shape; a message that a later call replaced must never take the
    key, even once it is free.

    ``replace``: a holder's token the take may take over (the hold its own message took
    at dispatch); ``shape``: or any holder's token starting with ``shape[0]`` and ending
    with ``shape[1]``. ``fenced=False``: a hold that only keeps others out and never
    guards a write skips the fencing work (its ``fence`` is 0). ``unless_replaced``: a
    token that, if ``swap`` ever replaced it, makes the take ``Contended(replaced=True)``.
    """

    replace: str | None = None
    shape: tuple[str, str] | None = None
    fenced: bool = True
    unless_replaced: str | None = None

    def __post_init__(self) -> None:
        # Checked before the first byte goes to Redis.
        replace, shape = self.replace, self.shape
        if replace is not None and (not isinstance(replace, str) or not replace):
            raise ConfigurationError(f"replace must be a non-empty token or None, got {replace!r}")
        if shape is not None and not (
            isinstance(shape, tuple)
            and len(shape) == 2
            and all(isinstance(part, str) for part in shape)
            and shape[0]
        ):
            raise ConfigurationError(
                f"shape must be (prefix, suffix) with a non-empty prefix, got {shape!r}"
            )


# A running lease taken afresh: fenced, taking nothing over (the default).
FRESH = TakeOver()
# A queued message's hold: unfenced (it only keeps duplicates out), taking nothing over.
HOLD = TakeOver(fenced=False)

# How an acquire that must wait does: woken by the release's push (BLPOP), or retrying
# with backoff.
WaitMode: TypeAlias = Literal["push", "spin"]
