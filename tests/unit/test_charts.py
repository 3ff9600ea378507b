"""The figures pages' charts (benchmarks/charts.py): matplotlib SVG with the run's numbers
as text, the rounds' spread as error bars, and no date, so a redraw changes nothing."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from benchmarks.charts import grouped_bars, panels, timeline

SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)  # noqa: S314  (our own output)
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def bars(spread: dict[tuple[str, str], tuple[float, float]] | None = None) -> str:
    values = {("dispatch", "plain"): 1.0, ("dispatch", "ours"): 0.96, ("duplicate", "ours"): 0.34}
    return grouped_bars(
        "Ratios", ["dispatch", "duplicate"], ["plain", "ours"], values, spread=spread
    )


def test_bars_show_each_value_the_legend_and_the_reference() -> None:
    shown = texts(bars())
    assert {"Ratios", "dispatch", "duplicate", "plain", "ours", "0.96", "0.34"} <= set(shown)
    assert "plain Celery = 1" in shown  # in the legend
    # No bar (plain has no duplicate check): no label either.
    assert shown.count("1") == 1


def test_the_rounds_spread_is_drawn_as_error_bars() -> None:
    without, spread = bars(), bars({("dispatch", "ours"): (0.9, 1.1)})
    assert without != spread
    root = ET.fromstring(spread)  # noqa: S314
    caps = [g for g in root.iter(f"{SVG}g") if g.get("id", "").startswith("LineCollection")]
    assert caps, "an error bar from the lowest to the highest round"


def test_a_redraw_of_the_same_numbers_is_the_same_file() -> None:
    assert bars() == bars()
    assert "<dc:date>" not in bars()


def test_a_timeline_marks_each_event() -> None:
    svg = timeline("Soak", [3, 5, 4, 6], [1.5, 2.5], label="runs ended per second", mark="a kill")
    shown = texts(svg)
    assert {"Soak", "runs ended per second", "a kill", "seconds into the run"} <= set(shown)
    assert svg == timeline(
        "Soak", [3, 5, 4, 6], [1.5, 2.5], label="runs ended per second", mark="a kill"
    )


def test_panels_show_each_title_and_legend_and_say_which_are_empty() -> None:
    lines = [("work accepted", [0.0, 1.0, 2.0], [0.0, 0.5, float("nan")])]
    shown = texts(panels("Board", [("Dispatches", "reqps", lines), ("Copies", "ops", [])]))
    assert {"Board", "Dispatches", "Copies", "work accepted", "reqps", "no data"} <= set(shown)
    assert "seconds into the run" in shown
