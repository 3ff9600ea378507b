"""What the test workers recorded: runs, starts, lock keys, and waiting on them."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..conftest import CeleryEnv


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(0.01)


def wait_renewed(leases: Sequence[Any], times: int = 2, timeout: float = 5.0) -> None:
    """Wait until the renewal of each lease has answered ``times`` times more (its expiry
    moved on each time); of two, the first may have been on its way already."""
    for _ in range(times):
        seen = [lease.expires_at for lease in leases]
        wait_for(
            lambda seen=seen: all(
                lease.expires_at > at for lease, at in zip(leases, seen, strict=True)
            ),
            timeout,
            "a renewal of every lease",
        )


def runs(cenv: CeleryEnv) -> list[dict[str, Any]]:
    return [json.loads(r) for r in cenv.checker_client().lrange("runs", 0, -1)]


def started(cenv: CeleryEnv) -> list[dict[str, Any]]:
    return [json.loads(r) for r in cenv.checker_client().lrange("started", 0, -1)]


def dropped(cenv: CeleryEnv, task_id: str) -> list[dict[str, Any]]:
    """The ``copy_dropped`` signals the workers sent for ``task_id`` (recorded by
    ``tasks.records``): each a copy of a holder's message dropped at execution."""
    recorded = (json.loads(r) for r in cenv.checker_client().lrange("signals", 0, -1))
    return [s for s in recorded if s["signal"] == "copy_dropped" and s["task_id"] == task_id]


UNTIL_OPENED = -30.0
"""``seconds`` that hold a test task's run until the test calls ``open_gate`` (at most 30 s):
for a test whose calls must all come while one run is in progress, however slowly a loaded
machine makes them."""


def open_gate(cenv: CeleryEnv, item: str) -> None:
    """Let a run started with ``UNTIL_OPENED`` seconds finish."""
    cenv.checker_client().rpush(f"gate:{item}", 1)


def lock_keys(cenv: CeleryEnv) -> list[bytes]:
    """Our lock keys (fence keys are bookkeeping that expires with the lease)."""
    return [k for k in cenv.lock_client().scan_iter("t:*") if not k.endswith((b":fence",))]


def waiting_for_a_wake_up(cenv: CeleryEnv) -> int:
    """The clients parked on a release's push wake-up (BLPOP) on the lock store's server."""
    clients = cenv.lock_client().client_list()
    # Blocked now (flag b: ``cmd`` is only the last command, so an idle pooled connection
    # whose last wait is over still shows blpop), and not a test task's run held on its
    # gate (``tasks.records.GATE_CLIENT``).
    return sum(
        1 for c in clients if c["cmd"] == "blpop" and "b" in c["flags"] and c["name"] != "test-gate"
    )


def requeued(worker_output: str, task_id: str) -> bool:
    """Whether the worker logged the message of ``task_id`` requeued (``run.resend``)."""
    return f"[{task_id}] requeued in " in worker_output


def assert_no_overlap(records: list[dict[str, Any]]) -> None:
    by_start = sorted(records, key=lambda r: r["start"])
    for a, b in itertools.pairwise(by_start):
        assert a["end"] <= b["start"], f"overlapping executions: {a} and {b}"
        assert a["fence"] < b["fence"], f"fences out of order: {a} and {b}"
