"""Holds of many names decided together: one script call for a whole batch, on one server."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from redis.cluster import RedisCluster

from ..exceptions import SingletonLockError
from .lease import Lease
from .outcomes import Contended
from .redis import scripts
from .redis.calls import Arg
from .redis.common import REDIS_ERRORS
from .redis.store import RedisLock
from .takeover import HOLD

# Names decided per script call at most: a script blocks the server while it runs, and
# 5,000 holds take it a few milliseconds. A larger batch is one call per 5,000.
CHUNK = 5000


@dataclass(frozen=True)
class HoldSpec:
    """One hold of a batch: ``name`` for ``ttl`` seconds, as ``token`` (unfenced)."""

    name: str
    ttl: float
    token: str


class BatchHolds:
    """Holds taken together on a ``RedisLock`` of one server (standalone, Sentinel,
    ``memory://``): each name held for its token, or its holder reported, in one script
    (``hold_many.lua``), so a batch of N dispatches costs one round trip, not N.

    Unfenced, like every dispatch's hold: a hold only keeps duplicates out; the run that
    takes it over is fenced. A name held by the very token asked counts as held, so a
    retried call whose reply was lost gets the same answers."""

    def __init__(self, store: RedisLock) -> None:
        self._store = store
        self._script = store.client.register_script(scripts.HOLD_MANY)

    def hold(self, holds: Sequence[HoldSpec]) -> list[Lease | Contended]:
        """Take each of ``holds`` (names distinct): one ``Lease`` or ``Contended`` each,
        in order; one script call per ``CHUNK`` of them. Raises
        ``LockStoreUnavailableError`` when the server cannot be asked (then nothing of
        that chunk is known to be held: the chunks before it are given back)."""
        answers: list[Lease | Contended] = []
        for start in range(0, len(holds), CHUNK):
            try:
                answers.extend(self._hold(holds[start : start + CHUNK]))
            except BaseException:
                for taken in answers:
                    if isinstance(taken, Lease):  # (one not given back runs out by its ttl)
                        with contextlib.suppress(SingletonLockError):
                            self._store.release(taken)
                raise
        return answers

    def _hold(self, holds: Sequence[HoldSpec]) -> list[Lease | Contended]:
        store = self._store
        calls = [
            store.acquire_request(one.name, one.ttl, token=one.token, take=HOLD)[0] for one in holds
        ]
        keys: list[Arg] = [call.keys.lock for call in calls]
        args: list[Arg] = []
        for call in calls:
            args.extend((call.token, call.ttl_ms))
        sent_at = store.clock.monotonic()
        try:
            replies = store.pipelining.call(self._script, keys, args)
        except REDIS_ERRORS as error:
            store.unavailable(error, calls[0].name)
        return [
            store.acquired(call, sent_at=sent_at, reply=reply)
            for call, reply in zip(calls, replies, strict=True)
        ]


def batch_holds_of(store: object) -> BatchHolds | None:
    """The batch holds of ``store``; None where one script cannot see every key: a
    Cluster (the keys of a batch fall in many slots), a Redlock of several masters, or a
    store that waits for replicas after each write (the caller then holds one by one)."""
    if not isinstance(store, RedisLock) or store.replicas is not None:
        return None
    if isinstance(store.client, RedisCluster):
        return None
    return store.helper(BatchHolds)


__all__ = ["CHUNK", "BatchHolds", "HoldSpec", "batch_holds_of"]
