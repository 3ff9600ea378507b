"""Locks as ``celery singleton list`` prints them: one fixed-width line per hold."""

from __future__ import annotations

from .._time import human
from .locks import LockRow

COLUMNS = (
    ("STATE", 9),
    ("AGE", 8),
    ("TTL", 8),
    ("FENCE", 16),
    ("TASK ID", 36),
    ("WORKER", 24),
    ("PID", 7),
    ("TASK", 28),
    ("NAME", 0),
)


def cells(row: LockRow) -> list[str]:
    def text(value: object) -> str:
        return "-" if value is None else str(value)

    name = row.name
    if row.state == "limited":
        name += f" ({text(row.remaining)} may start now, next in {human(row.next_slot)})"
    return [
        row.state,
        human(row.age),
        human(row.ttl),
        text(row.fence),
        text(row.task_id),
        text(row.worker),
        text(row.pid),
        text(row.task),
        name,
    ]


def line(cells: list[str], columns: tuple[tuple[str, int], ...] = COLUMNS) -> str:
    out = []
    for (_, width), cell in zip(columns, cells, strict=True):
        fitted = cell[: width - 1] + "~" if width and len(cell) > width else cell
        out.append(fitted.ljust(width) if width else fitted)
    return " ".join(out).rstrip()
