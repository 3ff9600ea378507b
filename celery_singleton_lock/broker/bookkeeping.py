"""kombu's unacked bookkeeping sent as one command a step: a received message's record as one
script (``lua/record.lua``), an ack's removal as two plain commands.

kombu chains them on a redis-py transaction (four commands and four replies a step), whose
building and parsing cost the worker's main process more than the round trips themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..lease.errors import is_refusal
from ..lease.redis.calls import Arg
from ..lease.redis.common import REDIS_ERRORS
from ..lease.redis.replies import TRANSPORT_ERRORS
from .ride_scripts import RECORD, digest
from .state import RidingCall
from .transit import NOTE_KEYS, ClearNote

if TYPE_CHECKING:
    from ..lease.redis.clients import SyncClient
    from ..lease.redis.pipelining import Pipelining

RECORD_SHA = digest(RECORD)
# record.lua clears a note when given its keys: NOTE_KEYS of them, then kombu's two.
RECORD_NOTED_KEYS = NOTE_KEYS + 2

# One call kombu chained on the pipeline: (method, arguments, keyword arguments).
Call = tuple[str, tuple[object, ...], dict[str, object]]


class Keys:
    """The names kombu's bookkeeping writes (as kombu names them, without the global key
    prefix its client adds) and the prefix to add when the commands are our own."""

    __slots__ = ("hash", "index", "prefix")

    def __init__(self, index: str, table: str, prefix: str) -> None:
        self.index, self.hash, self.prefix = index, table, prefix


class Bookkeeping:
    """What kombu's QoS chains its unacked bookkeeping on, sent as our own commands.

    Handed to kombu in place of its pipeline, it takes kombu's own calls, so kombu still
    computes what is written (the time, the ``[message, exchange, routing key]`` value).
    When they are the shape kombu's releases in ``versions.TESTED`` chain, it writes them
    as one script (after the message's riding calls, its take, in the same write; the clearing
    of its note inside the script) or as an HDEL and a ZREM.

    ``fallback`` gives kombu's own pipeline, with the riding calls put first (``unacked``'s
    riding pipeline): every call goes there, replayed, when the calls are not a shape
    this knows (a kombu release that writes something more still has it written), when
    the server refuses the script, and after a transport error."""

    def __init__(
        self,
        pipelining: Pipelining,
        keys: Keys,
        riding: Sequence[RidingCall],
        fallback: Callable[[Sequence[RidingCall]], Any],
        *,
        refused: Callable[[Exception], None],
        db: int,
    ) -> None:
        self._pipelining = pipelining
        self._keys = keys
        self._riding = riding
        self._fallback = fallback
        self._refused = refused  # the record's script was refused: kombu's from now on
        self._db = db
        self._calls: list[Call] = []
        # kombu's own pipeline, once anything went there: every later call goes too.
        self._kombus_pipe: Any = None

    # kombu's calls, as its QoS chains them (``append``, ``_remove_from_indices``).
    def zadd(self, *args: object, **kwargs: object) -> object:
        return self._chain("zadd", args, kwargs)

    def hset(self, *args: object, **kwargs: object) -> object:
        return self._chain("hset", args, kwargs)

    def zrem(self, *args: object, **kwargs: object) -> object:
        return self._chain("zrem", args, kwargs)

    def hdel(self, *args: object, **kwargs: object) -> object:
        return self._chain("hdel", args, kwargs)

    def _chain(self, name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        if self._kombus_pipe is not None:
            return getattr(self._kombus_pipe, name)(*args, **kwargs)
        self._calls.append((name, args, kwargs))
        return self

    def __getattr__(self, name: str) -> Any:
        # Anything else kombu asks of a pipeline: kombu's own one from here on, with what
        # was chained so far replayed on it.
        return getattr(self._replayed(self._riding), name)

    def execute(self, raise_on_error: bool = True) -> list[object]:
        if self._kombus_pipe is not None:
            return list(self._kombus_pipe.execute(raise_on_error=raise_on_error))
        record = _record_shape(self._calls, self._keys)
        if record is not None:
            return self._record(*record, raise_on_error=raise_on_error)
        removal = _removal_shape(self._calls, self._keys)
        if removal is not None and not self._riding:
            return self._remove(removal, raise_on_error=raise_on_error)
        return list(self._replayed(self._riding).execute(raise_on_error=raise_on_error))

    def _replayed(self, riding: Sequence[RidingCall]) -> Any:
        if self._kombus_pipe is None:
            pipe = self._kombus_pipe = self._fallback(riding)
            for name, args, kwargs in self._calls:
                getattr(pipe, name)(*args, **kwargs)
            self._calls = []
        return self._kombus_pipe

    def _record(self, tag: str, score: float, value: str, *, raise_on_error: bool) -> list[object]:
        """The received message recorded as unacked by one script, its note cleared in it,
        its other riding calls (the take) written before it in the same write."""
        clears = [call for call in self._riding if isinstance(call, ClearNote)]
        others = [call for call in self._riding if not isinstance(call, ClearNote)]
        collected = _Commands()
        for call in others:
            call.add(collected, self._db)
        keys = self._keys
        note_keys: Sequence[str] = clears[0].keys if clears else ()
        record_keys = [*note_keys, keys.prefix + keys.index, keys.prefix + keys.hash]
        member = clears[0].member if clears else ""
        record_args: list[Arg] = [tag, repr(float(score)), value, member]
        record: tuple[Arg, ...] = ("EVALSHA", RECORD_SHA, len(record_keys), *record_keys)
        record = (*record, *record_args)
        try:
            replies = self._pipelining.call_commands([*collected.commands, record])
        except TRANSPORT_ERRORS:
            # It may or may not have run: all of it again through kombu's pipeline, which
            # retries by the client's policy (each step gives the same answer twice).
            return self._kombus(self._riding, raise_on_error)
        for call, reply in zip(others, replies, strict=False):
            if not (isinstance(reply, Exception) and call.refused(reply)):
                call.read(reply)
        answer = replies[-1]
        if _no_script(answer):
            # A server restarted or flushed: the body once, which caches it again.
            try:
                answer = self._pipelining.call_commands([("EVAL", RECORD, *record[2:])])[0]
            except TRANSPORT_ERRORS:
                return self._kombus(clears, raise_on_error)
        if isinstance(answer, Exception):
            if is_refusal(answer, "NOPERM"):
                # An ACL user that may not run scripts: kombu's transaction from now on.
                self._refused(answer)
            # Any other error (out of memory, a busy script): kombu's transaction says it.
            return self._kombus(clears, raise_on_error)
        return [answer, answer]  # for kombu's ZADD and HSET, whose replies it never reads

    def _remove(self, tag: str, *, raise_on_error: bool) -> list[object]:
        """An acked (or rejected) message's removal: the hash's entry first, then the
        index's. Written apart, not in a transaction: cut between the two, the index
        names a tag with no message, which kombu's restore drops; the other order would
        leave a message in the hash that nothing would restore or remove."""
        keys = self._keys
        try:
            hdel, zrem = self._pipelining.call_commands(
                [("HDEL", keys.prefix + keys.hash, tag), ("ZREM", keys.prefix + keys.index, tag)]
            )
        except TRANSPORT_ERRORS:
            return self._kombus((), raise_on_error)
        if isinstance(hdel, Exception) or isinstance(zrem, Exception):
            return self._kombus((), raise_on_error)  # as kombu would have raised it
        return [zrem, hdel]

    def _kombus(self, riding: Sequence[RidingCall], raise_on_error: bool) -> list[object]:
        return list(self._replayed(riding).execute(raise_on_error=raise_on_error))


class _Commands:
    """What riding calls put on a pipeline (``lease.redis.calls.Pipeline``), to write."""

    def __init__(self) -> None:
        self.commands: list[tuple[Arg, ...]] = []

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Arg) -> object:
        self.commands.append(("EVALSHA", sha, numkeys, *keys_and_args))
        return self

    def eval(self, script: str, numkeys: int, *keys_and_args: Arg) -> object:
        self.commands.append(("EVAL", script, numkeys, *keys_and_args))
        return self


def load_record(client: SyncClient) -> None:
    """The record's script cached on ``client``'s server before its first message: a
    take that rides it is cached already, and a NOSCRIPT for the record alone would send
    it on a round trip after the take's (a worker killed in between leaves the message
    to the sweep). Best effort: a refusal or an outage is the first record's to meet."""
    with contextlib.suppress(*REDIS_ERRORS):
        client.script_load(RECORD)


