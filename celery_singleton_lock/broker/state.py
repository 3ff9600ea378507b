"""What an app's ride is told by the code around kombu, and the shapes it is told in.

kombu calls the riding channel and its unacked bookkeeping with kombu's arguments only;
what they need beyond those is passed down by our own code, never a module-level mailbox:
per app (``AppRide``), per publish (``Outgoing``), per held call (``HeldCall``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

from ..lease import Contended, Server
from ..lease.redis.calls import Pipeline
from .pushes import Push, Pushes
from .transit import Note

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from ..context import TaskContext
    from ..exceptions import LockStoreUnavailableError
    from ..lease.history import Record


class Refused(BaseException):
    """Raised inside a publish for a duplicate, by the hold it waits for (the gated
    producer's, ``publish.dispatch.Gate``, or one taken in the push, ``HoldWithPush``),
    and caught around that publish: nothing is sent.

    A BaseException so that nothing between the two (Celery wraps publishing in
    retry-and-log handlers for Exception) takes it for a failed publish.
    """

    def __init__(self, held: Contended) -> None:
        super().__init__(held.key)
        self.held = held


class HeldCall(Protocol):
    """A call being dispatched with its hold, as the ride publishes it
    (``publish.call.Dispatch``): its hold as planned, and what the dispatch does for it."""

    # Whether its hold may ride the push: set by the ride as it publishes the call, read
    # again when a refused call replaces the queued one.
    rides: bool

    @property
    def context(self) -> TaskContext: ...
    @property
    def pushes(self) -> Pushes | None:
        """The pushes its task's holds may ride (None: none, or no longer)."""

    @property
    def lock_name(self) -> str: ...
    @property
    def hold(self) -> str:
        """The lock its hold takes, for ``ttl`` seconds, as ``token``."""

    @property
    def ttl(self) -> float: ...
    @property
    def token(self) -> str: ...
    @property
    def task_id(self) -> str | None: ...
    @property
    def record(self) -> Record | None:
        """What its take, swap or read writes in a kept history."""

    @property
    def producer(self) -> object:
        """The producer the caller gave (None: the app's, acquired)."""

    def through_producer(self) -> bool:
        """Whether Celery publishes it through a producer of the app's."""

    def answered_early(self, hold: str) -> Contended | None:
        """A duplicate answered by one read of ``hold``'s holder (None: dispatch it)."""

    def publish(
        self,
        task_id: str | None,
        options: dict[str, object],
        own_headers: dict[str, object],
        via: object = None,
    ) -> AsyncResult:
        """Publish it under ``task_id`` with ``options`` and the library's headers."""

    def publish_held(self, via: object = None) -> AsyncResult:
        """Publish it with its hold's headers."""

    def publish_unheld(self) -> AsyncResult:
        """Publish it without a hold (an outage under fail_open)."""

    def outage(self, error: LockStoreUnavailableError) -> None:
        """The store unreachable at dispatch: fail_closed raises."""

    def refused(self, held: Contended) -> None:
        """It was refused by ``held``, nothing sent."""

    def accepted(self) -> None:
        """It was sent with its hold."""


class HoldWithPush(Protocol):
    """A dispatch's hold, handed to the channel that puts the message it holds for."""

    task_id: str

    def put(self, server: Server | None, push: Push | None) -> bool:
        """Take the hold: with ``push`` in the same step when ``server`` is the lock
        store's (True: pushed), or alone (False: the channel pushes). Raises ``Refused``
        to refuse the message, which is then not pushed."""


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


__all__ = [
    "AppRide",
    "HeldCall",
    "HoldWithPush",
    "NoteSource",
    "Outgoing",
    "Purges",
    "Receipts",
    "Refused",
    "RidingCall",
]
