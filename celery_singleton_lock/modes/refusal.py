"""``Refusal``: what a call refused at dispatch gets, composed by a mode apart from its scope.

The sidekiq-unique-jobs split: a lock type says what is held and when, its conflict
strategy what a refused call gets. ``replace.Replaces`` is the other one.
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

    This one answers it as a duplicate: the holder's result, or ``DuplicateTaskError``
    (``on_duplicate="return"`` or ``"raise"``, which ``publish.held.answer_duplicate``
    reads). ``replace.Replaces`` swaps the call's arguments into the queued call instead,
    which its run then looks at as it starts.
    """

    # The name of a mode a scope makes with this refusal (``modes.replace``); None: the scope's.
    name: str | None = None
    # start: whether a run looks at its hold as it starts (a replaced message is dropped)
    looked_at_start: bool = False
    # start: whether later calls leave their arguments for a pending call's waiting run
    offered: bool = False

    def answered_by(self, hold: str | None) -> str | None:
        """The lock whose holder answers a refused dispatch with one read, before anything
        of it is built (``hold``: the dispatch's own); None: none does."""
        return hold

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


# The refusal of every mode that does not compose another.
AS_DUPLICATE = Refusal()
