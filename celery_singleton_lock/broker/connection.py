"""The connection class of an app that rides: kombu's Redis transports resolve to the app's own.

Celery makes every broker connection of an app through ``app.amqp.Connection``, and kombu
hands a connection's transport class on to the connections its pools and clones make: so
the app's producers and consumers all ride, and no other app does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, ClassVar

from kombu.connection import Connection, ConnectionPool
from kombu.transport import get_transport_cls

from .state import AppRide, HoldWithPush, NoteSource
from .transport import REPLACED, Riding

if TYPE_CHECKING:
    from celery import Celery


class RidingConnection(Connection):
    """kombu's ``Connection``, naming the app's riding transport where kombu's Redis or
    Sentinel transport would serve the URL's scheme.

    ``install`` gives the app a subclass of its own (``for_app``), which keeps the app's
    ride (``state.AppRide``) and names, in place of kombu's Redis or Sentinel transport, a
    subclass of ``RedisTransport`` or ``SentinelTransport`` made for that app and keeping
    the same ride. A broker URL changed after the install (``memory://`` in tests) is
    still honoured: each connection looks at its own URL, and so does a failover to the
    next one. A transport the app names by its path (``broker_transport``) is kept; one of
    ours (or a subclass of it) is made the app's own the same way."""

    # The app's ride, and its transports by the class they replace: set on the app's
    # own subclass (``for_app``); on this class, nothing rides.
    ride: ClassVar[AppRide | None] = None
    transports: ClassVar[dict[type, type]] = {}

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._name_the_riding_transport()

    def info(self) -> dict[str, object]:
        """kombu's, with the transport named by its path where this connection keeps the
        class: what Celery sends in a worker's ``stats`` reply (JSON) and prints as the
        broker's URL. Clones and pools are still handed the class (kombu's ``_info``)."""
        info: dict[str, object] = super().info()
        info["transport"] = transport_name(info.get("transport"))
        return info

    def __reduce__(self) -> tuple[object, ...]:
        # The app's subclass is made at install and cannot be found by name: a copy
        # unpickled elsewhere is kombu's own connection, which rides nothing (its
        # transport named by path, ``info``: our class with no ride).
        reduced = super().__reduce__()
        return (Connection, *reduced[1:])

    def switch(self, conn_str: str) -> None:
        """A failover to the next broker URL names its transport again."""
        super().switch(conn_str)
        self._name_the_riding_transport()

    def _name_the_riding_transport(self) -> None:
        named = self.transport_cls
        if isinstance(named, str) and "." not in named and ":" not in named:
            # The URL's scheme (kombu's aliases: no dot, no colon).
            kombus = get_transport_cls(named)
            replacement = None if kombus is None else REPLACED.get(kombus)
        elif isinstance(named, str):
            replacement = _by_path(named)  # a transport the app named by its path
        else:
            replacement = named if isinstance(named, type) else None
        if replacement is not None and issubclass(replacement, Riding) and self.ride is not None:
            self.transport_cls = self._of_this_app(replacement)

    def _of_this_app(self, transport: type[Riding]) -> type:
        if transport.ride is self.ride:
            return transport
        made = self.transports.get(transport)
        if made is None:
            made = type(transport.__name__, (transport,), _named_as(transport, ride=self.ride))
            self.transports[transport] = made
        return made

    def Pool(self, limit: int | None = None, **kwargs: object) -> ConnectionPool:
        return RidingPool(self, limit=limit, **kwargs)


def transport_name(transport: object) -> object:
    """``transport`` as a connection's ``transport`` parameter names it, a string: a
    class by its path (``module:QualifiedName``, which kombu resolves; an app's own
    subclass by the class it is made from). Anything else as it is."""
    if isinstance(transport, type):
        return f"{transport.__module__}:{transport.__qualname__}"
    return transport


def _by_path(path: str) -> type | None:
    # Resolved here as kombu would resolve it when connecting: an error is kombu's to
    # raise then, with the transport kept as named.
    try:
        found = get_transport_cls(path)
    except Exception:
        return None
    return found if isinstance(found, type) else None


class RidingPool(ConnectionPool):
    """kombu's connection pool, its connections naming the transport the pool's does."""

    def new(self) -> Connection:
        made: Connection = super().new()
        # kombu hands the transport on, but reads it again from a ``redis+socket://``
        # URL (the part before the ``+``): the pool's own decides. Not connected yet.
        made.transport_cls = self.connection.transport_cls
        return made


def for_app() -> type[RidingConnection]:
    """A connection class of one app's own, keeping that app's ride."""
    return type(
        "RidingConnection",
        (RidingConnection,),
        _named_as(RidingConnection, ride=AppRide(), transports={}),
    )


def _named_as(base: type, **attributes: object) -> dict[str, object]:
    # An app's own class reads, in logs and reprs, as the class it is made from.
    return {"__module__": base.__module__, "__qualname__": base.__qualname__, **attributes}


def ride_of_app(app: Celery) -> AppRide | None:
    """``app``'s ride in this process (None: it does not ride)."""
    made = app.amqp.Connection
    return made.ride if isinstance(made, type) and issubclass(made, RidingConnection) else None


def turned_off(app: Celery) -> str | None:
    """Why ``app``'s ride was turned off in this process (None: it was not, or it does
    not ride)."""
    ride = ride_of_app(app)
    return None if ride is None else ride.turned_off


@contextmanager
def publishing(
    via: object, *, hold: HoldWithPush | None = None, notes: NoteSource | None = None
) -> Iterator[None]:
    """While ``via`` (a producer, or a connection) publishes one message: the channel that
    puts it takes ``hold`` in its push and notes it in transit as ``notes`` says.
    Nothing on a connection of an app that does not ride."""
    connection = via if isinstance(via, Connection) else getattr(via, "connection", None)
    # kombu makes a connection's transport object without I/O; the channel uses it.
    transport = getattr(connection, "transport", None)
    if not isinstance(transport, Riding) or transport.ride is None:
        yield
        return
    outgoing = transport.outgoing
    # Each is put back as it was: a publish inside a publish (the ride's hold, then the
    # task's note) hands on only what it set.
    kept = outgoing.hold, outgoing.notes
    if hold is not None:
        outgoing.hold = hold
    if notes is not None:
        outgoing.notes = notes
    try:
        yield
    finally:
        if hold is not None:
            outgoing.hold = kept[0]
        if notes is not None:
            outgoing.notes = kept[1]
