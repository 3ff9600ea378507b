"""``PendingAcquire``: an acquire that was sent and whose answer is read later.

Its name is public and older than the glossary (docs/design.md, "Words"): "pending" there
means a call not yet started; an acquire not yet read is *unread*.
"""

from __future__ import annotations

from typing import Protocol

from .lease import Lease
from .outcomes import Contended


class Answer(Protocol):
    """A store's answer to one acquire, not read yet (on Redis: a reply on its way)."""

    @property
    def name(self) -> str: ...

    @property
    def token(self) -> str: ...

    def lease_if_granted(self) -> Lease:
        """The lease the acquire grants if the answer is yes (its fence not known yet)."""
        ...

    def read(self) -> Lease | Contended:
        """Read the answer (once): store errors raise here."""
        ...


class PendingAcquire:
    """An acquire that was sent and whose answer has not been read (``begin_try_acquire``).

    ``outcome()`` reads it once and returns the same ``Lease`` or ``Contended`` after.
    Read it even when no longer interested: it returns the pooled connection, and a
    ``Lease`` it grants holds the lock until released or expired.
    """

    __slots__ = ("_answer", "_outcome")

    def __init__(self, answer: Answer | None, *, outcome: Lease | Contended | None = None) -> None:
        self._answer = answer
        self._outcome = outcome

    @classmethod
    def settled(cls, outcome: Lease | Contended) -> PendingAcquire:
        """One whose answer is already known (stores without a wire, e.g. memory)."""
        return cls(None, outcome=outcome)

    def _sent(self) -> Answer:
        # Every unsettled one was made with its answer.
        assert self._answer is not None  # noqa: S101
        return self._answer

    @property
    def name(self) -> str:
        return self._sent().name if self._outcome is None else self._outcome.name

    @property
    def token(self) -> str:
        """The token the acquire asked the lock under."""
        if self._answer is None:
            assert self._outcome is not None  # noqa: S101  (a settled one)
            return self._outcome.token if isinstance(self._outcome, Lease) else ""
        return self._answer.token

    def lease_if_granted(self) -> Lease | None:
        """The lease this grants if the answer is yes, before it is read: to renew at once.

        None when the answer is known to be no. A fenced acquire's fence comes with the
        answer: until then this lease's ``fence`` is 0, good for renewing it, not
        for guarding a write (``outcome()`` has the fence). Renewing such a lease that
        was refused is harmless: its extend is owner-checked.
        """
        if self._outcome is not None:
            return self._outcome if isinstance(self._outcome, Lease) else None
        return self._sent().lease_if_granted()

    def outcome(self) -> Lease | Contended:
        if self._outcome is None:
            self._outcome = self._sent().read()
        return self._outcome
