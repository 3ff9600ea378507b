"""``PendingAcquire``: an acquire that was sent and whose answer is read later."""

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


class PendingAcquire:
    """An acquire that was sent and whose answer has not been read (``begin_try_acquire``).

    ``outcome()`` reads it once and returns the same ``Lease`` or ``Contended`` after.
    Read it even when no longer interested: it returns the pooled connection, and a
    ``Lease`` it grants holds the lock until released or expired.
    """

    __slots__ = ("_call", "_lock", "_outcome", "_reply", "_sent_at")

    def __init__(
        self,
        lock: _Store | None,
        call: Call | None,
        sent_at: float,
        reply: Reply | None,
        *,
        outcome: Lease | Contended | None = None,
    ) -> None:
        self._lock = lock
        self._call = call
        self._sent_at = sent_at
        self._reply = reply
        self._outcome = outcome

    @classmethod
    def settled(cls, outcome: Lease | Contended) -> PendingAcquire:
        """One whose answer is already known (stores without a wire, e.g. memory)."""
        return cls(None, None, 0.0, None, outcome=outcome)

    def _sent(self) -> tuple[_Store, Call, Reply]:
        # Every unsettled one was made with its store, call and reply.
        assert self._lock is not None  # noqa: S101
        assert self._call is not None  # noqa: S101
        assert self._reply is not None  # noqa: S101
        return self._lock, self._call, self._reply

    @property
    def name(self) -> str:
        return self._sent()[1].name if self._outcome is None else self._outcome.name

    @property
    def token(self) -> str:
        """The token the acquire asked the lock under."""
        if self._call is None:
            assert self._outcome is not None  # noqa: S101  (a settled one)
            return self._outcome.token if isinstance(self._outcome, Lease) else ""
        return self._call.token

    def lease_if_granted(self) -> Lease | None:
        """The lease this grants if the answer is yes, before it is read: to renew at once.

        None when the answer is known to be no. A fenced acquire's fence comes with the
        answer: until then this lease's ``fence`` is 0, good for renewing it, not
        for guarding a write (``outcome()`` has the fence). Renewing such a lease that
        was refused is harmless: its extend is owner-checked.
        """
        if self._outcome is not None:
            return self._outcome if isinstance(self._outcome, Lease) else None
        return self._sent()[1].lease(fence=0, sent_at=self._sent_at)

    def outcome(self) -> Lease | Contended:
        if self._outcome is None:
            lock, call, sent = self._sent()
            try:
                reply = sent.get()
            except REDIS_ERRORS as error:
                lock.unavailable(error, call.name)
            self._outcome = lock.outcome_of(call, sent_at=self._sent_at, reply=reply)
        return self._outcome
