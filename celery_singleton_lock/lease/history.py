"""A lock's history: what a store's operation writes in it (``Record``), and its entries.

A lock keeps its entries in ``LockKeys.history`` (its hash tag: one Cluster slot with the lock,
so the lock's own scripts may write it). Each caller of a store's operation says what it
records (``entry=``); how one Redis server writes and reads them: ``lease.redis.recording``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["take", "release", "swap", "read", "rate"]


@dataclass(frozen=True)
class Record:
    """What to write in the history stream ``key`` (its lock's: a companion's hold
    writes in its lock's history) around the operations given it (their ``entry``):
    for each kind of script, the event of each outcome (ok, refused, gone), '' or no
    kind for no entry. ``fields``: what else each entry says (task, task id, ...);
    ``refused``: what else a refusal by a script of a kind says (the decision the caller
    took beforehand: what a worker does about a contention, known before its take)."""

    key: str
    events: Mapping[Kind, tuple[str, str, str]]
    fields: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[Kind, Mapping[str, str]] = field(default_factory=dict)
    length: int = 100  # entries kept, about (MAXLEN ~)
    ttl_ms: int = 86_400_000  # the stream expires this long after its last entry

    def spec(self, kind: Kind) -> str | None:
        """The wrapper's argument for a script of ``kind``; None: nothing to record."""
        ok, refused, gone = self.events.get(kind, ("", "", ""))
        if not (ok or refused or gone):
            return None
        return json.dumps(
            {
                "ok": ok,
                "refused": refused,
                "gone": gone,
                "fields": _flat(self.fields),
                "refused_fields": _flat(self.refused.get(kind, {})),
                "length": self.length,
                "ttl": self.ttl_ms,
            }
        )

    def compact(self) -> str:
        """Its fields, length and ttl as JSON, kept for scripts that write its entries
        later (an attached call's: the steps that send or promote it)."""
        return json.dumps({"f": _flat(self.fields), "n": self.length, "t": self.ttl_ms})


def _flat(fields: Mapping[str, str]) -> list[str]:
    return [part for pair in fields.items() for part in pair]


@dataclass(frozen=True)
class Entry:
    """One entry of a lock's history: when (ms since the epoch, the server's clock),
    what, and what else it says."""

    at_ms: int
    event: str
    fields: dict[str, str]
