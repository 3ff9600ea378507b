"""``Helpers``: what is built over a store (its rates, backlogs, overrides...), made once and kept.

A helper registers its scripts as it is made: made at its first use and kept as long as
the store, it registers them once (``RedisLock.helper``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

Owner = TypeVar("Owner")
_UNMADE = object()  # not made yet (a helper may be None)
Helper = TypeVar("Helper")


class Helpers(Generic[Owner]):
    """The helpers made over ``owner``, one per maker, whichever thread asks first."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner
        self._made: dict[Callable[[Owner], object], object] = {}
        self._guard = threading.Lock()

    def get(self, make: Callable[[Owner], Helper]) -> Helper:
        """What ``make`` builds over the owner: made now if it is the first to ask."""
        found = self._made.get(make, _UNMADE)  # every dispatch asks: no lock once made
        if found is _UNMADE:
            with self._guard:
                if make not in self._made:
                    self._made[make] = make(self._owner)
                found = self._made[make]
        made: Helper = found  # type: ignore[assignment]
        return made
