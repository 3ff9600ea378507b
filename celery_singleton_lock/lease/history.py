"""A lock's history: a capped, expiring Redis stream of what happened to it, written in the round trip of what it records.

A lock ``name`` keeps its entries in ``LockKeys.history`` (its hash tag: one Cluster slot
with the lock, so the lock's own scripts may write it). A script run with a ``Record``
is wrapped (``recorded``): the stream's key is its last key and the record's spec its
last argument, both taken off before the script runs; its reply says what happened
(taken or refused, and by whom; released or found expired; swapped), and the wrapper
adds the matching entry (``XADD ... MAXLEN ~ n``) and renews the stream's expiry. An
event no script decides (what a worker did about a contention) is ``append``ed: one
pipelined round trip of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .lease import text

Kind = Literal["take", "release", "swap"]

# The reply of each kind of script, read as an outcome: 'ok', 'refused' (with the holder
# when the reply names it) or 'gone'.
_OUTCOME: dict[str, str] = {
    # ACQUIRE, HOLD_AND_PUSH: {1, fence} taken; {0, holder, pttl} refused; {-1} replaced
    "take": """
  if type(reply) == 'table' and reply[1] == 1 then return 'ok', nil end
  if type(reply) == 'table' and reply[1] == 0 then return 'refused', reply[2] end
  return 'gone', nil""",
    # RELEASE, RELEASE_MATCHING: 1 released; 0 nobody held it (expired); -1 another does
    "release": """
  if reply == 1 then return 'ok', nil end
  if reply == 0 then return 'gone', nil end
  return 'refused', nil""",
    # SWAP, SWAP_AND_PUSH: {1, 0} swapped; {0, holder, pttl} not
    "swap": """
  if type(reply) == 'table' and reply[1] == 1 then return 'ok', nil end
  return 'refused', type(reply) == 'table' and reply[2] or nil""",
}


def recorded(script: str, kind: Kind) -> str:
    """``script`` writing its ``Record``'s entry in the same step (see above)."""
    return f"""local history = table.remove(KEYS)
local spec = cjson.decode(table.remove(ARGV))
local function run()
{script}
end
local function outcome(reply){_OUTCOME[kind]}
end
local reply = run()
local happened, holder = outcome(reply)
local event = spec[happened]
if event and event ~= '' then
  local entry = {{'XADD', history, 'MAXLEN', '~', spec.length, '*', 'event', event}}
  if holder and holder ~= '' then
    entry[#entry + 1] = 'holder'
    entry[#entry + 1] = holder
  end
  for _, value in ipairs(spec.fields) do entry[#entry + 1] = value end
  redis.call(unpack(entry))
  redis.call('PEXPIRE', history, spec.ttl)
end
return reply
"""


@dataclass(frozen=True)
class Record:
    """What to write in the history of the lock ``name`` (a lock's own name: a
    companion's hold writes in its lock's history), by outcome: an event name, or ''
    for no entry. ``fields``: what else the entry says (task, task id, ...)."""

    name: str
    ok: str = ""
    refused: str = ""
    gone: str = ""
    fields: Mapping[str, str] = field(default_factory=dict)
    length: int = 100  # entries kept, about (MAXLEN ~)
    ttl_ms: int = 86_400_000  # the stream expires this long after its last entry

    def spec(self) -> str:
        flat = [part for pair in self.fields.items() for part in pair]
        return json.dumps({
            "ok": self.ok, "refused": self.refused, "gone": self.gone, "fields": flat,
            "length": self.length, "ttl": self.ttl_ms,
        })  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """One entry of a lock's history: when (ms since the epoch, the server's clock),
    what, and what else it says."""

    at_ms: int
    event: str
    fields: dict[str, str]


def append(client: Any, key: str, event: str, record: Record) -> None:
    """An entry no script decides, with the stream's expiry renewed: one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.xadd(key, {"event": event, **record.fields}, maxlen=record.length, approximate=True)
    pipe.pexpire(key, record.ttl_ms)
    pipe.execute()


def entries(client: Any, key: str, count: int = 100) -> list[Entry]:
    """The newest ``count`` entries of a history, newest first."""
    found: Sequence[tuple[Any, Mapping[Any, Any]]] = client.xrevrange(key, count=count) or []
    out = []
    for entry_id, raw in found:
        values = {text(k): text(v) for k, v in raw.items()}
        at_ms = int(text(entry_id).split("-", 1)[0])
        out.append(Entry(at_ms, values.pop("event", ""), values))
    return out
