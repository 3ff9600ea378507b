"""``SentAcquire``: a Redis server's answer to an acquire, read when ``PendingAcquire`` asks."""

from __future__ import annotations

from typing import NoReturn, Protocol

from ..lease import Lease
from ..outcomes import Contended
from .calls import Response
from .common import REDIS_ERRORS, Call
from .replies import Reply


class _Store(Protocol):
    def outcome_of(self, call: Call, *, sent_at: float, reply: Response) -> Lease | Contended: ...

    def unavailable(self, error: Exception, name: str | None = None) -> NoReturn: ...


class SentAcquire:
    """The acquire script's reply on its way (``lease.pending.Answer``)."""

    __slots__ = ("_call", "_lock", "_reply", "_sent_at", "_within")

    def __init__(
        self, lock: _Store, call: Call, sent_at: float, reply: Reply, within: float | None = None
    ) -> None:
        self._lock = lock
        self._call = call
        self._sent_at = sent_at
        self._reply = reply
        self._within = within  # how long its answer may take (``Reply.get``)

    @property
    def name(self) -> str:
        return self._call.name

    @property
    def token(self) -> str:
        return self._call.token

    def lease_if_granted(self) -> Lease:
        return self._call.lease(fence=0, sent_at=self._sent_at)

    def read(self) -> Lease | Contended:
        try:
            reply = self._reply.get(within=self._within)
        except REDIS_ERRORS as error:
            self._lock.unavailable(error, self._call.name)
        return self._lock.outcome_of(self._call, sent_at=self._sent_at, reply=reply)
