"""Figures for the figures pages, drawn with matplotlib from a run's numbers, as SVG text.

``grouped_bars``: bars per group and series (the benchmark ratios side by side), each
with the spread of the run's rounds as an error bar, and the plain-Celery line at 1.0.
``timeline``: a per-second series with event marks (the soak's executions and kills).
``panels``: a dashboard's panels drawn still from its queries' answers (docs/img/dashboard.svg).
The SVG keeps its text as text and carries no date, so a page's figures change only
when its numbers do.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit

import matplotlib.pyplot as plt  # (after the backend is chosen)
from matplotlib.figure import Figure

STYLE: Any = {  # matplotlib types its rc keys as a Literal of every name
    "svg.fonttype": "none",  # text stays text: searchable, and small
    "svg.hashsalt": "celery-singleton-lock",  # the same ids every run
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def _svg(figure: Figure) -> str:
    out = io.StringIO()
    figure.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    return out.getvalue()


def grouped_bars(
    title: str,
    groups: Sequence[str],
    series: Sequence[str],
    values: Mapping[tuple[str, str], float],
    *,
    spread: Mapping[tuple[str, str], tuple[float, float]] | None = None,
    reference: float | None = 1.0,
) -> str:
    """Bars of ``values[(group, series)]``, one cluster per group, a legend per series;
    ``spread[(group, series)]``: (lowest, highest) of the rounds, drawn as an error bar."""
    spreads = spread or {}
    with plt.rc_context(STYLE):
        figure, axes = plt.subplots(figsize=(8, 3.6))
        width = 0.8 / max(len(series), 1)
        for s, name in enumerate(series):
            xs = [g + (s - (len(series) - 1) / 2) * width for g in range(len(groups))]
            heights = [values.get((group, name), math.nan) for group in groups]
            low, high = [], []
            for group, height in zip(groups, heights, strict=True):
                lo, hi = spreads.get((group, name), (height, height))
                shown = not math.isnan(height)
                low.append(max(0.0, height - lo) if shown else 0.0)
                high.append(max(0.0, hi - height) if shown else 0.0)
            bars = axes.bar(
                xs, heights, width * 0.95, label=name, yerr=[low, high], capsize=2,
                error_kw={"elinewidth": 0.8, "ecolor": "#424242"},
            )  # fmt: skip
            # Inside the bar: above it stands the error bar.
            labels = ["" if math.isnan(h) else f"{h:g}" for h in heights]
            axes.bar_label(bars, labels=labels, label_type="center", fontsize=7, color="white")
        if reference is not None:
            axes.axhline(
                reference, color="black", linestyle="--", linewidth=0.9,
                label=f"plain Celery = {reference:g}",
            )  # fmt: skip
        axes.set_xticks(range(len(groups)), list(groups))
        axes.set_ylabel("ratio to plain Celery")
        axes.set_title(title)
        axes.grid(axis="y", alpha=0.3)
        axes.set_axisbelow(True)
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncols=3, frameon=False)
        return _svg(figure)


def timeline(
    title: str, per_second: Sequence[float], marks: Sequence[float], *, label: str, mark: str
) -> str:
    """``per_second[i]`` as a line over seconds, with a red line at each of ``marks`` (s)."""
    with plt.rc_context(STYLE):
        figure, axes = plt.subplots(figsize=(8, 3.2))
        seconds = [i + 0.5 for i in range(len(per_second))]
        axes.plot(seconds, list(per_second), color="#3f51b5", linewidth=1.3, label=label)
        for n, at in enumerate(marks):
            axes.axvline(
                at, color="#e53935", linewidth=0.8, alpha=0.6, label=mark if n == 0 else None
            )
        axes.set_xlim(0, max(len(per_second), 1))
        axes.set_ylim(bottom=0)
        axes.set_xlabel("seconds into the run")
        axes.set_ylabel(label)
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=2, frameon=False)
        return _svg(figure)


# One line of a panel: its legend, then its points' times (s) and values (NaN: a gap).
Line = tuple[str, Sequence[float], Sequence[float]]


def panels(
    title: str,
    shown: Sequence[tuple[str, str, Sequence[Line]]],
    *,
    columns: int = 2,
    empty: str = "no data",
) -> str:
    """A dashboard drawn still: each of ``shown`` (a panel's title, its unit, its lines)
    in a grid of ``columns``, its lines over seconds, a panel without any saying ``empty``."""
    rows = max(1, math.ceil(len(shown) / columns))
    with plt.rc_context({**STYLE, "font.size": 8}):
        figure, grid = plt.subplots(
            rows, columns, figsize=(11, 2.6 * rows), squeeze=False, layout="constrained",
            sharex=True,
        )  # fmt: skip
        for n, axes in enumerate(grid.flat):
            if n >= len(shown):
                axes.set_visible(False)
                continue
            name, unit, lines = shown[n]
            axes.set_title(name, loc="left", fontsize=9)
            axes.set_ylabel(unit)
            axes.grid(alpha=0.3)
            for label, xs, ys in lines:
                axes.plot(list(xs), list(ys), linewidth=1.2, label=label)
            if lines:
                axes.legend(loc="upper left", fontsize=6, frameon=False, ncols=2)
            else:
                axes.text(0.5, 0.5, empty, transform=axes.transAxes, ha="center", color="#757575")
        for axes in grid[-1]:
            axes.set_xlabel("seconds into the run")
        figure.suptitle(title, fontsize=11)
        return _svg(figure)
