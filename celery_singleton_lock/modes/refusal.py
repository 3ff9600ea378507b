"""``Refusal``: what a call refused at dispatch gets, composed by a mode apart from its scope.

The sidekiq-unique-jobs split: a lock type says what is held and when, its conflict
strategy what a refused call gets. ``Raises`` and ``replace.Replaces`` are the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from ..lease import Contended


class Answer(Protocol):
    """How a dispatch refused by ``held`` is answered: a result, or an error raised."""

    def __call__(self, held: Contended) -> AsyncResult: ...


class HolderRow(Protocol):
    """One holder of a call's lock as an operator sees it (``contrib.locks.LockRow``)."""

    @property
    def task_id(self) -> str | None: ...
    @property
    def state(self) -> str: ...
    @property
    def ttl(self) -> float | None: ...


class Refusal:
    """What a call refused at dispatch gets, apart from what its mode holds and when.

    This one answers it as a duplicate with the holder's result (``on_duplicate="return"``,
    the default; ``DuplicateTaskError`` when the holder cannot be told), ``Raises`` with
    ``DuplicateTaskError`` (``"raise"``): ``publish.duplicates`` asks ``duplicate``.
    ``replace.Replaces`` swaps the call's arguments into the queued call instead, which
    its run then looks at as it starts; one refused by a running holder is a duplicate.
    """

    # The name of a mode a scope makes with this refusal (``modes.replace``); None: the scope's.
    name: str | None = None
    # start: whether a run looks at its hold as it starts (a replaced message is dropped)
    looked_at_start: bool = False
    # start: whether later calls leave their arguments for a pending call's waiting run
    offered: bool = False
    # How a duplicate is answered, as an operator is told (``celery singleton show``)
    answers_duplicate: str = "returns it"
    # publish: whether a canvas member may attach to the holder (``Mode.attaches``)
    attaches: bool = True

    def answered_by(self, hold: str | None) -> str | None:
        """The lock whose holder answers a refused dispatch with one read, before anything
        of it is built (``hold``: the dispatch's own); None: none does."""
        return hold

    def duplicate(
        self, holder: str | None, result: Callable[[str], AsyncResult]
    ) -> AsyncResult | None:
        """A duplicate's answer, given its holder's task id (None: not known): the holder's
        result, made by ``result``; None: ``DuplicateTaskError`` is raised."""
        return None if holder is None else result(holder)

    def answer(self, duplicate: Answer, replacement: Callable[[], Answer]) -> Answer:
        """How a dispatch refused by a holder is answered: as a ``duplicate``
        (``replacement`` is built only by a refusal that uses it)."""
        return duplicate

    def unless_replaced(self, queued: str | None) -> str | None:
        """The message's queued hold where a later call may have replaced it (None: none may)."""
        return None

    def replaced(self, held: Contended, queued: str | None, token: str, task_id: str) -> bool:
        """Whether the message of ``task_id`` (its own hold ``queued``, its running lease's
        ``token``) whose take met ``held`` was replaced."""
        return False

    def new_call(self, hold: HolderRow | None) -> str | None:
        """What a new call would get from this refusal, given the holder of its hold; None:
        as its mode's scope says."""
        return None


class Raises(Refusal):
    """A duplicate answered with ``DuplicateTaskError`` (``on_duplicate="raise"``), whatever
    its holder: the caller is told the call was not sent."""

    answers_duplicate = "raises DuplicateTaskError"

    def duplicate(
        self, holder: str | None, result: Callable[[str], AsyncResult]
    ) -> AsyncResult | None:
        return None


# The refusal of every mode that does not compose another (``Chosen.as_duplicate``).
AS_DUPLICATE = Refusal()
RAISES = Raises()
