"""Messages lost between a broker's pop and its unacked record, found and pushed again.

kombu's Redis transport pops a message (BRPOP) and only then records it as unacked: a
worker killed between the two, or a connection lost with the reply in flight, loses
the message (celery/celery#7950), and its hold keeps the key for ``queue_ttl``. A
message pushed with its hold (``pushes``) is noted here in the same script; the
pipeline that records it as unacked clears the note (``Transit.clear``, riding it).

``Transit.sweep`` (every worker's timer) looks at notes older than ``wait``. A message
whose hold still stands under its token, and which is neither in its list nor
unacked, is looked at again ``wait`` later; still missing then, it is pushed again, at
the end of its list that is popped next (as kombu restores). A worker that popped it a
moment ago has cleared the note by then, so only a message nobody holds comes back;
one that came back twice would meet its own lease as any redelivered copy does. Notes
of messages received, replaced, or whose hold ran out are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from redis.commands.core import Script

from .base import REDIS_ERRORS
from .errors import is_refusal, store_error

if TYPE_CHECKING:
    from .calls import Arg
    from .clients import SyncClient


class Pipeline(Protocol):
    """The part of a redis-py pipeline a clear is added to."""

    def eval(self, script: str, numkeys: int, *keys_and_args: Arg) -> object: ...


# KEYS[1] due set  KEYS[2] records  KEYS[3] kombu's unacked hash (in the lists' database)
# ARGV[1] wait ms  ARGV[2] how many at most  ARGV[3] the lock's database
# A record (written by scripts._PUSH): {hold key, token, list, list's database ('' for
# the lock's), payload, pushed at ms, missing since ms (0: not seen missing)}.
# returns the members pushed again
SWEEP = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local wait = tonumber(ARGV[1])
local again = {}
local function queued(list, payload)
  local found = redis.pcall('LPOS', list, payload, 'RANK', -1)
  if type(found) ~= 'table' then return found end
  -- Redis < 6.0.6 has no LPOS: the list read in slices.
  for i = 0, redis.call('LLEN', list) - 1, 500 do
    for _, v in ipairs(redis.call('LRANGE', list, i, i + 499)) do
      if v == payload then return true end
    end
  end
  return false
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms, 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local raw = redis.call('HGET', KEYS[2], member)
  local r = raw and cjson.decode(raw)
  local next_look = nil
  if r and redis.pcall('GET', r[1]) == r[2] then
    if r[4] ~= '' then redis.call('SELECT', r[4]) end
    if queued(r[3], r[5]) then
      -- Still queued: looked at less often the longer it waits.
      r[7] = 0
      next_look = ms + math.max(wait, ms - r[6])
    elseif redis.call('HEXISTS', KEYS[3], member) == 0 then
      if r[7] ~= 0 then
        redis.call('RPUSH', r[3], r[5])
        table.insert(again, member)
        r[7] = 0
      else
        r[7] = ms
      end
      next_look = ms + wait
    end
    if r[4] ~= '' then redis.call('SELECT', ARGV[3]) end
  end
  if next_look then
    redis.call('HSET', KEYS[2], member, cjson.encode(r))
    redis.call('ZADD', KEYS[1], next_look, member)
  else
    redis.call('ZREM', KEYS[1], member)
    redis.call('HDEL', KEYS[2], member)
  end
end
return again
"""

# Sent in the pipeline that records a received message as unacked (another client's,
# maybe of another database). KEYS[1] due set  KEYS[2] records  ARGV[1] the member
# ARGV[2] the lock's database ('' when the pipeline's)  ARGV[3] the pipeline's
CLEAR = """
if ARGV[2] ~= '' then redis.call('SELECT', ARGV[2]) end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[2] ~= '' then redis.call('SELECT', ARGV[3]) end
return 1
"""

