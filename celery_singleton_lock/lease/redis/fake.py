"""An in-process fakeredis server whose time is a store's clock: expiries and ``TIME`` alike.

fakeredis runs the store's Lua through lupa. Imported only by ``memory`` when a
``memory://`` store is made: fakeredis is the ``memory`` extra, not a dependency.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import fakeredis
from fakeredis._core import Database  # the one place a server's time is read
from fakeredis._socket import FakeSocket


class _ClockedDatabase(Database):
    """A fakeredis database that reads the time off ``now`` (seconds since the epoch)."""

    def __init__(self, lock: Any, now: Callable[[], float]) -> None:
        self.now = now
        super().__init__(lock)

    @property
    def time(self) -> float:
        return self.now()

    @time.setter
    def time(self, value: float) -> None:
        # fakeredis stamps the machine's time before each command: the clock wins.
        pass

    def expired(self, item: Any) -> bool:
        # Gone at its expiry's very instant (fakeredis keeps it then): a ManualClock
        # advanced by exactly a ttl frees the lock.
        return item.expireat is not None and item.expireat <= self.time


class _ClockedSocket(FakeSocket):
    now: Callable[[], float]

    def time(self) -> list[bytes]:
        """``TIME`` on the store's clock (the rate and idempotency scripts read it)."""
        micros = round(self.now() * 1_000_000)
        return [str(micros // 1_000_000).encode(), str(micros % 1_000_000).encode()]


def fake_client(now: Callable[[], float], on_write: Callable[[], None]) -> fakeredis.FakeRedis:
    """A client of a new in-process server counting time on ``now``; ``on_write`` is
    called (under the server's lock) after each write, so a waiter can look again."""
    server = fakeredis.FakeServer(version=(7,))

    def database() -> Database:
        made = _ClockedDatabase(server.lock, now)
        made.add_change_callback(on_write)
        return made

    server.dbs = defaultdict(database)

    class Connection(fakeredis.FakeRedisConnection):
        def _connect(self) -> FakeSocket:  # redis-py's hook for how a connection connects
            sock = super()._connect()
            sock.__class__ = _ClockedSocket  # adds TIME on the clock, nothing else
            clocked: _ClockedSocket = sock  # type: ignore[assignment]
            clocked.now = now
            return clocked

    return fakeredis.FakeRedis(
        server=server, connection_class=Connection, socket_timeout=None, decode_responses=False
    )
