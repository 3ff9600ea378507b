"""A value offered to a lock's holder, kept only while that holder has the lock, taken once.

A later call that finds a pending call's hold held by the execution of that call (it
has started and waits for the key) cannot swap the message any more; it leaves its
arguments here instead, for that execution to run with.
"""

from __future__ import annotations

from dataclasses import dataclass

from .outcomes import text
from .redis import scripts
from .redis.common import REDIS_ERRORS
from .redis.store import RedisLock


@dataclass(frozen=True)
class Offered:
    """An offer's answer: kept, or who holds the lock instead ('' when it is free)."""

    kept: bool
    holder: str = ""


class Offers:
    """On a ``RedisLock`` (standalone, Sentinel or Cluster: the offer shares its lock's slot).

    ``offer`` keeps the value only while the holder named still holds the lock (one
    script), and ``take`` reads it once, after the holder let go of the lock: an offer
    either came before and is taken, or finds the holder gone and is not made, so none is
    lost. Offers are kept per holder (a hash beside the lock), so one to a later holder
    never replaces one not yet taken, and live as long again as the lock (renewed with
    it): the holder reads them just after it let go (or after a renewal that came late),
    and one that dies leaves none for long.
    """

    def __init__(self, store: RedisLock) -> None:
        self._store = store
        self._offer = store.client.register_script(scripts.OFFER)
        self._take = store.client.register_script(scripts.TAKE_OFFER)

    def offer(self, name: str, holder: str, value: bytes) -> Offered:
        """Keep ``value`` for ``holder`` of ``name``, if it holds it (twice the lock's ttl)."""
        keys = self._store.keys(name)
        try:
            reply = self._offer(keys=[keys.lock, keys.offer], args=[holder, value])
        except REDIS_ERRORS as error:
            self._store.unavailable(error, name)
        if int(reply[0]) == 1:
            return Offered(True)
        return Offered(False, text(reply[1]))

    def take(self, name: str, holder: str) -> bytes | None:
        """The value offered to ``holder`` of ``name``, once (None: none was)."""
        try:
            found = self._take(keys=[self._store.keys(name).offer], args=[holder])
        except REDIS_ERRORS as error:
            self._store.unavailable(error, name)
        if isinstance(found, str):  # a client with decode_responses=True
            return found.encode()
        return found if isinstance(found, bytes) else None


def offers_of(store: object) -> Offers | None:
    """The offers of ``store``, one Redis server; None on any other (a Redlock's masters
    cannot keep one value beside a lock: a later call gets the waiting execution's result
    as it is)."""
    return store.helper(Offers) if isinstance(store, RedisLock) else None


__all__ = ["Offered", "Offers", "offers_of"]
