"""What an app's ride is told by the code around kombu, and the shapes it is told in.

kombu calls the riding channel and its unacked bookkeeping with kombu's arguments only.
What they need beyond those is passed down by our own code, never through a module-level
mailbox: per app (``AppRide``) and per publish (``Outgoing``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from ..lease import Server
from ..lease.redis.calls import Pipeline
from .pushes import Push
from .transit import Note


class HoldWithPush(Protocol):
    """A dispatch's hold, handed to the channel that puts the message it holds for."""

    task_id: str

    def put(self, server: Server | None, push: Push | None) -> bool:
        """Take the hold: with ``push`` in the same step when ``server`` is the lock
        store's (True: pushed), or alone (False: the channel pushes). Raises to refuse
        the message, which is then not pushed."""


class NoteSource(Protocol):
    """A singleton call being published: its message is noted in transit as the channel
    pushes it (``broker.transit``), by the hold's script or with its own push."""

    @property
    def task_id(self) -> str: ...

    def note(self, member: str) -> Note | None:
        """How its message, of delivery tag ``member``, is noted (None: not)."""


class RidingCall(Protocol):
    """A lock-store command sent first in kombu's unacked pipeline (``broker.pushes.RidingTake``,
    ``broker.transit.ClearNote``)."""

    def add(self, pipe: Pipeline, db: int) -> None: ...
    def read(self, reply: object) -> None: ...
    def refused(self, error: Exception) -> bool: ...


# A received message's (headers, properties), the broker's server, its delivery tag:
# what rides kombu's unacked bookkeeping for it.
Receipts: TypeAlias = Callable[
    [tuple[Mapping[str, object], Mapping[str, object]], Server, str], Sequence[RidingCall]
]
# The purging channel's client and the lists it emptied.
Purges: TypeAlias = Callable[[object, list[str]], None]


@dataclass(eq=False)
class AppRide:
    """One app's ride in this process, beyond any one message; kept by the app's
    connection class (``broker.install``)."""

    # The worker's main process, once it consumes: what a received message rides.
    receipts: Receipts | None = None
    # The task binding: a purge gives up the purged messages' holds.
    purges: Purges | None = None
    # False once the broker refused a noted push (an ACL user without the lock prefix's
    # keys): messages are pushed as kombu pushes them from then on.
    notes_allowed: bool = True
    # Why nothing rides any more: the worker's self-check found kombu reading otherwise
    # than the ride writes (set before the pool forks, so its children agree).
    turned_off: str | None = None


@dataclass(eq=False)
class Outgoing:
    """What rides one publish on a connection, handed to the channel that puts its message;
    each is taken once, by the first put of that message's task id.

    On the publishing connection for as long as one message is published
    (``connection.publishing``): the dispatch's hold to take in the push
    (``HoldWithPush``) and how its message is noted in transit (``NoteSource``)."""

    hold: HoldWithPush | None = None
    notes: NoteSource | None = None

    def rides(self) -> bool:
        """Whether anything rides a publish on this connection now."""
        return self.hold is not None or self.notes is not None

    def take_hold(self, task_id: object) -> HoldWithPush | None:
        """The hold to take with the message of ``task_id`` (None: none, or taken)."""
        hold = self.hold
        if hold is None or hold.task_id != task_id:
            return None
        # Once: a second queue bound to the same routing key gets the message as kombu
        # puts it, and so does a publish kombu retries after the hold was taken.
        self.hold = None
        return hold

    def take_note_source(self, task_id: object) -> NoteSource | None:
        """How the message of ``task_id`` is noted (None: not, or already noted)."""
        notes = self.notes
        if notes is None or notes.task_id != task_id:
            return None
        self.notes = None  # once, like the hold
        return notes


__all__ = ["AppRide", "HoldWithPush", "NoteSource", "Outgoing", "Purges", "Receipts", "RidingCall"]
