"""The connection class of an app that rides: kombu's Redis transports resolve to ours.

Celery makes every broker connection of an app through ``app.amqp.Connection`` (kombu's
``Connection``). This one names the riding transport in place of kombu's Redis or
Sentinel one, as ``broker_transport = "celery_singleton_lock.broker:RedisTransport"``
would; and since kombu hands a connection's transport on to the connections its pools
and clones make, the app's producers and consumers all ride, and no other app does. A
broker URL changed after the install (``memory://`` in tests) is still honoured: each
connection looks at its own URL, and so does a failover to the next one. A transport
the app names by its path (``broker_transport``) is kept.
"""

from __future__ import annotations

from kombu.connection import Connection, ConnectionPool
from kombu.transport import get_transport_cls

from .transport import REPLACED


class RidingConnection(Connection):
    """kombu's ``Connection``, naming the riding transport where kombu's Redis or
    Sentinel transport would serve the URL's scheme."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._name_the_riding_transport()

    def switch(self, conn_str: str) -> None:
        """A failover to the next broker URL names its transport again."""
        super().switch(conn_str)
        self._name_the_riding_transport()

    def _name_the_riding_transport(self) -> None:
        # ``transport_cls`` is the URL's scheme here (kombu's aliases: no dot, no
        # colon), or a transport the app named by its path, which is kept.
        scheme = self.transport_cls
        if isinstance(scheme, str) and "." not in scheme and ":" not in scheme:
            kombus = get_transport_cls(scheme)
            ours = None if kombus is None else REPLACED.get(kombus)
            if ours is not None:
                self.transport_cls = ours

    def Pool(self, limit: int | None = None, **kwargs: object) -> ConnectionPool:
        return RidingPool(self, limit=limit, **kwargs)


class RidingPool(ConnectionPool):
    """kombu's connection pool, its connections naming the transport the pool's does."""

    def new(self) -> Connection:
        made: Connection = super().new()
        # kombu hands the transport on, but reads it again from a ``redis+socket://``
        # URL (the part before the ``+``): the pool's own decides. Not connected yet.
        made.transport_cls = self.connection.transport_cls
        return made
