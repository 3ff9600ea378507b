"""The external checker: what a chaos run's execution log may and may not contain.

Each execution appends ``{"key", "item", "id", "fence", "start", "end", ...}`` to a log kept
outside the lock store (a separate Redis). After the run, ``check`` asserts:

- no two executions of one key overlap in time;
- per key, fences strictly increase in start order;
- every submitted logical task completed exactly once (``exactly_once=True``, where the
  scenario promises it: acks_late) or at most once (otherwise).

Executions that ran unlocked on purpose (fence 0, fail_open) are excluded from the
overlap and fence checks; a scenario that expects none passes ``allow_unlocked=False``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    executions: int = 0
    keys: int = 0
    overlaps: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = field(default_factory=list)
    fence_regressions: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = field(
        default_factory=list
    )
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unlocked: int = 0

    @property
    def ok(self) -> bool:
        return not (self.overlaps or self.fence_regressions or self.missing or self.duplicated)

    def summary(self) -> str:
        return (
            f"{self.executions} executions of {self.keys} keys: {len(self.overlaps)} overlaps, "
            f"{len(self.fence_regressions)} fence regressions, {len(self.missing)} missing, "
            f"{len(self.duplicated)} duplicated"
        )


def check(
    records: Iterable[Mapping[str, Any]],
    *,
    submitted: Iterable[str] = (),
    exactly_once: bool = False,
    at_most_once: bool = False,
    allow_unlocked: bool = True,
) -> Verdict:
    """Judge an execution log; ``submitted`` are the logical task ids the run sent."""
    records = list(records)
    verdict = Verdict(executions=len(records))
    by_key: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("fence", 0) == 0 and allow_unlocked:
            verdict.unlocked += 1
            continue
        # The lock key when the execution recorded it (two tasks on one item may use two
        # different locks), else the item.
        by_key[str(record.get("key", record["item"]))].append(record)
    verdict.keys = len(by_key)
    for runs in by_key.values():
        runs.sort(key=lambda r: (r["start"], r["end"]))
        for a, b in itertools.pairwise(runs):
            if b["start"] < a["end"]:
                verdict.overlaps.append((a, b))
            if not a["fence"] < b["fence"]:
                verdict.fence_regressions.append((a, b))
    completed: dict[str, int] = defaultdict(int)
    for record in records:
        completed[str(record["id"])] += 1
    for task_id in submitted:
        count = completed.get(task_id, 0)
        if exactly_once and count == 0:
            verdict.missing.append(task_id)
        if (exactly_once or at_most_once) and count > 1:
            verdict.duplicated.append(task_id)
    return verdict


def outage_figures(verdict: Verdict, sent: list[str], ran_during: int) -> dict[str, int]:
    """What a run of ``sent`` across a lock store outage shows (``assert_outage``)."""
    return {
        "tasks": len(sent), "ran_during": ran_during, "ran_unlocked": verdict.unlocked,
        "lost": len(verdict.missing), "duplicated": len(verdict.duplicated),
    }  # fmt: skip


def assert_outage(
    verdict: Verdict, policy: str, sent: list[str], ran_during: int, log: str
) -> None:
    """Each ran once; fail_closed ran none while the store was out of reach and none
    unlocked, fail_open ran every one at once and its worker's log said so."""
    assert verdict.ok, verdict.summary()
    if policy == "fail_closed":
        assert ran_during == 0
        assert verdict.unlocked == 0
    else:
        assert ran_during == len(sent)
        assert "UNLOCKED (fail_open)" in log
