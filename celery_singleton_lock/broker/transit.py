"""Messages lost between a broker's pop and its unacked record, found and pushed again.

kombu's Redis transport pops a message (BRPOP) and only then records it as unacked: a
worker killed between the two, or a connection lost with the reply in flight, loses
the message (celery/celery#7950), and its hold keeps the key for ``queue_ttl``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from ..lease.errors import is_refusal, store_error
from ..lease.redis.replies import TRANSPORT_ERRORS
from . import ride_scripts

if TYPE_CHECKING:
    from ..lease.redis.calls import Arg, Pipeline, Response
    from ..lease.redis.pipelining import Pipelining

# The property of a message noted in transit, naming the lock prefix its note is under:
# the worker's receipt clears the note there (``unacked.QoS``).
NOTED_PROPERTY = "singleton_lock_noted"

# How many keys the notes take, in the order lua/includes/note.lua gives (which says
# the same to the scripts).
NOTE_KEYS = 5

# The scripts (broker/lua/: each file says its KEYS, ARGV and replies; the notes' helpers
# are lua/includes/note.lua, where.lua and forget.lua). Each is sent as EVAL: kombu's
# key-prefixing client rewrites EVALSHA's first key. A push, on every dispatch, goes by
# its digest past that rewriting (redis-py's own ``execute_command``), EVAL once the
# server answers NOSCRIPT: its 1 KiB text is not sent with every message.
PUSH = ride_scripts.PUSH_NOTED
PUSH_SHA = ride_scripts.digest(PUSH)
SWEEP = ride_scripts.SWEEP
PUSH_AGAIN = ride_scripts.PUSH_AGAIN
FORGET = ride_scripts.FORGET_NOTES
CLEAR = ride_scripts.CLEAR_NOTE
PURGED = ride_scripts.PURGED

# Notes looked at per sweep at most: a sweep is one short script, whatever the backlog.
SWEEP_LIMIT = 200


def keys_of(prefix: str) -> tuple[str, ...]:
    """The notes' keys (``NOTE_KEYS`` of them, in order) under the lock prefix ``prefix``."""
    base = f"{prefix}:transit"
    return (f"{base}:due", base, f"{base}:payloads", f"{base}:seq", f"{base}:popped")


@dataclass(frozen=True)
class Note:
    """How a message is noted as it is pushed: its delivery tag, its hold (the lock's
    name and token, for how long), how long it may be missing (``wait``, s), and the
    lock prefix the notes are kept under."""

    member: str
    name: str
    token: str
    ttl: float
    wait: float
    prefix: str

    def spec(self) -> str:
        return json.dumps(
            [self.member, self.name, self.token, round(self.ttl * 1000), round(self.wait * 1000)]
        )


