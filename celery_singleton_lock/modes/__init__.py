"""The lock types, one module each: what a mode does at publish, receipt, start and end."""

from .base import Mode, PublishHold, Start
from .cancel import Cancel, cancel_options
from .debounce import Debounce
from .limit import Limit, Total
from .rate import Rated, RateLimit, RateSpec
from .replace import Replace
from .throttle import Throttle
from .until_executed import UntilExecuted
from .until_executing import UntilExecuting
from .while_executing import WhileExecuting

# The modes that write a lock beside a key, each asked how its holder shows (``Mode.shows``).
_BESIDE_THE_KEY: tuple[type[Mode], ...] = (UntilExecuting, Throttle, Rated)


def shown_state(role: str | None, state: str) -> str:
    """How an operator sees the holder of a lock of ``role`` (None: a key's own) whose
    token says ``state``: as the mode that writes that role says, else as ``state``."""
    for mode in _BESIDE_THE_KEY:
        shown = mode.shows(role, state)
        if shown is not None:
            return shown
    return state


__all__ = [
    "Cancel",
    "Debounce",
    "Limit",
    "Mode",
    "PublishHold",
    "RateLimit",
    "RateSpec",
    "Rated",
    "Replace",
    "Start",
    "Throttle",
    "Total",
    "UntilExecuted",
    "UntilExecuting",
    "WhileExecuting",
    "cancel_options",
    "shown_state",
]
