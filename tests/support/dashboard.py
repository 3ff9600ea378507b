"""The shipped Grafana dashboard's panels and queries, with Grafana's variables replaced as
Grafana replaces them before it asks Prometheus, and its legends filled in."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .workers import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "celery-singleton-lock.json"


@dataclass(frozen=True)
class Target:
    """One query of one panel."""

    panel: str  # the panel's title
    unit: str
    ref: str  # its refId: A, B...
    expr: str
    legend: str

    def asked(self, *, interval: float, scrape: float, range_s: float) -> str:
        """The query as Grafana sends it, the task filter at "All" (its ``allValue``):
        ``$__rate_interval`` is max(step + scrape interval, 4 x scrape interval)."""
        rate_interval = max(interval + scrape, 4 * scrape)
        return (
            self.expr.replace("$__rate_interval", f"{rate_interval:g}s")
            .replace("$__range", f"{round(range_s)}s")
            .replace("$task", ".*")
        )

    def label(self, metric: Mapping[str, str], drop: str = "") -> str:
        """The legend Grafana shows for a series: ``{{label}}`` filled in, ``drop`` cut
        from it (a long module prefix)."""
        filled = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m[1], ""), self.legend)
        return filled.replace(drop, "").strip()


def targets(path: Path = DASHBOARD) -> Iterator[Target]:
    board: dict[str, Any] = json.loads(path.read_text())
    for panel in board["panels"]:
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        for target in panel["targets"]:
            yield Target(
                panel["title"], unit, target["refId"], target["expr"], target["legendFormat"]
            )


def points(values: list[list[Any]], step: float) -> tuple[list[float], list[float]]:
    """A range query's [time, text] pairs as times and numbers, NaN where not finite and
    between two points more than a step apart (no answer there: a gap, as Grafana draws)."""
    times: list[float] = []
    numbers: list[float] = []
    for at, text in values:
        if times and float(at) - times[-1] > 1.5 * step:
            times.append((times[-1] + float(at)) / 2)
            numbers.append(math.nan)
        number = float(text)
        times.append(float(at))
        numbers.append(number if math.isfinite(number) else math.nan)
    return times, numbers