class Transit:
    """The notes on one broker server (``client``: any redis-py client of the lists'
    database, kombu's own included), under the lock prefix ``prefix``.

    A message pushed with a hold is *noted* on the broker's server, in the push's own
    round trip: by the script that takes the hold and pushes (``pushes``, the lock store
    being the broker's server), or by ``push`` (a lock store elsewhere). The pipeline
    that records it as unacked clears the note (``ClearNote``, riding it).
    """

    def __init__(self, client: Any, prefix: str, *, where: str = "the broker") -> None:
        self.client = client
        self.where = where  # for errors
        self.keys = keys_of(prefix)
        self.due = self.keys[0]

    def _eval(self, script: str, keys: Sequence[Arg], args: Sequence[Arg]) -> Response:
        try:
            return self.client.eval(script, len(keys), *keys, *args)
        except redis.RedisError as error:
            raise store_error(error, where=self.where) from error

    def push(
        self,
        key: str,
        payload: str | bytes,
        note: Note,
        expire: Any = None,
        *,
        via: Pipelining | None = None,
    ) -> None:
        """LPUSH ``payload`` to ``key`` with its note, in one round trip; ``expire``:
        (lists, ms) to PEXPIRE after (a queue that expires unused). Raises redis-py's
        errors as they are: a broker's push, retried as kombu's would be. ``via``: the
        channel's own connections driven directly (``Pipelining``), where redis-py's
        per-command path would cost more CPU than the round trip."""
        lists, ms = expire if expire is not None else ((), "")
        keys = [key, *self.keys, *lists]
        spec = note.spec()
        if via is not None:
            try:
                [answer] = via.call_commands(
                    [("EVALSHA", PUSH_SHA, len(keys), *keys, payload, ms, spec)]
                )
            except TRANSPORT_ERRORS:
                pass  # it may or may not have run: again below, as kombu's push would be
            else:
                if not (isinstance(answer, Exception) and is_refusal(answer, "NOSCRIPT")):
                    if isinstance(answer, Exception):
                        raise answer
                    return
        client = self.client
        try:
            redis.Redis.execute_command(
                client, "EVALSHA", PUSH_SHA, len(keys), *keys, payload, ms, spec
            )
        except redis.exceptions.NoScriptError:
            client.eval(PUSH, len(keys), *keys, payload, ms, spec)

    def sweep(
        self,
        unacked: str,
        holds: Callable[[str, str], bool],
        *,
        wait: float,
        limit: int = SWEEP_LIMIT,
    ) -> list[str]:
        """Look at the notes that are due; push again each message missing for ``wait``
        whose hold ``holds(name, token)`` still; the delivery tags pushed. ``unacked``:
        kombu's unacked hash, as the server names it (with kombu's key prefix).

        Run by every worker's timer. A message is gone when a message pushed to its list
        after it has been received (a list is popped in order), or its list is empty, or
        it is not among the 1,000 entries popped next of a list no longer than that:
        never a scan of a long backlog. Gone and not unacked, it is looked at again
        ``wait`` later; still gone then, and its hold still standing under its token
        (asked of the lock store), it is pushed again (``PUSH_AGAIN``) at the end of its
        list popped next, as kombu restores. A worker that popped it a moment ago has
        cleared the note long before, so only a message nobody holds comes back; one that
        came back twice meets its own lease as any redelivered copy does. Notes of
        messages received, or whose hold moved on or ran out, are dropped.
        """
        keys = [*self.keys, unacked]
        missing = self._eval(SWEEP, keys, [max(1, round(wait * 1000)), limit]) or []
        owed: list[str] = []
        gone: list[str] = []
        for member, name, token in ((_text(m), _text(n), _text(t)) for m, n, t in missing):
            (owed if holds(name, token) else gone).append(member)
        if gone:
            self._eval(FORGET, self.keys, gone)
        return [_text(m) for m in self._eval(PUSH_AGAIN, keys, owed) or ()] if owed else []

    def forget(self, members: Sequence[str], lists: Sequence[str] = ()) -> None:
        """Drop the notes of ``members`` and the push numbers kept for ``lists`` (lists
        that are gone for good: a probe's)."""
        if members:
            self._eval(FORGET, self.keys, members)
        if lists:
            pipe = self.client.pipeline(transaction=False)
            for numbers in self.keys[3:]:  # each list's last push, and last received
                pipe.hdel(numbers, *lists)
            pipe.execute()

    def purged(self, lists: Sequence[str]) -> list[tuple[str, str]]:
        """``lists`` were emptied: their messages' notes are dropped; the holds they had,
        as (name, token), for the caller to give up."""
        found = self._eval(PURGED, self.keys, list(lists)) or []
        return [(_text(name), _text(token)) for name, token in found]

    def noted(self) -> int:
        """How many messages are noted in transit now."""
        try:
            return int(self.client.zcard(self.due))
        except redis.RedisError as error:
            raise store_error(error, where=self.where) from error


class ClearNote:
    """A received message's note cleared in the pipeline that records it as unacked."""

    __slots__ = ("keys", "member")

    def __init__(self, prefix: str, member: str) -> None:
        # The notes' keys and the message's member: what a script that records the
        # message as unacked takes to clear its note in the same step (broker/lua/record.lua).
        self.keys, self.member = keys_of(prefix), member

    def add(self, pipe: Pipeline, db: int) -> None:
        """Put the clear on ``pipe`` (kombu's: the notes are in its database)."""
        pipe.eval(CLEAR, NOTE_KEYS, *self.keys, self.member)

    def refused(self, error: Exception) -> bool:
        """Whether ``error`` is the server refusing the clear as it was queued."""
        return is_refusal(error, "NOPERM") or is_refusal(error, "EXECABORT")

    def read(self, reply: object) -> None:
        """A clear's reply: nothing to do (a note left behind is swept)."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = [
    "CLEAR",
    "FORGET",
    "NOTED_PROPERTY",
    "NOTE_KEYS",
    "PURGED",
    "PUSH",
    "PUSH_AGAIN",
    "SWEEP",
    "SWEEP_LIMIT",
    "ClearNote",
    "Note",
    "Transit",
    "keys_of",
]
