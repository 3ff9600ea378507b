"""Script calls on a sync redis-py client, split in two: send now, read the reply later.

redis-py's command path (retry wrapper, observability hooks, reply callbacks) costs
about as much CPU as a loopback round trip itself. The lease's hot path (one script per
dispatch, per start, per release) writes EVALSHA straight to a pooled connection and
reads the reply off it. Splitting the call also lets a caller overlap the round trip
with its own work: Celery builds the message while Redis runs the script.

Anything unusual goes back through redis-py's own path, which retries connection
errors by the client's policy and reloads a script the server forgot (NOSCRIPT). That
is safe because every script gives the same answer when run twice for one token.
Clients this module cannot drive directly (cluster, single-connection, client-side
caching) always take redis-py's path.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

# The transport failures after which the command may or may not have run: the
# connection is dropped and the call retried through redis-py.
_TRANSPORT = (redis.ConnectionError, redis.TimeoutError, OSError)


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

    __slots__ = ("_encoding", "_local", "_named", "_pool", "direct")

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
        kwargs = getattr(pool, "connection_kwargs", {})
        self._encoding = kwargs.get("encoding", "utf-8")
        self._local = threading.local()

    def _checkout(self) -> tuple[Any, bool]:
        """(connection, whether it is this thread's own)."""
        local = self._local
        own = getattr(local, "conn", None)
        if own is not None and local.pid == os.getpid():
            if not local.busy:
                local.busy = True
                return own, True
        elif own is not None:
            local.conn = own = None  # inherited over fork: the parent's socket, never ours
        pool = self._pool
        conn = pool.get_connection("EVALSHA") if self._named else pool.get_connection()
        if own is None:
            local.conn, local.pid, local.busy = conn, os.getpid(), True
            return conn, True
        return conn, False

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

    def send(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Reply:
        """Write the call and return at once; ``Reply.get()`` reads the answer."""
        if not self.direct:
            return Reply(script(keys=keys, args=args))
        conn, own = self._checkout()
        try:
            command = pack(self._encoding, ("EVALSHA", script.sha, len(keys), *keys, *args))
            conn.send_packed_command([command], check_health=False)
        except _TRANSPORT:
            self._checkin(conn, own, broken=True)
            return Reply(script(keys=keys, args=args))
        except BaseException:
            self._checkin(conn, own, broken=True)
            raise
        reply = Reply()
        reply._pending = (self, conn, own, script, keys, args)
        return reply

    def call(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """One script call, one round trip."""
        return self.send(script, keys, args).get()


class Reply:
    """The answer to a sent script call, read from the connection on first ``get()``."""

    __slots__ = ("_error", "_pending", "_value")

    def __init__(self, value: Any = None) -> None:
        self._value = value
        self._error: BaseException | None = None
        self._pending: tuple[Wire, Any, bool, Script, Sequence[Any], Sequence[Any]] | None = None

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
    def _read(pending: tuple[Wire, Any, bool, Script, Sequence[Any], Sequence[Any]]) -> Any:
        # Every way out checks the connection back in exactly once.
        wire, conn, own, script, keys, args = pending
        try:
            value = conn.read_response()
        except NoScriptError:
            # A restarted or flushed server: redis-py loads the script and runs it.
            wire._checkin(conn, own)
            return script(keys=keys, args=args)
        except _TRANSPORT:
            wire._checkin(conn, own, broken=True)
            return script(keys=keys, args=args)
        except redis.ResponseError:
            wire._checkin(conn, own)  # the server answered; the connection is in step
            raise
        except BaseException:
            # Interrupted mid-read: the connection's state is unknown, never reuse it.
            wire._checkin(conn, own, broken=True)
            raise
        wire._checkin(conn, own)
        return value
