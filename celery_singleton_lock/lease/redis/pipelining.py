"""Script calls split in two, send now and read later, on redis-py's public connection API.

The lease's hot path (one call per dispatch, per start, per release) writes a call and
returns: the caller does its own work while Redis runs the script (Celery builds the message),
or does not wait at all (``defer``). How, and what of redis-py's it keeps: ``Pipelining``.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from typing import Any

from redis.commands.core import Script
from redis.connection import Connection, ConnectionPool

from .. import history
from ..clock import SYSTEM_CLOCK, Clock
from . import recording
from .calls import (
    Acked,
    Arg,
    Asked,
    Batch,
    Command,
    Hold,
    Response,
    ScriptCall,
    SentCall,
    body,
)
from .clients import SyncClient
from .connections import FORKS_SEEN, drivable, pack, ready, takes_command_name
from .replies import TRANSPORT_ERRORS, Reply

logger = logging.getLogger(__name__)

# SET's options for a hold: only if the key is free, and say who holds it if not.
HOLD_OPTIONS = ("NX", "GET")

# A pool of at least this many connections lends one to the pipelining between calls: a
# smaller one (a client given with max_connections=1) needs every connection back.
SPARE_FROM = 8

# Answers owed (sent, unread) at most; past this the sender reads them at once, so a
# process whose threads only ever release still gives its connections back.
MAX_OWED = 16


class Pipelining:
    """Sends scripts for one client; ``direct`` is False when redis-py must do it all.

    A call takes a connection from the client's pool, writes the commands with
    ``Connection.send_packed_command`` and returns; ``Reply.get()`` reads the answers with
    ``Connection.read_response`` and puts the connection back. In between the caller does
    its own work, or does not wait at all (``defer``: a release at the end of a task,
    whose answer is read with the next call of any thread).

    Everything redis-py does for a connection still happens: its health check before a
    write, its handshake (AUTH, HELLO for RESP3, SELECT, credential providers), its parser
    (hiredis when installed, RESP2 and RESP3, push messages, ``decode_responses``). Only
    the per-command machinery (retry wrapper, reply callbacks) is skipped, and that is
    where a failure goes: after a transport error or a NOSCRIPT the call is made again
    through redis-py's ``Script``, which retries by the client's policy and reloads the
    script. That is safe because every call gives the same answer when run twice for one
    token. One connection is kept between calls (a pool with room to spare:
    ``SPARE_FROM``), so a process's next call skips the pool's lock and queue; every other
    connection goes back at once, so any number of short-lived threads or greenlets
    share the pool's few connections.
    """

    __slots__ = (
        "_encoding",
        "_generation",
        "_idle",
        "_named",
        "_owed",
        "_pool",
        "_recorded_scripts",
        "client",
        "clock",
        "direct",
        "holds",
        "holds_checked",
    )

    def __init__(self, client: SyncClient, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.client = client
        self.clock = clock  # when a call was sent, on the store's clock
        self._recorded_scripts: dict[str, Script] = {}  # by the digest of the script recorded
        self.direct = drivable(client)
        self._pool: ConnectionPool | None = client.connection_pool if drivable(client) else None
        self._named = self._pool is not None and takes_command_name(self._pool)
        kwargs = getattr(self._pool, "connection_kwargs", {})
        self._encoding = kwargs.get("encoding", "utf-8")
        # Whether the server takes SET with both NX and GET (Redis >= 7.0); learnt from
        # the first refusal, so older servers cost one extra round trip, once.
        self.holds = True
        # Whether a hold went through the script here once. The first one does: a user
        # the server will not let run scripts (an ACL without EVALSHA) is refused before
        # anything is written, rather than after a SET it could then not give back.
        self.holds_checked = False
        # (reply, then) pairs whose answers nobody waits for; any thread reads them
        # before its next call. A deque: append and popleft are atomic across threads.
        self._owed: collections.deque[tuple[Reply, Callable[[Response], object]]] = (
            collections.deque()
        )
        # The connection kept between calls (at most about one; a list: pop and append
        # are atomic across threads); None when the pool has no room to lend it.
        spare = getattr(self._pool, "max_connections", 0) >= SPARE_FROM
        self._idle: list[Connection] | None = [] if spare else None
        self._generation = FORKS_SEEN[0]

    # -- connections -------------------------------------------------------------------

    def _checkout(self) -> Connection:
        if self._generation != FORKS_SEEN[0]:
            self._forget_parent()
        if self._owed:
            # The connection of the answer read last serves this call: it is as free
            # as the pool would make it, a pool round (about 20 us on redis-py 8) sooner.
            kept = self._read_owed(keep=True)
            if kept is not None:
                return kept
        if self._idle:
            try:
                conn = self._idle.pop()
            except IndexError:
                pass  # another thread took it first
            else:
                return ready(conn)
        pool = self._pool
        if pool is None:
            raise _not_direct()
        return pool.get_connection("EVALSHA") if self._named else pool.get_connection()

    def checkin(self, conn: Connection, *, broken: bool = False) -> None:
        """Give ``conn`` back: kept for the next call, or to the pool. A ``broken`` one
        (disconnected by a failure) goes to the pool, which connects it only when it is
        lent again: kept, the next call would try to connect it twice over a dead link."""
        if self._pool is None:
            raise _not_direct()
        if not broken and self._idle is not None and not self._idle:
            self._idle.append(conn)
        else:
            self._pool.release(conn)

    def _forget_parent(self) -> None:
        """Inherited over fork: the parent's sockets and answers, never ours to use."""
        self._owed.clear()
        if self._idle:
            self._idle.clear()
        self._generation = FORKS_SEEN[0]

    def read_owed(self) -> None:
        """Read every owed answer now (their connections go back to the pool)."""
        self._read_owed(keep=False)

    def _read_owed(self, *, keep: bool) -> Connection | None:
        """Read every owed answer; with ``keep``, return the last one's connection
        instead of putting it back (None if there is none to hand over)."""
        if self._generation != FORKS_SEEN[0]:
            self._forget_parent()
            return None
        kept: list[Connection] = []
        while True:
            try:
                reply, then = self._owed.popleft()
            except IndexError:
                return kept[0] if kept else None
            for conn in kept:
                self.checkin(conn)
            kept.clear()
            _answer(reply, then, kept if keep else None)

    def defer(self, reply: Reply, then: Callable[[Response], object]) -> None:
        """Read ``reply`` later, before the next call of any thread, and hand it to ``then``.

        For answers nobody waits for (a release at the end of a task): the command is
        on its way already; reading its answer later saves the caller a round trip.
        Errors are logged, never raised into that later call.
        """
        if reply.answered:  # redis-py's path
            _answer(reply, then)
            return
        self._owed.append((reply, then))
        if len(self._owed) > MAX_OWED:
            self.read_owed()

    # -- calls -------------------------------------------------------------------------

    def send(
        self,
        script: Script,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        *,
        whole: bool = False,
        retry: bool = True,
        acks: tuple[int, int] | None = None,
        entry: history.Record | None = None,
        kind: history.Kind | None = None,
        question: Sequence[Arg] | None = None,
    ) -> Reply:
        """Write the call and return at once; ``Reply.get()`` reads the answer.

        ``whole`` sends the script's body (EVAL) instead of its digest: for a call whose
        answer is read later, since a server that does not know the script (restarted,
        flushed) would otherwise run nothing until that later read re-sends it.
        ``retry=False`` raises a transport error instead of retrying by the client's
        policy, whose backoff can outlast a lease: for renewals, which retry on their
        own schedule. ``acks=(replicas, timeout_ms)`` follows the call with ``WAIT`` on the
        same connection; the answer is then ``(reply, replicas that acknowledged)``.
        ``entry``: the history entry the call writes, in its own round trip, when the
        script is of a kind it names (``history.Record``); ``kind``: the kind of reply
        the script gives, for one the store's own table does not list. ``question``: a
        plain command written after the call, in the same write; the answer is then
        ``(reply, its reply)``.
        """
        if entry is not None and kind is None:
            kind = recording.KINDS.get(script.sha)
        spec = entry.spec(kind) if entry is not None and kind is not None else None
        if entry is not None and kind is not None and spec is not None:
            # The operation writes its history entry itself, in this round trip.
            script = self._recorded(script, kind)
            keys, args = [*keys, entry.key], [*args, spec]
        sent: SentCall = ScriptCall(self.client, script, keys, args, retry=retry)
        head = ("EVAL", body(script)) if whole else ("EVALSHA", script.sha)
        commands: list[Sequence[Arg]] = [(*head, len(keys), *keys, *args)]
        if acks is not None:
            sent = Acked(sent, acks)  # type: ignore[arg-type]
            commands.append(("WAIT", *acks))
        if question is not None:  # after a WAIT too: ((reply, replicas), its reply)
            sent = Asked(sent, question)  # type: ignore[arg-type]
            commands.append(question)
        if not self.direct:
            return Reply(sent.fallback())
        return self._send(commands, sent)

    def _recorded(self, script: Script, kind: history.Kind) -> Script:
        """``script`` writing a history entry (registered on this client once)."""
        found = self._recorded_scripts.get(script.sha)
        if found is None:
            found = self.client.register_script(recording.recorded(body(script), kind))
            self._recorded_scripts[script.sha] = found
        return found

    def send_hold(
        self, key: str, token: str, ttl_ms: int, fallback: Callable[[], Response]
    ) -> Reply:
        """The unfenced acquire (a queued message's hold) without a script: ``SET NX PX GET``
        and ``PTTL``, pipelined.

        Answers like the acquire script (``{1, 0}`` or ``{0, holder, pttl}``) at a tenth
        of its server time. ``fallback`` runs that script instead where the server is
        older than Redis 7.0 (NX with GET is a syntax error there; remembered) or the
        SET is refused for any other reason (a non-string value at the key).
        """
        if not (self.direct and self.holds and self.holds_checked):
            answer = fallback()
            self.holds_checked = True
            return Reply(answer)
        commands = (("SET", key, token, "PX", ttl_ms, *HOLD_OPTIONS), ("PTTL", key))
        return self._send(commands, Hold(token, fallback, self._old_server))

    def _old_server(self) -> None:
        self.holds = False

    def call(
        self,
        script: Script,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        *,
        retry: bool = True,
        acks: tuple[int, int] | None = None,
        entry: history.Record | None = None,
        kind: history.Kind | None = None,
        within: float | None = None,
    ) -> Response:
        """One script call, one round trip (its answer due ``within``: ``Reply.get``)."""
        sent = self.send(script, keys, args, retry=retry, acks=acks, entry=entry, kind=kind)
        return sent.get(within=within)

    def command(self, *args: Arg) -> Response:
        """One plain command (``GET``), one round trip: its reply, decoded as the client's."""
        sent = Command(self.client, args)
        if not self.direct:
            return sent.fallback()
        return self._send([args], sent).get()

    def timed(
        self, script: Script, keys: Sequence[Arg], args: Sequence[Arg], **options: Any
    ) -> tuple[Response, float]:
        """``call``, and when it was written (after any connecting): a ttl counts from then."""
        sent_at = self.clock.monotonic()
        reply = self.send(script, keys, args, **options)
        return reply.get(), reply.sent_at or sent_at

    def call_many(
        self, script: Script, calls: Sequence[tuple[Sequence[Arg], Sequence[Arg]]]
    ) -> list[Response]:
        """``script`` once per (keys, args), pipelined in one round trip, never retried.

        Each answer is the script's reply or the error the server gave for that call
        (NOSCRIPT for all of them on a server that forgot the script).
        """
        return self.call_commands(
            [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]
        )

    def call_commands(self, commands: Sequence[Sequence[Arg]]) -> list[Response]:
        """Commands (script calls or plain ones) written in one go and their replies read
        in order, never retried: each the reply or the error the server gave for it. A
        transport error raises, the connection dropped: each may or may not have run."""
        result: list[Response] = self._send(commands, Batch()).get()
        return result

    def _send(self, commands: Sequence[Sequence[Arg]], sent: SentCall) -> Reply:
        # redis-py leaves Connection's methods untyped (the ignores here and in _read).
        conn = self._checkout()
        try:
            # A new connection's handshake first (several round trips with redis-py's
            # HELLO and CLIENT SETINFO): a lease's ttl counts from the send, after it.
            conn.connect()  # type: ignore[no-untyped-call]
            sent_at = self.clock.monotonic()
            # Health-checks first when the connection has been idle long.
            conn.send_packed_command([b"".join(pack(self._encoding, c) for c in commands)])  # type: ignore[no-untyped-call]
        except TRANSPORT_ERRORS as error:
            self.checkin(conn, broken=True)  # redis-py has disconnected it
            return Reply(sent.after_transport_error(error))
        except BaseException:
            conn.disconnect()  # type: ignore[no-untyped-call]
            self.checkin(conn, broken=True)
            raise
        return Reply(unread=(self, conn, len(commands), sent), sent_at=sent_at)


def _not_direct() -> TypeError:
    return TypeError("this client takes redis-py's own path for every call (Pipelining.direct)")


def _answer(
    reply: Reply, then: Callable[[Response], object], keep: list[Connection] | None = None
) -> None:
    try:
        then(reply.get(keep))
    except Exception as error:  # the caller is long gone: say so, raise nothing
        logger.warning("a call whose answer was read later failed: %s", error)
