"""The checker itself: it must catch what it is there to catch."""

from __future__ import annotations

from typing import Any

from .checker import check


def run(item: str, task_id: str, fence: int, start: float, end: float) -> dict[str, Any]:
    return {"item": item, "id": task_id, "fence": fence, "start": start, "end": end}


class TestChecker:
    def test_a_clean_log_passes(self) -> None:
        log = [run("k", "a", 1, 0.0, 1.0), run("k", "b", 2, 1.0, 2.0), run("j", "c", 1, 0.5, 3)]
        verdict = check(log, submitted=["a", "b", "c"], exactly_once=True)
        assert verdict.ok, verdict.summary()
        assert verdict.keys == 2

    def test_planted_overlap_is_caught(self) -> None:
        log = [run("k", "a", 1, 0.0, 1.0), run("k", "b", 2, 0.9, 2.0)]
        verdict = check(log)
        assert not verdict.ok
        assert len(verdict.overlaps) == 1

    def test_planted_fence_regression_is_caught(self) -> None:
        log = [run("k", "a", 5, 0.0, 1.0), run("k", "b", 5, 1.0, 2.0), run("k", "c", 4, 2, 3)]
        verdict = check(log)
        assert len(verdict.fence_regressions) == 2

    def test_missing_and_duplicated_tasks_are_caught(self) -> None:
        log = [run("k", "a", 1, 0.0, 1.0), run("k", "a", 2, 1.0, 2.0)]
        verdict = check(log, submitted=["a", "b"], exactly_once=True)
        assert verdict.missing == ["b"]
        assert verdict.duplicated == ["a"]
        assert check(log, submitted=["a", "b"], at_most_once=True).missing == []

    def test_unlocked_runs_are_set_aside_unless_forbidden(self) -> None:
        log = [run("k", "a", 0, 0.0, 1.0), run("k", "b", 0, 0.5, 2.0)]
        assert check(log).ok
        assert check(log).unlocked == 2
        assert not check(log, allow_unlocked=False).ok
