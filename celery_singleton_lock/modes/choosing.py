"""``Choice``: what picks a mode from a task's options, and how the mode is built from them.

Each mode module declares one (``CHOICE``); ``modes.pick`` takes the one the options pick.
``config.options`` reads the options and asks; it names no mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._time import ttl_to_ms
from ..exceptions import ConfigurationError
from .refusal import AS_DUPLICATE, RAISES, Refusal

if TYPE_CHECKING:
    from .base import Mode


class _AnyValue:
    """The value a choice asks of an option that picks it whatever it says (``GIVEN``)."""

    def __repr__(self) -> str:
        return "GIVEN"


# An option that picks a mode by being given at all (not None), whatever its value.
GIVEN = _AnyValue()

# Reads one option of a task (``raw``: its options as written; the option's name; the
# task's, for an error), checked; None when not given.
Reader = Callable[[Mapping[str, object], str, str], object]


@dataclass(frozen=True)
class Chosen:
    """A task's options as read and settled: what the choices look at and build from.

    ``lock`` and ``on_duplicate`` are the lock scope and the answer the options come to
    (a limit's scope, or what a mode's own option settles); ``values`` every other
    option as read, by name (None: not given).
    """

    task: str  # the task's name: a task-wide lease is named after it
    lock: str
    on_duplicate: str
    reopen_on: frozenset[str] = frozenset()
    values: Mapping[str, object] = field(default_factory=dict)

    def value(self, option: str) -> object:
        """``option`` as read: its checked value, or None when not given."""
        if option == "lock":
            return self.lock
        if option == "on_duplicate":
            return self.on_duplicate
        return self.values.get(option)

    @property
    def as_duplicate(self) -> Refusal:
        """The refusal of a scope that answers a refused call as a duplicate, as
        ``on_duplicate`` says: ``DuplicateTaskError`` (``"raise"``), else the holder's result."""
        return RAISES if self.on_duplicate == "raise" else AS_DUPLICATE

    def seconds(self, option: str) -> float:
        """``option``, a duration a choice's reader checked, in seconds."""
        value = self.values.get(option)
        if not isinstance(value, float):
            raise TypeError(f"{option}={value!r} was not read as seconds")
        return value

    def count(self, option: str) -> int:
        """``option``, a count read and checked (``limit``)."""
        value = self.values.get(option)
        if not isinstance(value, int):
            raise TypeError(f"{option}={value!r} was not read as a count")
        return value


@dataclass(frozen=True)
class Choice:
    """One mode's entry in the choice: its name, the option values that pick it, and how
    it is built (a scope with the refusal it composes, ``Mode.refusal``).

    ``picked_by``: option -> the value that picks it (a tuple: any of them; ``GIVEN``: any
    value given). Of the choices whose values all hold, the one naming the most options
    wins (``test_modes_choice`` checks that no two tie). ``settles``: the options of
    ``picked_by`` that its other options fix, whatever is written (a debounce fixes the
    scope and the answer). ``reads``: options of the mode's own, each with its reader.
    """

    name: str  # the mode's (``Mode.name``)
    picked_by: Mapping[str, object]
    build: Callable[[Chosen], Mode]
    settles: tuple[str, ...] = ()
    reads: Mapping[str, Reader] = field(default_factory=dict)

    def picks(self, chosen: Chosen) -> bool:
        """Whether every option of ``picked_by`` says what picks this mode."""
        return all(_holds(want, chosen.value(option)) for option, want in self.picked_by.items())

    def settle(self, chosen: Chosen) -> Chosen:
        """``chosen`` with what this mode's own options settle, once those pick it."""
        if not self.settles:
            return chosen
        own = {o: want for o, want in self.picked_by.items() if o not in self.settles}
        if not all(_holds(want, chosen.value(option)) for option, want in own.items()):
            return chosen
        settled = {option: self.picked_by[option] for option in self.settles}
        return Chosen(
            task=chosen.task,
            lock=str(settled.get("lock", chosen.lock)),
            on_duplicate=str(settled.get("on_duplicate", chosen.on_duplicate)),
            reopen_on=chosen.reopen_on,
            values=chosen.values,
        )

    @property
    def scope(self) -> str | None:
        """The ``lock=`` value that picks this mode alone (None: it is not a lock scope)."""
        lock = self.picked_by.get("lock")
        return lock if set(self.picked_by) == {"lock"} and isinstance(lock, str) else None


def _holds(want: object, value: object) -> bool:
    if want is GIVEN:
        return value is not None
    if isinstance(want, tuple):
        return value in want
    return value == want


def seconds_option(raw: Mapping[str, object], option: str, task: str) -> float | None:
    """A duration option (a number of seconds or a ``timedelta``), positive; None: not given."""
    value = raw.get(option)
    return None if value is None else ttl_to_ms(value, what=f"{task}: {option}") / 1000


def flag_option(raw: Mapping[str, object], option: str, task: str) -> bool:
    """A True-or-False option, False when not given."""
    value = raw.get(option, False)
    if not isinstance(value, bool):
        raise ConfigurationError(f"{task}: {option}={value!r} must be True or False")
    return value