def _record_shape(calls: list[Call], keys: Keys) -> tuple[str, float, str] | None:
    """(tag, score, value) when ``calls`` are kombu's record of one received message:
    ``zadd(index, {tag: score})`` then ``hset(hash, tag, value)``, nothing more."""
    if [(name, kwargs) for name, _, kwargs in calls] != [("zadd", {}), ("hset", {})]:
        return None
    (zadd, hset) = (calls[0][1], calls[1][1])
    if len(zadd) != 2 or len(hset) != 3 or zadd[0] != keys.index or hset[0] != keys.hash:
        return None
    scores = zadd[1]
    if not isinstance(scores, Mapping) or len(scores) != 1:
        return None
    ((tag, score),) = scores.items()
    if tag != hset[1] or not isinstance(tag, str) or not isinstance(score, int | float):
        return None
    value = hset[2]
    return (tag, score, value) if isinstance(value, str) else None


def _removal_shape(calls: list[Call], keys: Keys) -> str | None:
    """The tag when ``calls`` are kombu's removal of one message: ``zrem(index, tag)``
    then ``hdel(hash, tag)``, nothing more."""
    if [(name, args[:1], kwargs) for name, args, kwargs in calls] != [
        ("zrem", (keys.index,), {}),
        ("hdel", (keys.hash,), {}),
    ]:
        return None
    zrem, hdel = calls[0][1], calls[1][1]
    tag = zrem[1] if len(zrem) == 2 else None
    return tag if isinstance(tag, str) and hdel == (keys.hash, tag) else None


def _no_script(reply: object) -> bool:
    return isinstance(reply, Exception) and is_refusal(reply, "NOSCRIPT")


__all__ = ["RECORD", "RECORD_NOTED_KEYS", "RECORD_SHA", "Bookkeeping", "Keys", "load_record"]
