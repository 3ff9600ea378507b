"""A sent call's answer (``Reply``), read from its connection the first time it is asked.

``pipelining.Pipelining`` writes a call and returns a ``Reply`` at once: the caller does its
own work while the server answers.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias

import redis
from redis.connection import Connection

from .calls import Response, SentCall

# The transport failures after which the command may or may not have run: redis-py has
# dropped the connection, and the call is made again through its retrying path.
TRANSPORT_ERRORS = (redis.ConnectionError, redis.TimeoutError)

# How long an answer may take to arrive (past a BLPOP's own timeout: waits.py) on a
# client with no read timeout, a busy server or a slow link, before the server counts
# as unreachable.
GRACE = 2.0


class Unanswered(redis.TimeoutError):
    """No answer within the bound a read was given (the server froze or was cut off)."""


class Lender(Protocol):
    """Where a connection goes back once a call's replies are read."""

    def checkin(self, conn: Connection, *, broken: bool = False) -> None: ...


# (where the connection goes back, the connection, replies due, how the call finishes)
Unread: TypeAlias = tuple[Lender, Connection, int, SentCall]


class Reply:
    """The answer to a sent call, read from its connection on first ``get()``.

    Reading takes the call's replies off the connection, gives the connection back (or to
    the next call) and lets the call's ``SentCall`` turn the replies into the answer, or
    go again through redis-py's own path after a transport error.
    """

    __slots__ = ("_error", "_unread", "_value", "sent_at")

    def __init__(
        self,
        value: Response = None,
        *,
        unread: Unread | None = None,
        sent_at: float | None = None,
    ) -> None:
        self._value = value
        self._error: BaseException | None = None
        self._unread = unread  # (pipelining, connection, replies due, sent call) until read
        # When the call was written to a connected socket (monotonic); None when it went
        # redis-py's own way, whose connecting the caller's own clock reading covers.
        self.sent_at = sent_at

    @property
    def answered(self) -> bool:
        """Whether the answer is in (read already, or known when it was made)."""
        return self._unread is None

    def get(self, keep: list[Connection] | None = None, within: float | None = None) -> Response:
        """The call's answer, or what it raised (every time it is asked).

        ``keep``: a list that takes the connection once its replies are read, instead of
        the pool (the pipelining hands it to its next call). ``within``: seconds the
        answer may take to start arriving; past them the connection is dropped and
        ``redis.TimeoutError`` raised (for a client with no read timeout of its own).
        """
        if self._unread is not None:
            unread, self._unread = self._unread, None
            try:
                self._value = _read(unread, keep, within)
            except BaseException as error:
                self._error = error
                raise
        if self._error is not None:
            raise self._error
        return self._value


def _read(
    unread: Unread, keep: list[Connection] | None = None, within: float | None = None
) -> Response:
    # Every way out checks the connection back in exactly once, and only after all of
    # the call's replies were read: an error reply in the middle leaves the rest on the
    # wire, which the next user of the connection would take for its own.
    lender, conn, count, sent = unread
    replies: list[Response] = []
    answered = True
    try:
        answered = within is None or conn.can_read(timeout=within)
        for _ in range(count if answered else 0):
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as refused:
                replies.append(refused)
    except TRANSPORT_ERRORS as failed:
        # redis-py disconnects on most, not on a LOADING reply (a ConnectionError too),
        # which would leave the call's other replies on the wire.
        conn.disconnect()  # type: ignore[no-untyped-call]
        lender.checkin(conn, broken=True)
        return sent.after_transport_error(failed)
    except BaseException:
        # Interrupted mid-read: the connection's state is unknown, never reuse it.
        conn.disconnect()  # type: ignore[no-untyped-call]
        lender.checkin(conn, broken=True)
        raise
    if not answered:
        # Not a transport error to retry on: a frozen server would keep the retry waiting for
        # ever too. The call may or may not have run; the caller says so.
        conn.disconnect()  # type: ignore[no-untyped-call]
        lender.checkin(conn, broken=True)
        raise Unanswered(f"a call unanswered after {within:g}s")
    if keep is None:
        lender.checkin(conn)
    else:
        keep.append(conn)  # in step: every reply of the call has been read
    return sent.finish(replies)
