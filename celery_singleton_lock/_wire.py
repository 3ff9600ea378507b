"""Script calls on a sync redis-py client, split in two: send now, read the reply later.

redis-py's command path (retry wrapper, observability hooks, reply callbacks) costs
about as much CPU as a loopback round trip itself. The lease's hot path (one call per
dispatch, per start, per release) writes its commands straight to a pooled connection
and reads the replies off the socket with a small RESP reader. Splitting the call also
lets a caller overlap the round trip with its own work (Celery builds the message while
Redis runs the script), or not wait at all (``defer``: a release at the end of a task,
whose answer is read with the thread's next call).

A queued message's hold needs no script: ``SET NX PX GET`` with ``PTTL`` answers the
same question at a tenth of the server time, on Redis 7.0 and later.

Anything unusual goes back through redis-py's own path, which retries connection
errors by the client's policy and reloads a script the server forgot (NOSCRIPT). That
is safe because every call gives the same answer when run twice for one token.
Clients this module cannot drive directly (cluster, single-connection, client-side
caching) always take redis-py's path.
"""

from __future__ import annotations

import inspect
import logging
import os
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis._parsers.base import BaseParser
from redis.commands.core import Script
from redis.exceptions import NoScriptError

# The transport failures after which the command may or may not have run: the
# connection is dropped and the call retried through redis-py.
_TRANSPORT = (redis.ConnectionError, redis.TimeoutError, OSError)


logger = logging.getLogger(__name__)

# SET's options for a hold: only if the key is free, and say who holds it if not.
HOLD_OPTIONS = ("NX", "GET")


