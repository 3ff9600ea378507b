"""Idempotency keys as operators see them: one line, or one object, per key and its first call."""

from __future__ import annotations

import time
from collections.abc import Iterator

from .._time import human
from ..lease.idempotency import Record, idempotency_keys_of

KEY_COLUMNS = (
    ("STATE", 10),
    ("AGE", 8),
    ("EXPIRES", 8),
    ("FIRST CALL", 36),
    ("RUN BY", 36),
    ("TASK", 28),
    ("KEY", 0),
)
# What each state means to whoever repeats the key now.
MEANINGS = {
    "accepted": "sent, not started: a repeat gets its task id",
    "running": "running: a repeat gets its task id",
    "succeeded": "done: a repeat gets its stored result",
    "failed": "failed, kept (keep_failures): a repeat gets the failure",
}


def records(store: object) -> Iterator[Record]:
    """Every idempotency key's record on ``store`` (a lock store)."""
    return idempotency_keys_of(store).records()


def record(store: object, key: str) -> Record | None:
    return idempotency_keys_of(store).read(key)


def as_json(found: Record) -> dict[str, object]:
    return {
        "key": found.key,
        "task": found.task,
        "first_call": found.call,
        "state": found.state,
        "run_by": found.by or None,
        "accepted_at": found.accepted_at,
        "expires_in": found.expires_in,
    }


def key_cells(found: Record) -> list[str]:
    return [
        found.state,
        human(max(0.0, time.time() - found.accepted_at)),
        human(found.expires_in),
        found.call,
        found.by or "-",
        found.task or "-",
        found.key,
    ]


def described(found: Record) -> list[str]:
    """The lines ``celery singleton show KEY`` prints for one key."""
    return [
        f"idempotency key {found.key}",
        f"  task:       {found.task or '-'}",
        f"  first call: {found.call}",
        f"  state:      {found.state} ({MEANINGS.get(found.state, 'unknown')})",
        f"  run by:     {found.by or '-'} (the call whose run is running, or ended it)",
        f"  accepted {human(max(0.0, time.time() - found.accepted_at))} ago, "
        f"expires in {human(found.expires_in)}",
    ]
