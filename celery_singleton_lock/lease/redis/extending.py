"""``Extending``: a one-server store's extends, one lease's or a node's batch in one round trip.

What the renewer asks of ``RedisLock`` (``renewal.Extender``: ``extend_many`` and ``lane``),
with the ``extend`` a caller makes itself; ``RedisLock`` is built on it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from redis.cluster import RedisCluster
from redis.commands.core import Script

from ...exceptions import SingletonLockError
from ..errors import store_error
from ..lease import Lease
from ..outcomes import ExtendResult
from .calls import Arg
from .clients import SyncClient
from .common import REDIS_ERRORS, LockBase
from .pipelining import Pipelining
from .replicas import acknowledged


class Extending(LockBase[SyncClient, Script]):
    """A lease's ttl reset while it still owns the lock: one, or a batch for the renewer."""

    # Set by the store as it is made (``RedisLock.__init__``).
    pipelining: Pipelining
    replicas: tuple[int, int] | None

    def extend(
        self, lease: Lease, ttl: object | None = None, *, retry: bool = True
    ) -> ExtendResult:
        """Reset the lease's TTL to ``ttl`` (default: its own) if it still owns the lock.

        ``retry=False``: a transport error is not retried by the client's policy (the
        renewer retries on its own schedule, within the lease's time).
        """
        keys, ttl_ms = self._extend_call(lease, ttl)
        try:
            reply, sent_at = self.pipelining.timed(
                self._extend_script,
                keys,
                [lease.token, ttl_ms],
                retry=retry,
                acks=self.replicas,
            )
        except REDIS_ERRORS as error:
            self.unavailable(error, lease.name)
        if self.replicas is not None:
            # Too few acknowledgements: a failed renewal (retried), never a longer lease.
            reply = acknowledged(
                reply, self.replicas, where=self.where, name=lease.name, key=lease.key
            )
        return self._extended(lease, ttl_ms, sent_at, reply)

    def extend_many(self, leases: Sequence[Lease]) -> list[ExtendResult | Exception]:
        """``extend`` each lease (its own ttl), in one round trip where the client allows.

        For the renewer: nothing is retried by the client's policy (the renewer retries
        on its own schedule, within the leases' time), and a store error is returned in
        the lease's place, not raised.
        """
        if len(leases) == 1 or not self.pipelining.direct or self.replicas is not None:
            return [self._renew_one(lease) for lease in leases]
        calls = [(lease, *self._extend_call(lease, None)) for lease in leases]
        sent_at = self.clock.monotonic()
        argv: list[tuple[list[Arg], list[Arg]]] = [
            (list(keys), [lease.token, ttl_ms]) for lease, keys, ttl_ms in calls
        ]
        try:
            replies = self.pipelining.call_many(self._extend_script, argv)
        except REDIS_ERRORS as error:
            return [store_error(error, where=self.where)] * len(leases)
        results: list[ExtendResult | Exception] = []
        for (lease, _, ttl_ms), reply in zip(calls, replies, strict=True):
            if isinstance(reply, Exception):
                # NOSCRIPT (a restarted server) and the like: that lease alone goes again
                # through the single-call path, which knows each of them.
                results.append(self._renew_one(lease))
            else:
                results.append(self._extended(lease, ttl_ms, sent_at, reply))
        return results

    def _renew_one(self, lease: Lease) -> ExtendResult | Exception:
        try:
            return self.extend(lease, retry=False)
        except SingletonLockError as error:
            return error

    def lane(self, lease: Lease) -> Hashable:
        """Which node serves ``lease`` (renewals of one node share a round trip)."""
        if isinstance(self.client, RedisCluster):
            return str(self.client.get_node_from_key(lease.key).name)  # type: ignore[no-untyped-call]
        return None