# A purge of the lists ARGV[1..]: their messages' notes dropped, and the holds they
# still have given up (owner-checked: the note's token). KEYS[1] due set  KEYS[2] records
# returns how many holds were given up
PURGED = """
local purged, freed, cursor = {}, 0, '0'
for _, list in ipairs(ARGV) do purged[list] = true end
repeat
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', 500)
  cursor = page[1]
  for i = 1, #page[2], 2 do
    local r = cjson.decode(page[2][i + 1])
    if purged[r[3]] then
      if redis.pcall('GET', r[1]) == r[2] then
        redis.call('DEL', r[1])
        freed = freed + 1
      end
      redis.call('ZREM', KEYS[1], page[2][i])
      redis.call('HDEL', KEYS[2], page[2][i])
    end
  end
until cursor == '0'
return freed
"""

# Notes looked at per sweep at most: a sweep is one short script, whatever the backlog.
SWEEP_LIMIT = 200


@dataclass
class Transit:
    """The in-transit notes of one lock store's server, under its prefix.

    ``wait``: seconds a message may be missing, neither queued nor unacked, before it
    is looked at again and pushed (0: no notes are taken).
    """

    client: SyncClient
    prefix: str
    db: int
    wait: float
    where: str  # the store's, for errors
    clears_ride: bool = True  # False once the server refused a clear (ACL)

    def __post_init__(self) -> None:
        self.due, self.records = f"{self.prefix}:transit:due", f"{self.prefix}:transit"
        self._sweep: Script = self.client.register_script(SWEEP)
        self._purged: Script = self.client.register_script(PURGED)

    @property
    def on(self) -> bool:
        return self.wait > 0

    @property
    def wait_ms(self) -> int:
        return max(1, round(self.wait * 1000))

    def sweep(self, unacked: str, *, limit: int = SWEEP_LIMIT) -> list[str]:
        """Look at the notes that are due; the delivery tags of the messages pushed
        again. ``unacked``: kombu's unacked hash, as the server names it (prefixed)."""
        keys = [self.due, self.records, unacked]
        try:
            reply = self._sweep(keys=keys, args=[self.wait_ms, limit, self.db], client=self.client)
        except REDIS_ERRORS as error:
            raise store_error(error, where=self.where) from error
        return [m.decode() if isinstance(m, bytes) else str(m) for m in reply or ()]

    def purged(self, lists: list[str]) -> int:
        """``lists`` were purged: their messages' notes are dropped and the holds they
        still have given up; how many were."""
        try:
            freed = self._purged(keys=[self.due, self.records], args=lists, client=self.client)
        except REDIS_ERRORS as error:
            raise store_error(error, where=self.where) from error
        return int(freed or 0)

    def pending(self) -> int:
        """How many messages are noted in transit now."""
        try:
            return int(self.client.zcard(self.due))
        except REDIS_ERRORS as error:
            raise store_error(error, where=self.where) from error

    def clear(self, member: str) -> ClearNote | None:
        """The clearing of ``member``'s note, to ride the pipeline recording it unacked."""
        # Also with notes off here: a producer configured otherwise may have taken one.
        return ClearNote(self, member) if self.clears_ride else None


class ClearNote:
    """A received message's note cleared in the pipeline that records it as unacked."""

    __slots__ = ("_member", "_transit")

    def __init__(self, transit: Transit, member: str) -> None:
        self._transit, self._member = transit, member

    def add(self, pipe: Pipeline, db: int) -> None:
        """Put the clear on ``pipe``, a pipeline of a client of database ``db``."""
        transit = self._transit
        own: int | str = "" if transit.db == db else transit.db
        # The body, not the digest: nothing to load first, nothing lost to NOSCRIPT.
        pipe.eval(CLEAR, 2, transit.due, transit.records, self._member, own, db)

    def refused(self, error: Exception) -> bool:
        """Whether ``error`` is the server refusing the clear as it was queued."""
        if is_refusal(error, "NOPERM") or is_refusal(error, "EXECABORT"):
            self._transit.clears_ride = False
            return True
        return False

    def read(self, reply: object) -> None:
        if isinstance(reply, Exception) and is_refusal(reply, "NOPERM"):
            self._transit.clears_ride = False


__all__ = ["CLEAR", "PURGED", "SWEEP", "SWEEP_LIMIT", "ClearNote", "Transit"]
