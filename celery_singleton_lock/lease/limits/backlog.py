"""How many calls may wait for a name at once (``max_pending``): a place each, left as it runs.

A key bound by a rate or a limit queues every call; without a cap its backlog grows
without bound in the broker. Here each call takes a place before it is published (refused,
nothing sent, when ``cap`` calls wait already) and leaves it as its run starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..redis import scripts
from ..redis.common import REDIS_ERRORS
from ..redis.store import RedisLock, one_server


@dataclass(frozen=True)
class Place:
    """A call's answer: let in, how many wait with it, and when to try again if not."""

    taken: bool
    waiting: int
    retry_after: float = 0.0  # seconds until the first place frees by itself, at the latest


class Backlog:
    """On a ``RedisLock`` (standalone, Sentinel or Cluster: one key per name).

    A call that never starts (its message lost, revoked) frees its place by itself after
    ``ttl`` seconds, renewed each time it is sent round again (a deferral, a requeue), so
    the count never stays too high for long and is never too low.
    """

    BATCH = 500  # places renewed in one round trip

    def __init__(self, store: RedisLock) -> None:
        self._store = store
        self._enter = store.client.register_script(scripts.BACKLOG_ENTER)

    def enter(self, name: str, call: str, cap: int, ttl: float) -> Place:
        """Take a place for ``call`` among the calls waiting for ``name`` (or keep its
        own, renewed), in one script; refused when ``cap`` wait already."""
        return self._ask(name, call, cap, ttl, "enter")

    def _ask(self, name: str, call: str, cap: int, ttl: float, how: str) -> Place:
        key = self._store.keys(name).backlog
        try:
            reply = self._enter(keys=[key], args=[call, cap, max(1, round(ttl * 1000)), how])
        except REDIS_ERRORS as error:
            self._store.unavailable(error, name)
        taken, waiting, *rest = (int(part) for part in reply)
        return Place(bool(taken), waiting, rest[0] / 1000 if rest else 0.0)

    def renew(self, name: str, call: str, ttl: float) -> None:
        """``call`` is sent round again (deferred, requeued): it keeps its place for
        ``ttl`` more seconds (back in line if its place had run out: it is not dropped)."""
        self._ask(name, call, 0, ttl, "renew")  # on the server's clock, in one script

    def renew_all(self, places: Sequence[tuple[str, str]], ttl: float) -> None:
        """Each ``(name, call)`` of ``places`` keeps its place ``ttl`` more seconds, as
        ``renew``, pipelined ``BATCH`` at a time: the calls waiting for their turn of a
        total are renewed together, not one round trip each."""
        ttl_ms = max(1, round(ttl * 1000))
        client = self._store.client
        for start in range(0, len(places), self.BATCH):
            try:
                with client.pipeline(transaction=False) as pipe:
                    for name, call in places[start : start + self.BATCH]:
                        key = self._store.keys(name).backlog
                        self._enter(keys=[key], args=[call, 0, ttl_ms, "renew"], client=pipe)
                    pipe.execute()
            except REDIS_ERRORS as error:
                self._store.unavailable(error)

    def leave(self, name: str, call: str) -> None:
        """``call``'s run starts: its place is free."""
        try:
            self._store.client.zrem(self._store.keys(name).backlog, call)
        except REDIS_ERRORS as error:
            self._store.unavailable(error, name)

    def waiting(self, name: str) -> int:
        """How many calls wait for ``name`` now (expired places included until the next
        ``enter`` drops them)."""
        try:
            return int(self._store.client.zcard(self._store.keys(name).backlog))
        except REDIS_ERRORS as error:
            self._store.unavailable(error, name)


def backlog_of(store: object) -> Backlog:
    """The backlogs of ``store`` (one Redis server: a Redlock refused), made once."""
    return one_server(store, "max_pending", "one count", "for tasks with max_pending").helper(
        Backlog
    )


__all__ = ["Backlog", "Place", "backlog_of"]
