"""Messages lost between a broker's pop and its unacked record, found and pushed again.

kombu's Redis transport pops a message (BRPOP) and only then records it as unacked: a
worker killed between the two, or a connection lost with the reply in flight, loses
the message (celery/celery#7950), and its hold keeps the key for ``queue_ttl``.

A message pushed with a hold is *noted* on the broker's server, in the push's own round
trip: by the script that takes the hold and pushes (``pushes``, the lock store being
the broker's server), or by ``Transit.push`` (a lock store elsewhere). The pipeline
that records it as unacked clears the note (``ClearNote``, riding it).

``Transit.sweep`` (every worker's timer) looks at notes that are due. A message is gone
when a message pushed to its list after it has been received (a list is popped in
order), or its list is empty, or it is not among the 1,000 entries popped next of a
list no longer than that: never a scan of a long backlog. Gone and not unacked, it is
looked at again ``wait`` later; still gone then, and its hold still standing under its
token (asked of the lock store), it is pushed again (``PUSH_AGAIN``) at the end of its
list popped next, as kombu restores. A worker that popped it a moment ago has cleared
the note long before, so only a message nobody holds comes back; one that came back
twice meets its own lease as any redelivered copy does. Notes of messages received,
or whose hold moved on or ran out, are dropped. The notes live in the lists' database
under the lock prefix, and every script here is sent as EVAL (not EVALSHA: kombu's
key-prefixing client rewrites EVALSHA's first key).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import redis

from .errors import is_refusal, store_error

if TYPE_CHECKING:
    from .calls import Arg

# The notes' keys, in this order wherever a script takes them: the due set (member ->
# when to look next), the records (member -> {name, token, list, pushed at ms, missing
# since ms or 0, ends at ms, seq, 1 once pushed again}), the payloads (member -> the
# message as pushed), each list's last push number (list -> seq) and the greatest
# number received (list -> seq).
NOTE_KEYS = 5

# Note a message `payload` just pushed to `list` (a key), for the `spec` {member, hold's
# name, its token, ms its hold lasts, ms to wait}: the notes' keys are KEYS[k .. k + 4].
# Each noted push to a list is numbered: a message received whose number is greater
# than a noted one's means that one was popped before (a list is popped in order).
# Shared by the push scripts (``scripts._PUSH``, PUSH); not a script itself.
NOTE = """
local function note(k, spec, list, payload)
  local n = cjson.decode(spec)
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local seq = redis.call('HINCRBY', KEYS[k + 3], list, 1)
  redis.call('HSET', KEYS[k + 1], n[1], cjson.encode({n[2], n[3], list, ms, 0, ms + n[4], seq}))
  redis.call('HSET', KEYS[k + 2], n[1], payload)
  redis.call('ZADD', KEYS[k], ms + n[5], n[1])
end
"""

# Where a noted message is, the notes' keys being KEYS[1..5] and kombu's unacked hash
# KEYS[6]: 'queued' (or maybe: its list is long and it is not among the 1,000 popped
# next), 'unacked', or 'gone' (popped and never recorded). Bounded: never more than
# 1,000 list entries read. Not a script itself.
_WHERE = """
local function where(member, r)
  if redis.call('HEXISTS', KEYS[6], member) == 1 then return 'unacked' end
  local popped = tonumber(redis.call('HGET', KEYS[5], r[3]) or 0)
  local length = redis.call('LLEN', r[3])
  if length == 0 then return 'gone' end
  -- A message pushed again (r[8]) waits at the end popped next, behind nothing: its
  -- number is older than what was received since, so only a look at that end tells.
  if popped >= r[7] and not r[8] then return 'gone' end
  local payload = redis.call('HGET', KEYS[3], member)
  local found = redis.pcall('LPOS', r[3], payload, 'RANK', -1, 'MAXLEN', 1000)
  if type(found) == 'table' then
    -- Redis < 6.0.6 has no LPOS: the 1,000 entries popped next, read.
    found = false
    for _, v in ipairs(redis.call('LRANGE', r[3], -1000, -1)) do
      if v == payload then found = true end
    end
  end
  if found or (length > 1000 and not r[8]) then return 'queued' end
  return 'gone'
end
"""

# Drop a member's note (the notes' keys being KEYS[1..5]). Not a script itself.
_FORGET = """
local function forget(member)
  redis.call('ZREM', KEYS[1], member)
  redis.call('HDEL', KEYS[2], member)
  redis.call('HDEL', KEYS[3], member)
end
"""

# LPUSH with a note (a lock store on another server: the hold was taken there).
# KEYS[1] the list  KEYS[2..6] the notes'  KEYS[7..] lists to expire too
# ARGV[1] payload  ARGV[2] expiry ms ('' for none)  ARGV[3] the note's spec
PUSH = (
    NOTE
    + """
redis.call('LPUSH', KEYS[1], ARGV[1])
if ARGV[2] ~= '' then
  for i = 7, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
end
note(2, ARGV[3], KEYS[1], ARGV[1])
return 1
"""
)

# KEYS[1..5] the notes'  KEYS[6] kombu's unacked hash  ARGV[1] wait ms  ARGV[2] how many
# returns {member, name, token} of each message gone for a wait: to push again if its
# hold still stands (PUSH_AGAIN), else to forget (FORGET). A message still queued is
# looked at less often the longer it waits; one unacked, or past its hold, is forgotten.
SWEEP = (
    _FORGET
    + _WHERE
    + """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local wait = tonumber(ARGV[1])
