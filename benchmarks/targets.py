"""The speed targets each bench configuration is held to, checked against a run, and what
each process adds per task over plain Celery (section 8's "what is left")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INCUMBENTS = ("celery_singleton", "celery_once")
NAMES = {"celery_singleton": "celery-singleton", "celery_once": "celery-once"}


@dataclass(frozen=True)
class Target:
    """One figure of this project's against a goal: a fixed ratio to plain Celery, an
    incumbent's ratio in the same run, or the better incumbent's (``goal="better"``).

    ``lower``: lower is better (dispatch); else higher is (throughput). ``margin``: added
    to an incumbent's figure (``-0.03``: "the better incumbent's minus 0.03"). ``strict``:
    the figure must beat the goal, not only equal it. ``against``: what the section's
    ratios are to (dispatch: plain Celery alone in its process, each system in its own).
    ``row``: the section's row of this project's figure.
    """

    what: str
    section: str  # the results' key
    field: str  # the ratio's field in that section
    lower: bool
    goal: float | str  # a ratio, an incumbent's name, or "better"
    margin: float = 0.0
    strict: bool = False
    against: str = "plain"
    row: str = "this"

    def wanted(self, results: dict[str, Any]) -> float | None:
        """The goal as a ratio in this run (None: the run lacks the figures)."""
        rows = results.get(self.section)
        if rows is None:
            return None
        if isinstance(self.goal, float):
            return self.goal
        names = INCUMBENTS if self.goal == "better" else (self.goal,)
        if any(name not in rows for name in names):
            return None
        figures = [float(rows[name][self.field]) for name in names]
        best = min(figures) if self.lower else max(figures)
        return round(best + self.margin, 2)

    def goal_text(self, wanted: float) -> str:
        sign = ("<" if self.strict else "≤") if self.lower else (">" if self.strict else "≥")
        if isinstance(self.goal, float):
            return f"{sign} {wanted:.2f}x {self.against}"
        whose = "the better incumbent's" if self.goal == "better" else f"{NAMES[self.goal]}'s"
        margin = ""
        if self.margin:
            margin = f" {'plus' if self.margin > 0 else 'minus'} {abs(self.margin):.2f}"
        return f"{sign} {whose}{margin} ({wanted})"

    def check(self, results: dict[str, Any]) -> dict[str, Any] | None:
        """This run's figure, the goal and whether it was reached (None: not measured)."""
        wanted = self.wanted(results)
        rows = results.get(self.section, {})
        if wanted is None or self.row not in rows:
            return None
        got = float(rows[self.row][self.field])
        if self.lower:
            reached = got < wanted if self.strict else got <= wanted
        else:
            reached = got > wanted if self.strict else got >= wanted
        return {
            "target": self.what,
            "goal": self.goal_text(wanted),
            "this_run": got,
            "reached": "yes" if reached else "no",
        }


UNIQUE = ("unique dispatch", "dispatch_unique", "ratio", True)
DUPLICATE = ("refused duplicate", "dispatch_duplicate", "ratio_to_plain_delay", True)
END_TO_END = ("end to end", "end_to_end", "ratio", False)
# The dispatch sections' control (run.py's CONTROL): their every ratio is to it.
ALONE = "plain alone"
# Issue 61: with one key flooding, another key's first call waits about one run.
FAIR = Target(
    "a late key's first call waits", "fairness", "late_first_wait_runs", lower=True,
    goal=1.5, against="a run's duration", row="this_fair",
)  # fmt: skip

TARGETS = {
    "default": (
        Target(*UNIQUE, goal=1.0, against=ALONE),
        Target(*DUPLICATE, goal=0.30, against=ALONE),
        Target(*END_TO_END, goal=0.97),
        Target(*END_TO_END, goal="celery_singleton", strict=True),
        FAIR,
    ),
    "separate": (
        Target(*UNIQUE, goal="better"),
        Target(*END_TO_END, goal=0.92),
        FAIR,
    ),
    "rabbitmq": (
        Target(*UNIQUE, goal="better"),
        Target(*END_TO_END, goal="better", margin=-0.03),
        FAIR,
    ),
}


def checks(config: str, results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each of ``config``'s targets checked against ``results``, by a row name."""
    found = {}
    for number, target in enumerate(TARGETS.get(config, ()), start=1):
        checked = target.check(results)
        if checked is not None:
            found[str(number)] = checked
    return found


# What this project's part of each process pays for, per configuration: the rows of
# section 8's "what is left" (docs/design.md says the same in its round-trip table).
PAYS_FOR = {
    "default": {
        "producer": "the key from the arguments; the hold rides the push (one script: "
        "hold, LPUSH and the transit note, in place of Celery's LPUSH)",
        "worker_main": "the fenced running lease, written with the script that records "
        "the message as unacked and clears its transit note (one command where kombu sends "
        "a four-command transaction; an ack's removal two); the lease handed to the child",
        "pool_children": "the run under the handed lease (renewed by a thread that "
        "sleeps until it is due); the release riding the result write, which reads the "
        "stored result in its own step (Celery reads it on a round trip first)",
        "redis": "the scripts in place of plain commands: hold + push + note, the take "
        "and the record + clear, release + the result's write",
    },
    "separate": {
        "producer": "the key; the hold on the lock server (its own round trip, "
        "overlapped with Celery building the message); the push with its transit note "
        "(a script on the broker in place of LPUSH)",
        "worker_main": "the running lease taken on the lock server at receipt (its own "
        "round trip; the answer read as the run is handed to the pool); the note cleared "
        "in the script that records the message as unacked (one command where kombu "
        "sends a four-command transaction; an ack's removal two)",
        "pool_children": "the run under the handed lease; the release on the lock server "
        "(its own round trip: results ignored, nothing to ride)",
        "broker": "the transit note: written with the push, cleared in the unacked "
        "record (two scripts, the second in place of kombu's transaction)",
        "locks": "hold, take and release (three scripts)",
    },
    "rabbitmq": {
        "producer": "the key; the hold on the Redis (its own round trip, overlapped with "
        "Celery building the message)",
        "worker_main": "the running lease taken at receipt (its own round trip; the "
        "answer read as the run is handed to the pool); nothing rides on AMQP",
        "pool_children": "the run under the handed lease; the release riding the result "
        "write, which reads the stored result in its own step",
        "redis": "hold, take and release + the result's write (three scripts, and one "
        "in place of Celery's write)",
        "rabbitmq": "the lock's headers in every message",
    },
}


def left(config: str, cost: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per process: this project's CPU per task over plain Celery's, the better
    incumbent's over plain's, and what this project's part pays for."""
    plain, this = cost.get("plain"), cost.get("this")
    if plain is None or this is None:
        return {}
    rows = {}
    for process, pays in PAYS_FOR.get(config, {}).items():
        field = f"{process}_us"
        if field not in plain or field not in this:
            continue
        over = [cost[name][field] - plain[field] for name in INCUMBENTS if name in cost]
        rows[process] = {
            "plain_us": plain[field],
            "this_over_plain_us": this[field] - plain[field],
            "better_incumbent_over_plain_us": min(over) if over else "",
            "pays_for": pays,
        }
    if rows:
        over = [cost[name]["total_us"] - plain["total_us"] for name in INCUMBENTS if name in cost]
        rows["total"] = {
            "plain_us": plain["total_us"],
            "this_over_plain_us": this["total_us"] - plain["total_us"],
            "better_incumbent_over_plain_us": min(over) if over else "",
            "pays_for": "",
        }
    return rows
