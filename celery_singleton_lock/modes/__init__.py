"""The lock types, one module each: what a mode does at publish, receipt, start and end.

Each module's ``CHOICE`` says which options pick its mode; every module here is loaded and
asked, so a new mode is a new module (``pick``, ``settle``, ``lock_scopes``, ``own_options``).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Mode
from .choosing import Choice, Chosen, Reader
from .rate import Rated, RateLimit, RateSpec
from .stages import PublishHold, Start


def _declared() -> tuple[Choice, ...]:
    """Every module's ``CHOICE``, in the modules' order by name."""
    found = []
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        choice = getattr(importlib.import_module(f"{__name__}.{module.name}"), "CHOICE", None)
        if isinstance(choice, Choice):
            found.append(choice)
    return tuple(found)


CHOICES = _declared()


def own_options() -> dict[str, Reader]:
    """The options the modes add, each with how it is read (``Choice.reads``)."""
    return {option: read for choice in CHOICES for option, read in choice.reads.items()}


def lock_scopes() -> tuple[str, ...]:
    """The values ``lock=`` takes: each picks a mode on its own."""
    return tuple(sorted(choice.scope for choice in CHOICES if choice.scope is not None))


def settle(chosen: Chosen) -> Chosen:
    """``chosen`` with the lock scope and the answer the modes' own options settle
    (``Choice.settles``: debounce's, cancel's), whatever else was written."""
    for choice in CHOICES:
        chosen = choice.settle(chosen)
    return chosen


def pick(chosen: Chosen) -> Mode:
    """The mode options settled and checked (``chosen``) pick: of the choices whose
    values all hold, the one naming the most options; a rate in front of it."""
    picked = sorted(
        (choice for choice in CHOICES if choice.picks(chosen)),
        key=lambda choice: len(choice.picked_by),
        reverse=True,
    )
    if not picked or (len(picked) > 1 and len(picked[0].picked_by) == len(picked[1].picked_by)):
        # A table that picks no mode, or two, is this package's bug: say which options.
        names = [choice.name for choice in picked]
        raise LookupError(f"{chosen.task}: the options pick {names or 'no mode'}")
    mode = picked[0].build(chosen)
    mode.reopen_on = chosen.reopen_on
    rate = chosen.value("rate")
    return Rated(mode, rate) if isinstance(rate, RateSpec) else mode


def shown_state(role: str | None, state: str) -> str:
    """How an operator sees the holder of a lock of ``role`` (None: a key's own) whose
    token says ``state``: as the mode that writes that role says, else as ``state``."""
    for mode in _every(Mode):
        shown = mode.shows(role, state)
        if shown is not None:
            return shown
    return state


def _every(mode: type[Mode]) -> list[type[Mode]]:
    """``mode`` and every subclass of it: every mode module is loaded (``CHOICES``)."""
    return [mode, *(each for sub in mode.__subclasses__() for each in _every(sub))]


__all__ = [
    "CHOICES",
    "Choice",
    "Chosen",
    "Mode",
    "PublishHold",
    "RateLimit",
    "RateSpec",
    "Rated",
    "Start",
    "lock_scopes",
    "own_options",
    "pick",
    "settle",
    "shown_state",
]
