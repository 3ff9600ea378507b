"""Sizes and figures for the chaos suite.

``CHAOS_SCALE=ci`` (the default, part of the test command) runs every scenario small;
``CHAOS_SCALE=full`` (``python3 scripts/dev.py chaos --full``) runs the sizes the
reliability report quotes. With ``CHAOS_RESULTS=path`` each scenario's figures are
written there as JSON, from which ``scripts/dev.py chaos`` renders docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .net import Net, fresh, net_servers

SCALE = os.environ.get("CHAOS_SCALE", "ci")
SIZES: dict[str, dict[str, float]] = {
    "ci": {
        "storm_processes": 4, "storm_calls": 60,
        "bypass_processes": 4, "bypass_calls": 15, "bypass_keys": 5,
        "child_kills": 8, "worker_kills": 2,
        "restart_keys": 3, "outage_tasks": 6,
        "soak_seconds": 20, "mode_soak_seconds": 20,
    },
    "full": {
        "storm_processes": 8, "storm_calls": 250,
        "bypass_processes": 8, "bypass_calls": 50, "bypass_keys": 10,
        "child_kills": 50, "worker_kills": 20,
        "restart_keys": 10, "outage_tasks": 30,
        "soak_seconds": 600, "mode_soak_seconds": 300,
    },
}  # fmt: skip


def size(name: str) -> int:
    return int(SIZES[SCALE][name])


class Figures:
    """What each scenario measured, printed as it goes and saved for the report."""

    def __init__(self) -> None:
        self.results: dict[str, dict[str, Any]] = {}

    def record(self, scenario: str, **figures: Any) -> None:
        self.results.setdefault(scenario, {}).update(figures)
        shown = ", ".join(f"{k}={v}" for k, v in figures.items())
        print(f"\n[chaos:{scenario}] {shown}")


def per_second(records: list[dict[str, Any]], began: float, seconds: float) -> list[int]:
    """Executions that ended in each second after ``began`` (the soak's timeline)."""
    counts = [0] * max(1, int(seconds + 0.999))
    for record in records:
        at = int(float(record["end"]) - began)
        if 0 <= at < len(counts):
            counts[at] += 1
    return counts


def distribution(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median_s": round(statistics.median(values), 3),
        "max_s": round(max(values), 3),
    }


@pytest.fixture(name="figures", scope="session")
def fixture_figures() -> Iterator[Figures]:
    figures = Figures()
    yield figures
    target = os.environ.get("CHAOS_RESULTS")
    if target:
        Path(target).write_text(
            json.dumps({"scale": SCALE, "results": figures.results}, indent=2, default=str)
        )


@pytest.fixture(name="net_servers", scope="session")
def fixture_net_servers() -> Iterator[Net]:
    """One network namespace and its servers for every partition and clock scenario."""
    yield from net_servers()


@pytest.fixture(name="net")
def fixture_net(net_servers: Net) -> Iterator[Net]:
    yield fresh(net_servers)
    net_servers.ns.heal()
