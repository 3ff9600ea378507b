"""``QuorumExtend``: Redlock leases extended on all masters at once, kept while a majority says so.

A lease is lost only once too many masters say it is gone for a majority to hold it; with
fewer answers than that, its renewal failed and is tried again within its time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from functools import partial

from ...exceptions import ConfigurationError, LockStoreUnavailableError
from ..lease import YIELDED, Lease, valid_until
from ..outcomes import LOSS, ExtendResult
from ..redis.store import RedisLock
from .quorum import Answers, Quorum


class QuorumExtend:
    """Extends of leases on ``nodes`` (a Redlock's masters), judged by ``quorum``."""

    def __init__(self, nodes: Sequence[RedisLock], quorum: Quorum, where: str) -> None:
        self.nodes = nodes
        self.quorum = quorum
        self.where = where  # the Redlock's, as its errors name it

    def extend_many(
        self, leases: Sequence[Lease], ttls: Sequence[int], *, timeout: float
    ) -> list[ExtendResult | Exception]:
        """Each lease extended to its ttl in ``ttls`` (ms), one pipelined round trip per
        master, all masters at once, their answers awaited up to ``timeout``."""
        sent_at = time.monotonic()
        copies = [lease.copy(ms / 1000) for lease, ms in zip(leases, ttls, strict=True)]
        answers = self.quorum.ask(
            [partial(node.extend_many, copies) for node in self.nodes],
            timeout=timeout,
            settled=lambda so_far: all(
                self.quorum.settles(so_far.column(index), _kept) for index in range(len(leases))
            ),
        )
        results: list[ExtendResult | Exception] = []
        for index, (lease, ttl_ms) in enumerate(zip(leases, ttls, strict=True)):
            results.append(self._extended(lease, ttl_ms, sent_at, answers.column(index)))
        return results

    def _extended(
        self, lease: Lease, ttl_ms: int, sent_at: float, answers: Answers[ExtendResult]
    ) -> ExtendResult | Exception:
        if answers.count(_kept) >= self.quorum.needed:
            lease.renewed(valid_until(sent_at, ttl_ms / 1000))
            if answers.count(lambda one: one is ExtendResult.CANCELLED):
                lease.mark_cancelled(YIELDED)
                return ExtendResult.CANCELLED
            return ExtendResult.EXTENDED
        gone = [one for one in answers.values() if not _kept(one)]
        if len(gone) > self.quorum.count - self.quorum.needed:
            result = Counter(gone).most_common(1)[0][0]
            lease.mark_lost(LOSS[result] + f" on {len(gone)} of {self.quorum.count} masters")
            return result
        # A majority may still hold it: a failed renewal, tried again within its time.
        for error in answers.errors():
            if isinstance(error, ConfigurationError):
                return error
        confirmed = answers.count(_kept)
        return LockStoreUnavailableError(
            f"renewal of {lease.key} confirmed by {confirmed} of {self.quorum.count} masters "
            f"of {self.where}, {self.quorum.needed} needed",
            name=lease.name,
            key=lease.key,
            url=self.where,
        )


def _kept(result: ExtendResult) -> bool:
    return result in (ExtendResult.EXTENDED, ExtendResult.CANCELLED)
