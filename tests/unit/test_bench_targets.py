"""The bench's targets (benchmarks/targets.py): each checked against a run's figures, and
section 8's per-process "what is left" computed from its CPU table."""

from __future__ import annotations

from typing import Any

from benchmarks.targets import checks, left


def ratios(section: str, field: str, **systems: float) -> dict[str, dict[str, Any]]:
    return {section: {name: {field: value} for name, value in systems.items()}}


def run(unique: dict[str, float], duplicate: dict[str, float], e2e: dict[str, float]) -> dict:
    return {
        **ratios("dispatch_unique", "ratio", **unique),
        **ratios("dispatch_duplicate", "ratio_to_plain_delay", **duplicate),
        **ratios("end_to_end", "ratio", **e2e),
    }


INCUMBENTS = {"celery_singleton": 1.3, "celery_once": 1.4}


def test_default_targets_are_fixed_ratios_and_celery_singleton_s_throughput() -> None:
    results = run(
        {"plain": 1.0, **INCUMBENTS, "this": 1.0},
        {"plain": 1.0, **INCUMBENTS, "this": 0.31},
        {"plain": 1.0, "celery_singleton": 0.89, "celery_once": 0.95, "this": 0.89},
    )
    found = checks("default", results)
    assert [(row["target"], row["reached"]) for row in found.values()] == [
        ("unique dispatch", "yes"),  # equal to the goal counts
        ("refused duplicate", "no"),
        ("end to end", "no"),
        ("end to end", "no"),  # equal to celery-singleton's is not above it
    ]
    assert found["4"]["goal"] == "> celery-singleton's (0.89)"
    results["end_to_end"]["this"]["ratio"] = 0.98
    assert [row["reached"] for row in checks("default", results).values()][2:] == ["yes", "yes"]


def test_the_better_incumbent_is_the_lower_dispatch_and_the_higher_throughput() -> None:
    results = run(
        {"plain": 1.0, "celery_singleton": 1.5, "celery_once": 1.2, "this": 1.3},
        {"plain": 1.0, **INCUMBENTS, "this": 0.3},
        {"plain": 1.0, "celery_singleton": 0.82, "celery_once": 0.9, "this": 0.86},
    )
    found = checks("rabbitmq", results)
    assert found["1"]["goal"] == "≤ the better incumbent's (1.2)"
    assert found["1"]["reached"] == "no"
    assert found["2"]["goal"] == "≥ the better incumbent's minus 0.03 (0.87)"
    assert found["2"]["reached"] == "no"
    results["end_to_end"]["this"]["ratio"] = 0.87
    assert checks("rabbitmq", results)["2"]["reached"] == "yes"


def test_a_run_without_a_section_checks_only_what_it_measured() -> None:
    only = ratios(
        "end_to_end", "ratio", plain=1.0, celery_singleton=0.9, celery_once=0.8, this=0.93
    )
    assert [row["target"] for row in checks("separate", only).values()] == ["end to end"]
    assert checks("separate", {}) == {}


def test_what_is_left_is_each_process_over_plain_beside_the_better_incumbent() -> None:
    cost = {
        "plain": {"producer_us": 600, "worker_main_us": 900, "pool_children_us": 700,
                  "redis_us": 300, "total_us": 2500},
        "celery_singleton": {"producer_us": 800, "worker_main_us": 900,
                             "pool_children_us": 900, "redis_us": 350, "total_us": 2950},
        "celery_once": {"producer_us": 780, "worker_main_us": 950, "pool_children_us": 850,
                        "redis_us": 340, "total_us": 2920},
        "this": {"producer_us": 590, "worker_main_us": 1000, "pool_children_us": 950,
                 "redis_us": 400, "total_us": 2940},
    }  # fmt: skip
    rows = left("default", cost)
    assert list(rows) == ["producer", "worker_main", "pool_children", "redis", "total"]
    assert rows["producer"]["this_over_plain_us"] == -10
    assert rows["producer"]["better_incumbent_over_plain_us"] == 180
    assert rows["worker_main"]["better_incumbent_over_plain_us"] == 0
    assert rows["total"]["this_over_plain_us"] == 440
    assert rows["total"]["better_incumbent_over_plain_us"] == 420
    assert "riding the result write" in rows["pool_children"]["pays_for"]
    assert left("default", {"plain": cost["plain"]}) == {}


def test_the_fairness_target_reads_the_round_robin_row_in_runs() -> None:
    waits = ratios("fairness", "late_first_wait_runs", this_fair_first=11.1, this_fair=1.0)
    [fair] = checks("separate", waits).values()
    assert (fair["target"], fair["this_run"], fair["reached"]) == (
        "a late key's first call waits",
        1.0,
        "yes",
    )
    assert fair["goal"] == "≤ 1.50x a run's duration"
    waits["fairness"]["this_fair"]["late_first_wait_runs"] = 2.0
    assert [row["reached"] for row in checks("separate", waits).values()] == ["no"]