def _takes_command_name(pool: Any) -> bool:
    # redis-py < 5.3 requires get_connection(command_name); later versions warn on it.
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def pack(encoding: str, args: Sequence[Any]) -> bytes:
    """One command in RESP, for str, bytes and int arguments (all the scripts take)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode(encoding)
        elif isinstance(arg, bytes):
            data = arg
        else:
            data = b"%d" % arg
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class Wire:
    """Sends scripts for one client; ``direct`` is False when redis-py must do it all.

    Each thread keeps one connection of the client's pool checked out for itself, so a
    call costs no pool bookkeeping; a thread whose connection is waiting on a reply
    borrows another from the pool for the nested call.
    """

    __slots__ = ("_encoding", "_local", "_named", "_pool", "direct", "holds")

    def __init__(self, client: Any) -> None:
        pool = getattr(client, "connection_pool", None)
        self.direct = (
            isinstance(client, redis.Redis)
            and getattr(client, "connection", None) is None
            and pool is not None
            and getattr(pool, "cache", None) is None
        )
        self._pool: Any = pool
        self._named = self.direct and _takes_command_name(pool)
        # Whether the server takes SET with both NX and GET (Redis >= 7.0); learnt from
        # the first refusal, so older servers cost one extra round trip, once.
        self.holds = True
        kwargs = getattr(pool, "connection_kwargs", {})
        self._encoding = kwargs.get("encoding", "utf-8")
        self._local = threading.local()

    def _checkout(self) -> tuple[Any, bool]:
        """(connection, whether it is this thread's own)."""
        local = self._local
        own = getattr(local, "conn", None)
        if own is not None and local.pid == os.getpid():
            if local.deferred:  # answers owed on this or borrowed connections: free them
                self._read_deferred()
            if not local.busy:
                local.busy = True
                return own, True
        elif own is not None:
            # Inherited over fork: the parent's socket and its unread answers, never ours.
            local.conn = own = None
            local.deferred = []
        pool = self._pool
        conn = pool.get_connection("EVALSHA") if self._named else pool.get_connection()
        if own is None:
            local.conn, local.pid, local.busy = conn, os.getpid(), True
            local.deferred = getattr(local, "deferred", [])
            return conn, True
        return conn, False

    def defer(self, reply: Reply, then: Callable[[Any], object]) -> None:
        """Read ``reply`` later, before this thread's next call, and hand it to ``then``.

        For answers nobody waits for (a release at the end of a task): the command
        is on its way already; reading its answer with the next call on the connection
        saves the caller a round trip. Errors are logged, never raised into that call.
        """
        if reply._pending is None:  # answered already (redis-py's path)
            self._answer(reply, then)
        else:
            self._local.deferred.append((reply, then))

    def _read_deferred(self) -> None:
        deferred, self._local.deferred = self._local.deferred, []
        for reply, then in deferred:
            self._answer(reply, then)

    @staticmethod
    def _answer(reply: Reply, then: Callable[[Any], object]) -> None:
        try:
            then(reply.get())
        except Exception as error:  # the caller is long gone: say so, raise nothing
            logger.warning("a call whose answer was read later failed: %s", error)

    def _checkin(self, conn: Any, own: bool, *, broken: bool = False) -> None:
        if broken:
            conn.disconnect()
        if own:
            self._local.busy = False
            if broken:
                self._local.conn = None
                self._pool.release(conn)
        else:
            self._pool.release(conn)

    def send(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], *, whole: bool = False
    ) -> Reply:
        """Write the call and return at once; ``Reply.get()`` reads the answer.

        ``whole`` sends the script's body (EVAL) instead of its digest: for a call whose
        answer is read later, since a server that does not know the script (restarted,
        flushed) would otherwise run nothing until that later read re-sends it.
        """
        exchange = _ScriptCall(script, keys, args)
        if not self.direct:
            return Reply(exchange.fallback())
        head = ("EVAL", script.script) if whole else ("EVALSHA", script.sha)
        return self._send(((*head, len(keys), *keys, *args),), exchange)

    def send_hold(self, key: str, token: str, ttl_ms: int, fallback: Callable[[], Any]) -> Reply:
        """The unfenced acquire without a script: ``SET NX PX GET`` and ``PTTL``, pipelined.

        Answers like the acquire script (``{1, 0}`` or ``{0, holder, pttl}``) at a tenth
        of its server time. ``fallback`` runs that script instead where the server is
        older than Redis 7.0 (NX with GET is a syntax error there; remembered) or the
        SET is refused for any other reason (a non-string value at the key).
        """
        if not (self.direct and self.holds):
            return Reply(fallback())
        commands = (("SET", key, token, "PX", ttl_ms, *HOLD_OPTIONS), ("PTTL", key))
        return self._send(commands, _Hold(self, token, fallback))

    def _send(self, commands: Sequence[Sequence[Any]], exchange: _Exchange) -> Reply:
        conn, own = self._checkout()
        try:
            if conn._sock is None:
                conn.connect()  # redis-py's handshake (AUTH, HELLO, SELECT) on its parser
            sock = conn._sock
            _write(sock, b"".join(pack(self._encoding, command) for command in commands))
        except _TRANSPORT:
            self._checkin(conn, own, broken=True)
            return Reply(exchange.fallback())
        except BaseException:
            self._checkin(conn, own, broken=True)
            raise
        reply = Reply()
        reply._pending = (self, conn, own, sock, len(commands), exchange)
        return reply

    def call(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """One script call, one round trip."""
        return self.send(script, keys, args).get()


class _Exchange:
    """How to finish a sent call: turn its replies into the answer, or go back to
    redis-py's path (``fallback``, the same answer) after a transport error or an error
    reply it ``rescues``."""

    __slots__ = ()

    def fallback(self) -> Any:
        raise NotImplementedError

    def rescues(self, error: redis.ResponseError) -> bool:
        raise NotImplementedError

    def convert(self, replies: list[Any]) -> Any:
        raise NotImplementedError


class _ScriptCall(_Exchange):
    __slots__ = ("args", "keys", "script")

    def __init__(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
        self.script, self.keys, self.args = script, keys, args

    def fallback(self) -> Any:
        return self.script(keys=self.keys, args=self.args)

    def rescues(self, error: redis.ResponseError) -> bool:
        # NOSCRIPT (a restarted or flushed server): redis-py loads the script and runs it.
        return isinstance(error, NoScriptError)

    def convert(self, replies: list[Any]) -> Any:
        return replies[0]


class _Hold(_Exchange):
    __slots__ = ("_fallback", "held", "token", "wire")

    def __init__(self, wire: Wire, token: str, fallback: Callable[[], Any]) -> None:
        self.wire, self.token, self._fallback = wire, token, fallback
        self.held = token.encode(wire._encoding)

    def fallback(self) -> Any:
        return self._fallback()

    def rescues(self, error: redis.ResponseError) -> bool:
        if "syntax" in str(error).lower():
            self.wire.holds = False
        return True

    def convert(self, replies: list[Any]) -> list[Any]:
        current, pttl = replies
        if current is None or current in (self.held, self.token):  # own: a retried call
            return [1, 0]
        return [0, current, 0 if pttl == -2 else pttl]  # -2: gone since the SET


class Reply:
    """The answer to a sent script call, read from the connection on first ``get()``."""

    __slots__ = ("_error", "_pending", "_value")

    def __init__(self, value: Any = None) -> None:
        self._value = value
        self._error: BaseException | None = None
        self._pending: _Pending | None = None

    def get(self) -> Any:
        """The script's reply, or what the call raised (every time it is asked)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            try:
                self._value = self._read(pending)
            except BaseException as error:
                self._error = error
                raise
        if self._error is not None:
            raise self._error
        return self._value

    @staticmethod
    def _read(pending: _Pending) -> Any:
        # Every way out checks the connection back in exactly once. The replies are read
        # straight off the socket: redis-py's parser never holds unread bytes between
        # replies, and anything unexpected (a push message, bytes beyond the replies)
        # drops the connection and asks again through redis-py.
        wire, conn, own, sock, count, exchange = pending
        try:
            replies = _receive(sock, count)
        except (*_TRANSPORT, _OutOfStep):
            wire._checkin(conn, own, broken=True)
            return exchange.fallback()
        except BaseException:
            # Interrupted mid-read: the connection's state is unknown, never reuse it.
            wire._checkin(conn, own, broken=True)
            raise
        wire._checkin(conn, own)
        for value in replies:
            if isinstance(value, _ErrorReply):
                error = BaseParser.parse_error(value.message)  # type: ignore[no-untyped-call]
                if exchange.rescues(error):
                    return exchange.fallback()
                raise error
        return exchange.convert(replies)


_Pending = tuple[Wire, Any, bool, Any, int, "_Exchange"]


class _OutOfStep(Exception):
    """The bytes on the connection are not the replies asked for."""


class _Incomplete(Exception):
    """More bytes are needed to finish a reply."""


class _ErrorReply:
    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _write(sock: Any, data: bytes) -> None:
    # A socket with a timeout (ours have one) makes Python poll() before every send and
    # recv: a system call more each way, per round trip. Its descriptor is non-blocking,
    # so try the call itself first and wait, within the timeout, only if it would block.
    # TLS sockets keep their own path (their bytes are not the descriptor's).
    if not isinstance(sock, ssl.SSLSocket):
        try:
            sent = os.write(sock.fileno(), data)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
    sock.sendall(data)


def _read_some(sock: Any) -> bytes:
    if not isinstance(sock, ssl.SSLSocket):
        try:
            return os.read(sock.fileno(), 65536)
        except BlockingIOError:
            pass  # not here yet: wait for it within the socket's timeout
    return bytes(sock.recv(65536))


def _receive(sock: Any, count: int) -> list[Any]:
    """Read exactly ``count`` replies from ``sock``."""
    data = b""
    while True:
        chunk = _read_some(sock)
        if not chunk:
            raise redis.ConnectionError("the server closed the connection")
        data += chunk
        try:
            replies, end = [], 0
            for _ in range(count):
                value, end = _parse(data, end)
                replies.append(value)
        except _Incomplete:
            continue
        if end != len(data):
            raise _OutOfStep
        return replies


def _parse(data: bytes, start: int) -> tuple[Any, int]:
    """One RESP2/RESP3 reply of the kinds scripts and SET/PTTL give, from ``start``."""
    end = data.find(b"\r\n", start)
    if end < 0:
        raise _Incomplete
    kind, line, after = data[start], data[start + 1 : end], end + 2
    if kind == 36:  # '$' bulk string
        size = int(line)
        if size < 0:
            return None, after
        if len(data) < after + size + 2:
            raise _Incomplete
        return data[after : after + size], after + size + 2
    if kind == 42:  # '*' array
        items = []
        for _ in range(int(line)):
            item, after = _parse(data, after)
            items.append(item)
        return items, after
    simple = _ONE_LINE.get(kind)
    if simple is None:
        raise _OutOfStep  # a push message or a type no call here asks for
    return simple(line), after


# The replies that fit on their first line: ':' integer, '+' simple string, '-' error,
# '_' RESP3 null.
_ONE_LINE: dict[int, Callable[[bytes], Any]] = {
    58: int,
    43: bytes,
    45: lambda line: _ErrorReply(line.decode("utf-8", "replace")),
    95: lambda _: None,
}