local missing = {}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms, 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local raw = redis.call('HGET', KEYS[2], member)
  local r = raw and cjson.decode(raw)
  local state = (r and ms < r[6]) and where(member, r) or 'unacked'
  if state == 'unacked' then
    forget(member)
  else
    local next_look = ms + wait
    if state == 'queued' then
      r[5] = 0
      next_look = ms + math.max(wait, ms - r[4])
    elseif r[5] == 0 then
      r[5] = ms
    elseif ms - r[5] >= wait then
      table.insert(missing, {member, r[1], r[2]})
    end
    redis.call('HSET', KEYS[2], member, cjson.encode(r))
    redis.call('ZADD', KEYS[1], next_look, member)
  end
end
return missing
"""
)

# KEYS as SWEEP; ARGV the members whose holds still stand. Each still noted, seen gone
# before and gone now is pushed again, at the end popped next, keeping its number and
# marked pushed again (r[8]): a number of its own would be newer than the messages still
# queued, whose receipt it would then seem to prove. returns the members pushed
PUSH_AGAIN = (
    _WHERE
    + """
local pushed = {}
for _, member in ipairs(ARGV) do
  local raw = redis.call('HGET', KEYS[2], member)
  local r = raw and cjson.decode(raw)
  if r and r[5] ~= 0 and where(member, r) == 'gone' then
    redis.call('RPUSH', r[3], redis.call('HGET', KEYS[3], member))
    r[5] = 0
    r[8] = 1
    redis.call('HSET', KEYS[2], member, cjson.encode(r))
    table.insert(pushed, member)
  end
end
return pushed
"""
)

# KEYS[1..5] the notes'  ARGV the members to forget (their holds moved on)
FORGET = (
    _FORGET
    + """
for _, member in ipairs(ARGV) do forget(member) end
return #ARGV
"""
)

# A received message's note cleared, in the pipeline that records it as unacked:
# KEYS[1..5] the notes'  ARGV[1] its member. Its number counts as received for its list.
CLEAR = (
    _FORGET
    + """
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
local r = cjson.decode(raw)
if r[7] > tonumber(redis.call('HGET', KEYS[5], r[3]) or 0) then
  redis.call('HSET', KEYS[5], r[3], r[7])
end
forget(ARGV[1])
return 1
"""
)

# KEYS[1..5] the notes'  ARGV the lists a purge emptied: their messages' notes dropped.
# returns {name, token} of each (their holds, for the caller to give up)
PURGED = (
    _FORGET
    + """
local purged, holds, cursor = {}, {}, '0'
for _, list in ipairs(ARGV) do purged[list] = true end
repeat
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', 500)
  cursor = page[1]
  for i = 1, #page[2], 2 do
    local r = cjson.decode(page[2][i + 1])
    if purged[r[3]] then
      table.insert(holds, {r[1], r[2]})
      forget(page[2][i])
    end
  end
until cursor == '0'
return holds
"""
)

# Notes looked at per sweep at most: a sweep is one short script, whatever the backlog.
SWEEP_LIMIT = 200


class Pipeline(Protocol):
    """The part of a redis-py pipeline a clear is added to."""

    def eval(self, script: str, numkeys: int, *keys_and_args: Arg) -> object: ...


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
    database, kombu's own included), under the lock prefix ``prefix``."""

    def __init__(self, client: Any, prefix: str, *, where: str = "the broker") -> None:
        self.client = client
        self.where = where  # for errors
        self.keys = keys_of(prefix)
        self.due = self.keys[0]

    def _eval(self, script: str, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        try:
            return self.client.eval(script, len(keys), *keys, *args)
        except redis.RedisError as error:
            raise store_error(error, where=self.where) from error

    def push(self, key: str, payload: str | bytes, note: Note, expire: Any = None) -> None:
        """LPUSH ``payload`` to ``key`` with its note, in one round trip; ``expire``:
        (lists, ms) to PEXPIRE after (a queue that expires unused). Raises redis-py's
        errors as they are: a broker's push, retried as kombu's would be."""
        lists, ms = expire if expire is not None else ((), "")
        keys = [key, *self.keys, *lists]
        self.client.eval(PUSH, len(keys), *keys, payload, ms, note.spec())

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
        kombu's unacked hash, as the server names it (with kombu's key prefix)."""
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

    def pending(self) -> int:
        """How many messages are noted in transit now."""
        try:
            return int(self.client.zcard(self.due))
        except redis.RedisError as error:
            raise store_error(error, where=self.where) from error


class ClearNote:
    """A received message's note cleared in the pipeline that records it as unacked."""

    __slots__ = ("_keys", "_member")

    def __init__(self, prefix: str, member: str) -> None:
        self._keys, self._member = keys_of(prefix), member

    def add(self, pipe: Pipeline, db: int) -> None:
        """Put the clear on ``pipe`` (kombu's: the notes are in its database)."""
        pipe.eval(CLEAR, NOTE_KEYS, *self._keys, self._member)

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
    "NOTE",
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
