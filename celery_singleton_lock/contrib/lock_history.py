"""A lock's history as operators read it: its entries by lock name or key, holders as task ids."""

from __future__ import annotations

from datetime import UTC, datetime

from ..lease import LockStore
from ..lease import history_entries as entries
from ..lease.history import Entry
from ..lease.names import parse_key
from ..tokens import read_token


def entries_of(store: LockStore, ref: str, count: int = 50) -> tuple[str, list[Entry]]:
    """(the lock's name, its newest ``count`` entries) for ``ref``, a lock's name or any
    of its keys (a companion's, its rate's: the lock's history is one)."""
    name = lock_name_of(store.prefix, ref)
    return name, entries(store, store.keys(name).history, count)


def lock_name_of(prefix: str, ref: str) -> str:
    """The lock ``ref`` names: a Redis key of it (its own, a companion's, its rate's), or
    else a lock's name as given."""
    parsed = parse_key(prefix, ref.removesuffix(":rate"))  # a rate's key: its lock's + ':rate'
    return parsed[0] if parsed is not None else ref


def shown(entry: Entry) -> dict[str, str]:
    """An entry as the CLI and the page show it: when (UTC, ISO 8601), what, and the
    rest, a holder's token read as its task id (and state)."""
    at = datetime.fromtimestamp(entry.at_ms / 1000, tz=UTC)
    out = {"at": at.isoformat(timespec="milliseconds"), "event": entry.event}
    for name, value in entry.fields.items():
        holder = read_token(value) if name == "holder" else None
        if holder is not None and holder.task_id:
            out[name] = f"{holder.task_id} ({holder.state})"
        else:
            out[name] = value
    return out
