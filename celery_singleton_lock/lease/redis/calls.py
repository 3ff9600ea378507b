"""How each kind of sent call finishes: its replies become the answer, or redis-py runs it again.

A call goes again through redis-py's own path (``fallback``) after a transport error or an
error reply it knows how to rescue (NOSCRIPT, an old server's syntax error). Replies are
``Response`` (redis-py reads them untyped); each call's ``convert`` knows their shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeAlias

import redis
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

from .clients import AsyncClient, SyncClient

# A key or argument of a call we send (``pipelining.pack`` writes exactly these).
Arg: TypeAlias = "str | bytes | int"
# A reply as redis-py's parser returns it (bytes, int, None, a list of them, an error),
# or an answer built from replies. redis-py types replies as ``Any`` (``read_response``,
# ``ResponseT``): this name marks the one place our types stop at its boundary.
Response: TypeAlias = Any


class Pipeline(Protocol):
    """The part of another client's redis-py pipeline a riding operation is added to
    (a take, a release, a note's clear)."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Arg) -> object: ...
    def eval(self, script: str, numkeys: int, *keys_and_args: Arg) -> object: ...


def body(script: Script | AsyncScript) -> str:
    """The script's Lua text (redis-py keeps it as given: ours are str)."""
    text = script.script
    return text if isinstance(text, str) else bytes(text).decode()


def run_script(
    client: SyncClient, script: Script, keys: Sequence[Arg], args: Sequence[Arg]
) -> Response:
    """``script`` through redis-py's own path: EVALSHA, and EVAL where the node lacks it.

    Not ``Script.__call__``: on NOSCRIPT a cluster client loads the script on every
    node, so one frozen node would stall a call meant for another. EVAL runs it on the
    node the keys live on, and leaves it cached there for the next EVALSHA.
    """
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return client.eval(body(script), len(keys), *keys, *args)


async def run_script_async(
    client: AsyncClient, script: AsyncScript, keys: Sequence[Arg], args: Sequence[Arg]
) -> Response:
    """``run_script`` for an asyncio client."""
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return await client.eval(body(script), len(keys), *keys, *args)


class SentCall:
    """How to finish a sent call: turn its replies into the answer, or go back to
    redis-py's path (``fallback``, the same answer) after a transport error or an error
    reply it ``rescues``."""

    __slots__ = ()

    def fallback(self) -> Response:
        raise NotImplementedError

    def after_transport_error(self, error: Exception) -> Response:
        return self.fallback()

    def rescues(self, error: redis.ResponseError) -> bool:
        raise NotImplementedError

    def convert(self, replies: list[Response]) -> Response:
        raise NotImplementedError

    def finish(self, replies: list[Response]) -> Response:
        """The answer from the replies read, in which error replies are exceptions."""
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                if self.rescues(reply):
                    return self.fallback()
                raise reply
        return self.convert(replies)


class Batch(SentCall):
    """Calls whose answers are each the reply or its error, as they came."""

    __slots__ = ()

    def after_transport_error(self, error: Exception) -> Response:
        raise error

    def finish(self, replies: list[Response]) -> Response:
        return replies


class Command(SentCall):
    """One plain command (a read such as GET), answered with its reply."""

    __slots__ = ("args", "client")

    def __init__(self, client: SyncClient, args: Sequence[Arg]) -> None:
        self.client, self.args = client, args

    def fallback(self) -> Response:
        return self.client.execute_command(*self.args)  # type: ignore[no-untyped-call]

    def rescues(self, error: redis.ResponseError) -> bool:
        return False

    def convert(self, replies: list[Response]) -> Response:
        return replies[0]


class ScriptCall(SentCall):
    __slots__ = ("args", "client", "keys", "retry", "script")

    def __init__(
        self,
        client: SyncClient,
        script: Script,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        *,
        retry: bool,
    ) -> None:
        self.client, self.script, self.keys, self.args = client, script, keys, args
        self.retry = retry

    def after_transport_error(self, error: Exception) -> Response:
        if not self.retry:
            raise error
        return self.fallback()

    def fallback(self) -> Response:
        return run_script(self.client, self.script, self.keys, self.args)

    def rescues(self, error: redis.ResponseError) -> bool:
        # NOSCRIPT (a restarted or flushed server): redis-py loads the script and runs it.
        return isinstance(error, NoScriptError)

    def finish(self, replies: list[Response]) -> Response:
        if isinstance(replies[0], NoScriptError):
            # Straight to EVAL, which runs it and caches it on that node: the fallback's
            # EVALSHA would only be refused again, a round trip for nothing.
            return self.client.eval(body(self.script), len(self.keys), *self.keys, *self.args)
        return super().finish(replies)

    def convert(self, replies: list[Response]) -> Response:
        return replies[0]


class Asked(SentCall):
    """A script call followed by one plain command in the same write (a question about
    another key, asked as the script ends): answers ``(reply, the command's reply)``.
    The fallback is a pipeline of both (one round trip still)."""

    __slots__ = ("call", "question")

    def __init__(self, call: ScriptCall, question: Sequence[Arg]) -> None:
        self.call, self.question = call, question

    def fallback(self) -> Response:
        call = self.call
        with call.client.pipeline(transaction=False) as pipe:
            pipe.eval(body(call.script), len(call.keys), *call.keys, *call.args)
            pipe.execute_command(*self.question)
            reply, answer = pipe.execute()
        return reply, answer

    def after_transport_error(self, error: Exception) -> Response:
        if not self.call.retry:
            raise error
        return self.fallback()

    def finish(self, replies: list[Response]) -> Response:
        *called, answer = replies
        for reply in called:
            if isinstance(reply, redis.ResponseError) and self.call.rescues(reply):
                return self.fallback()
        if isinstance(answer, Exception):
            raise answer
        return self.call.finish(called), answer


class Acked(Asked):
    """A script call followed by ``WAIT``: answers ``(reply, replicas acknowledged)``.

    WAIT counts the acknowledgements of the writes made on its own connection, so the
    fallback is a pipeline (one connection) of EVAL and WAIT, never two separate calls.
    """

    __slots__ = ()

    def __init__(self, call: ScriptCall, acks: tuple[int, int]) -> None:
        super().__init__(call, ("WAIT", *acks))

    def fallback(self) -> Response:
        reply, acked = super().fallback()
        return reply, int(acked)

    def finish(self, replies: list[Response]) -> Response:
        reply, acked = super().finish(replies)
        return reply, int(acked)


class Hold(SentCall):
    """The unfenced acquire as ``SET NX PX GET`` and ``PTTL``, answered like the script."""

    __slots__ = ("_fallback", "_old_server", "token")

    def __init__(
        self, token: str, fallback: Callable[[], Response], old_server: Callable[[], None]
    ) -> None:
        self.token, self._fallback, self._old_server = token, fallback, old_server

    def fallback(self) -> Response:
        return self._fallback()

    def rescues(self, error: redis.ResponseError) -> bool:
        if "syntax" in str(error).lower():
            self._old_server()
            return True
        # A non-string value at the key (WRONGTYPE): the script reports it as contended.
        return "WRONGTYPE" in str(error)

    def convert(self, replies: list[Response]) -> list[Response]:
        current, pttl = replies
        if current is None or current in (self.token, self.token.encode()):  # own: a retry
            return [1, 0]
        return [0, current, 0 if pttl == -2 else pttl]  # -2: gone since the SET
