"""SVG charts for the figures pages, drawn from a run's numbers (no plotting library).

``grouped_bars``: bars per group and series (the benchmark ratios side by side, with the
plain-Celery line at 1.0). ``timeline``: a per-second series with event marks (the soak's
executions and kills). Both return an SVG document as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

COLOURS = ("#9e9e9e", "#ff8a65", "#ffd54f", "#3f51b5", "#26a69a", "#ab47bc")
FONT = 'font-family="sans-serif" font-size="12"'
SMALL = 'font-family="sans-serif" font-size="10"'


def _frame(title: str, size: tuple[int, int], axis: tuple[int, float, int]) -> list[str]:
    """The document, its background, its title and the x axis (left, height, right)."""
    (width, height), (left, base, right) = size, axis
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" {FONT} font-weight="bold">'
        f"{escape(title)}</text>",
        f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="black"/>',
    ]


def grouped_bars(
    title: str,
    groups: Sequence[str],
    series: Sequence[str],
    values: dict[tuple[str, str], float],
    *,
    reference: float | None = 1.0,
    unit: str = "x",
) -> str:
    """Bars of ``values[(group, series)]``, one cluster per group, a legend per series."""
    width, height, left, bottom, top = 760, 300, 50, 60, 40
    plot_w, plot_h = width - left - 20, height - top - bottom
    peak = max([*values.values(), reference or 0.0, 0.1]) * 1.15
    slot = plot_w / max(len(groups), 1)
    bar = slot * 0.8 / max(len(series), 1)

    def y(value: float) -> float:
        return top + plot_h - value / peak * plot_h

    out = _frame(title, (width, height), (left, top + plot_h, left + plot_w))
    for g, group in enumerate(groups):
        x0 = left + g * slot + slot * 0.1
        for s, name in enumerate(series):
            value = values.get((group, name))
            if value is None:
                continue
            x = x0 + s * bar
            out.extend(
                (
                    f'<rect x="{x:.1f}" y="{y(value):.1f}" width="{bar - 2:.1f}" '
                    f'height="{top + plot_h - y(value):.1f}" fill="{COLOURS[s % len(COLOURS)]}">'
                    f"<title>{escape(name)}: {value:g}{unit}</title></rect>",
                    f'<text x="{x + bar / 2 - 1:.1f}" y="{y(value) - 3:.1f}" text-anchor="middle" '
                    f"{SMALL}>{value:g}</text>",
                )
            )
        out.append(
            f'<text x="{left + g * slot + slot / 2:.1f}" y="{top + plot_h + 16}" '
            f'text-anchor="middle" {FONT}>{escape(group)}</text>'
        )
    if reference is not None:
        out.append(
            f'<line x1="{left}" y1="{y(reference):.1f}" x2="{left + plot_w}" '
            f'y2="{y(reference):.1f}" stroke="black" stroke-dasharray="4 3"/>'
            f'<text x="{left - 4}" y="{y(reference) + 4:.1f}" text-anchor="end" {FONT}>'
            f"{reference:g}{unit}</text>"
        )
    for s, name in enumerate(series):
        x = left + s * 150
        out.append(
            f'<rect x="{x}" y="{height - 22}" width="12" height="12" '
            f'fill="{COLOURS[s % len(COLOURS)]}"/>'
            f'<text x="{x + 16}" y="{height - 12}" {FONT}>{escape(name)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def timeline(
    title: str, per_second: Sequence[float], marks: Sequence[float], *, label: str, mark: str
) -> str:
    """``per_second[i]`` as a line over seconds, with a red tick at each of ``marks`` (s)."""
    width, height, left, bottom, top = 760, 260, 50, 50, 40
    plot_w, plot_h = width - left - 20, height - top - bottom
    seconds = max(len(per_second), 1)
    peak = max([*per_second, 1.0]) * 1.15

    def x(second: float) -> float:
        return left + second / seconds * plot_w

    def y(value: float) -> float:
        return top + plot_h - value / peak * plot_h

    points = " ".join(f"{x(i + 0.5):.1f},{y(v):.1f}" for i, v in enumerate(per_second))
    out = [
        *_frame(title, (width, height), (left, top + plot_h, left + plot_w)),
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" {FONT}>{peak / 1.15:.0f}</text>',
        f'<text x="{left + plot_w}" y="{top + plot_h + 16}" text-anchor="end" {FONT}>'
        f"{seconds} s</text>",
    ]
    out += [
        f'<line x1="{x(m):.1f}" y1="{top}" x2="{x(m):.1f}" y2="{top + plot_h}" '
        'stroke="#e53935" stroke-width="1" opacity="0.6"/>'
        for m in marks
    ]
    out.append(f'<polyline points="{points}" fill="none" stroke="#3f51b5" stroke-width="1.5"/>')
    out.append(
        f'<line x1="{left}" y1="{height - 16}" x2="{left + 14}" y2="{height - 16}" '
        f'stroke="#3f51b5" stroke-width="2"/><text x="{left + 18}" y="{height - 12}" {FONT}>'
        f'{escape(label)}</text><line x1="{left + 260}" y1="{height - 22}" x2="{left + 260}" '
        f'y2="{height - 10}" stroke="#e53935"/><text x="{left + 266}" y="{height - 12}" '
        f"{FONT}>{escape(mark)}</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"
