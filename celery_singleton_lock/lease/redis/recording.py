"""A lock's history on one Redis server: each entry written in its operation's own step.

A script run with a ``Record`` is wrapped (``recorded``) to add the entry its reply calls
for. An event no script decides (a contention policy of the user's own) is ``append``ed:
one pipelined round trip of its own.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import store_error
from ..history import Entry, Kind, Record
from ..outcomes import text
from . import scripts
from .common import REDIS_ERRORS

logger = logging.getLogger(__name__)

# The reply of each kind of script, read as an outcome: 'ok', 'refused' (with the holder
# when the reply names it, and any fields of its own) or 'gone'.
_OUTCOME: dict[str, str] = {
    # ACQUIRE, ACQUIRE_SLOT: {1, fence, ...} taken; {0, holder, pttl}
    # refused; {-1} replaced
    "take": """
  if type(reply) == 'table' and reply[1] == 1 then return 'ok', nil end
  if type(reply) == 'table' and reply[1] == 0 then return 'refused', reply[2] end
  return 'gone', nil""",
    # RELEASE, RELEASE_MATCHING: 1 released; 0 nobody held it (expired); -1 another does
    "release": """
  if reply == 1 then return 'ok', nil end
  if reply == 0 then return 'gone', nil end
  return 'refused', nil""",
    # SWAP: {1, 0} swapped; {0, holder, pttl} not
    "swap": """
  if type(reply) == 'table' and reply[1] == 1 then return 'ok', nil end
  return 'refused', type(reply) == 'table' and reply[2] or nil""",
    # HOLDER: the holder's token; false when free
    "read": """
  if type(reply) == 'string' then return 'refused', reply end
  return 'gone', nil""",
    # RATE: {state, slot in µs, ...}: 2 a later slot, the call deferred to it; 1 now
    "rate": """
  if type(reply) == 'table' and reply[1] == 2 then
    return 'refused', nil, {'detail', string.format('runs at %.3f', reply[2] / 1000000)}
  end
  return 'ok', nil""",
}

# A holder's read (``RedisLock.holder``), a script only while a kept history records
# reads: an early refusal of a duplicate writes its entry in the read's own round trip.
HOLDER = "return redis.call('GET', KEYS[1])"


def recorded(script: str, kind: Kind) -> str:
    """``script`` writing its ``Record``'s entry in the same step.

    The stream's key is the script's last key and the record's spec its last argument,
    both taken off before the script runs; its reply says what happened (taken or
    refused, and by whom; released or found expired; swapped; a rate's slot now or
    later), and the wrapper adds the matching entry (``XADD ... MAXLEN ~ n``) and renews
    the stream's expiry.
    """
    return f"""local history = table.remove(KEYS)
local spec = cjson.decode(table.remove(ARGV))
local function run()
{script}
end
local function outcome(reply){_OUTCOME[kind]}
end
local reply = run()
local happened, holder, own = outcome(reply)
local event = spec[happened]
if event and event ~= '' then
  local entry = {{'XADD', history, 'MAXLEN', '~', spec.length, '*', 'event', event}}
  if holder and holder ~= '' then
    entry[#entry + 1] = 'holder'
    entry[#entry + 1] = holder
  end
  local said = happened == 'refused' and spec.refused_fields or {{}}
  for _, fields in ipairs({{own or {{}}, said, spec.fields}}) do
    for _, value in ipairs(fields) do entry[#entry + 1] = value end
  end
  -- pcall: an entry refused (an ACL without the stream, a server without streams) must
  -- not turn the operation's own reply, already applied, into an error.
  redis.pcall(unpack(entry))
  redis.pcall('PEXPIRE', history, spec.ttl)
end
return reply
"""


# The scripts an operation may be recorded around, by digest, and the kind of reply each
# gives (read by ``_OUTCOME``). A script of another folder names its kind as it is sent.
_BY_KIND: tuple[tuple[str, Kind], ...] = (
    (scripts.ACQUIRE, "take"),
    (scripts.ACQUIRE_SLOT, "take"),
    (scripts.RELEASE, "release"),
    (scripts.RELEASE_MATCHING, "release"),
    (scripts.SWAP, "swap"),
    (HOLDER, "read"),
    (scripts.RATE, "rate"),
)
KINDS: dict[str, Kind] = {
    hashlib.sha1(script.encode()).hexdigest(): kind  # noqa: S324  (Redis names scripts so)
    for script, kind in _BY_KIND
}


# The riding scripts (run in another client's pipeline, in the lock's
# database), writing their entry: the history's key and spec last, as ``recorded`` takes.
RIDING_TAKE = scripts.in_lock_db(recorded(scripts.ACQUIRE, "take"), 9)
RIDING_RELEASE = scripts.in_lock_db(recorded(scripts.RELEASE, "release"), 3)


def append(store: object, record: Record | None, event: str, **more: str) -> None:
    """An entry no script decides (``more``: its own fields) in ``store``'s history of
    ``record``, with the stream's expiry renewed: one round trip. Nothing for a store
    that keeps no history (``memory://``, Redlock: no one server has every entry), and
    never an error: a history is no reason for a task to fail."""
    client = getattr(store, "client", None)
    if record is None or not callable(getattr(client, "xadd", None)):
        return
    try:
        pipe = client.pipeline(transaction=False)  # type: ignore[union-attr]
        fields = {"event": event, **more, **record.fields}
        pipe.xadd(record.key, fields, maxlen=record.length, approximate=True)
        pipe.pexpire(record.key, record.ttl_ms)
        pipe.execute()
    except REDIS_ERRORS as error:
        logger.debug("history entry %r not written: %s", event, error)


def entries(store: object, key: str, count: int = 100) -> list[Entry]:
    """The newest ``count`` entries of the history ``key`` in ``store``, newest first
    ([] for a store that keeps none). Raises the store's errors."""
    client = getattr(store, "client", None)
    if not callable(getattr(client, "xrevrange", None)):
        return []
    try:
        found: Sequence[tuple[Any, Mapping[Any, Any]]] = client.xrevrange(key, count=count) or []  # type: ignore[union-attr]
    except REDIS_ERRORS as error:
        raise store_error(error, where=str(getattr(store, "where", "the lock store"))) from error
    out = []
    for entry_id, raw in found:
        values = {text(k): text(v) for k, v in raw.items()}
        at_ms = int(text(entry_id).split("-", 1)[0])
        out.append(Entry(at_ms, values.pop("event", ""), values))
    return out
