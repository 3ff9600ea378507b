"""An app's locks as an operator sees them: what ``celery singleton`` lists and releases.

Rows with state, task, worker and age, and whether each holder is still alive. Reading the
lock store never asks a worker anything; ``liveness.Liveness`` does, through Celery's remote
control (ping, then ``inspect``), and looks for queued messages in the broker.
"""

from __future__ import annotations

import re
import string
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..config.options import is_singleton
from ..config.stores import LockStores
from ..lease import LockStore, ReleaseResult
from ..lease.attachments import attachments_of
from ..lease.history import Record
from ..lease.limits.rates import budget
from ..lease.names import Held
from ..modes import RateSpec, shown_state
from ..tokens import read_token
from .lock_history import lock_name_of

if TYPE_CHECKING:
    from celery import Celery

    from ..config.options import SingletonOptions


STATES = ("queued", "reserved", "running", "throttled", "limited", "held")
# The states of a call holding its key: the holders a canvas member may attach to.
HOLDING = ("queued", "reserved", "running")


@dataclass(frozen=True)
class LockRow:
    """One held lock (a key, a pending call's hold, a throttle window or one slot)."""

    name: str  # the lock's name; a companion's role follows in brackets
    key: str  # its Redis key
    task: str | None  # the task whose lock it is, where the name tells
    task_id: str | None
    state: str  # one of STATES ("held": a value this library did not write)
    worker: str | None
    pid: int | None
    age: float | None  # seconds since the hold was taken
    ttl: float | None  # seconds left; None: no expiry
    fence: int | None
    lock_name: str  # what the store's calls take (companions included)
    base_name: str  # the lock this row belongs to (a companion's or slot's owner)
    role: str | None
    token: str
    # A rate's row (state "limited"): the runs that may start now, and in how many
    # seconds the next may (None where the task's rate cannot be told).
    remaining: int | None = None
    next_slot: float | None = None

    def as_json(self) -> dict[str, object]:
        fields = ("name", "key", "task", "task_id", "state", "worker", "pid")
        data: dict[str, object] = {field: getattr(self, field) for field in fields}
        data.update(
            age=None if self.age is None else round(self.age, 3),
            ttl=None if self.ttl is None else round(self.ttl, 3),
            fence=self.fence,
            role=self.role,
        )
        if self.state == "limited":
            data.update(
                remaining=self.remaining,
                next_slot=None if self.next_slot is None else round(self.next_slot, 3),
            )
        return data

    def matches(self, ref: str) -> bool:
        """Whether ``ref`` names this row: its key, its lock's name, or its task id."""
        return ref in (self.key, self.base_name, self.lock_name, self.task_id)


class TaskNames:
    """Which of the app's singleton tasks a lock name belongs to, where the name tells.

    A key derived from arguments starts with the task's name; a format-string key
    (``"request:{request_idx}"``) is matched against each task's template, and counts
    only when exactly one task's template matches. A callable's names cannot be told.
    """

    def __init__(self, app: Celery) -> None:
        self._names: set[str] = set()
        self._templates: list[tuple[re.Pattern[str], str]] = []
        self._rates: dict[str, RateSpec] = {}
        for name, task in sorted(app.tasks.items()):
            if not is_singleton(task):
                continue
            self._names.add(name[:128])
            options = task.singleton_options()
            if options.rate is not None:
                self._rates[name] = options.rate
            key = options.key.key
            if isinstance(key, str):
                self._templates.append((_template(key), name))

    def of(self, lock_name: str) -> str | None:
        found = self.all_of(lock_name)
        return found.pop() if len(found) == 1 else None

    def all_of(self, lock_name: str) -> set[str]:
        """Every task whose locks may be named ``lock_name`` (several share a template)."""
        head, sep, digest = lock_name.rpartition(":")
        if sep and head in self._names and len(digest) == 64:
            return {head}
        return {task for pattern, task in self._templates if pattern.fullmatch(lock_name)}

    def budget(self, task: str | None, ahead: float | None) -> tuple[int | None, float | None]:
        """(runs that may start now, seconds until the next may) of a rate of ``task``
        whose schedule runs ``ahead`` seconds ahead of now (its key's time to live)."""
        spec = self._rates.get(task or "")
        if spec is None or ahead is None:
            return None, None
        if spec.limits is None:  # a plan: its answer for the key is not known here
            return (0, ahead) if spec.burst == 1 else (None, None)
        # The key's time to live is its furthest limit's: each one is read as that far
        # ahead, which may say less room than there is, never more.
        answers = [budget(limit.rate, ahead) for limit in spec.limits]
        return min(n for n, _ in answers), max(wait for _, wait in answers)


def _template(key: str) -> re.Pattern[str]:
    parts = [
        re.escape(text) + ("" if field is None else ".+?")
        for text, field, _, _ in string.Formatter().parse(key)
    ]
    return re.compile("".join(parts), re.DOTALL)


def rows(held: Iterable[Held], names: TaskNames, now: float | None = None) -> Iterator[LockRow]:
    """Each held lock as a row (streamed: memory stays bounded by the store's batch)."""
    now = time.time() if now is None else now
    for item in held:
        holder = read_token(item.token)
        state = shown_state(item.role, holder.state or "held")  # as its mode shows it
        task = names.of(item.name)
        remaining = next_slot = None
        limited = state == "limited"  # a rate's key: its budget, and no call's task id
        if limited:
            remaining, next_slot = names.budget(task, item.ttl)
        shown = item.name if item.role is None else f"{item.name} [{item.role}]"
        yield LockRow(
            name=shown,
            key=item.key,
            task=task,
            task_id=None if limited else holder.task_id,
            state=state,
            worker=holder.worker,
            pid=holder.pid,
            age=None if holder.since is None else max(0.0, now - holder.since),
            ttl=item.ttl,
            fence=item.fence,
            lock_name=item.full_name,
            base_name=item.name,
            role=item.role,
            token=item.token,
            remaining=remaining,
            next_slot=next_slot,
        )


def app_rows(app: Celery, store: LockStore, batch: int = 1000) -> Iterator[LockRow]:
    """Every lock of ``app``'s lock store ``store`` as a row (the CLI's and the tests')."""
    return rows(store.holdings(batch=batch), TaskNames(app))


def family_rows(app: Celery, store: LockStore, ref: str) -> list[LockRow]:
    """The family of the lock ``ref`` names (its name, or any Redis key of it): its own,
    its companions', its slots', its rate's. One round trip, however many locks there are."""
    return list(rows(store.holdings(of=lock_name_of(store.prefix, ref)), TaskNames(app)))


def release(store: LockStore, row: LockRow, record: Record | None = None) -> ReleaseResult:
    """Owner-checked: frees the lock only if ``row``'s holder still holds it (its history
    records it, with ``operator_record``)."""
    return store.release_token(row.lock_name, row.token, entry=record)


def operator_record(app: Celery, row: LockRow, by: str) -> Record | None:
    """An operator's release, for the history of ``row``'s lock if its task keeps one
    (the app's setting, where the task cannot be told)."""
    task = app.tasks.get(row.task) if row.task else None
    events = {"release": ("released by operator", "", "expired")}
    if task is not None and is_singleton(task):
        record = task.singleton_context.record(row.lock_name, row.task_id, **events)
    else:
        config, store = LockStores.for_app(app).config, LockStores.for_app(app).lock
        kept = config.history and getattr(store, "keeps_history", False)
        record = (
            Record(
                store.keys(row.base_name).history,
                events,  # type: ignore[arg-type]
                {"id": row.task_id or ""},
                length=config.history_length,
                ttl_ms=round(config.history_ttl * 1000),
            )
            if kept
            else None
        )
    return None if record is None else replace(record, fields={**record.fields, "by": by})


def new_call(opts: SingletonOptions | None, members: list[LockRow]) -> str:
    """What a new call of the task of ``opts`` with these arguments would get now (its
    mode says, a refused one as its refusal answers it)."""
    if opts is None:
        return "unknown: the lock's task cannot be told from its name"
    return opts.mode.new_call({row.role: row for row in members})


def attached_calls(store: LockStore, name: str) -> list[dict[str, object]]:
    """The canvas members attached to ``name``'s holder, waiting for its end (none where
    the store keeps no attachments), each with its holder's task id and whether a
    worker's sweep is sending it now."""
    attachments = attachments_of(store)
    if attachments is None:
        return []
    _, waiting = attachments.listed(name)
    return [
        {"task_id": call.task_id, "holder": call.holder, "sending": call.claimed}
        for call in sorted(waiting, key=lambda call: call.task_id)
    ]


def attached_counts(store: LockStore, rows: Iterable[LockRow]) -> dict[str, int] | None:
    """How many canvas members wait for each of ``rows``' holders, by the row's key (one
    round trip; a row with none, or a companion, is left out). None: the store keeps no
    attachments."""
    attachments = attachments_of(store)
    if attachments is None:
        return None
    holders = [row for row in rows if row.role is None and row.state in HOLDING]
    counts = attachments.counts([row.base_name for row in holders]) if holders else []
    return {row.key: count for row, count in zip(holders, counts, strict=True) if count}


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``5m``, ``1h``, ``2d`` (or a sum: ``1h30m``)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    parts = re.fullmatch(r"(?:\d+(?:\.\d+)?[smhd])+", text)
    if not parts:
        raise ValueError(f"not a duration: {text!r} (use seconds or e.g. 90s, 5m, 1h, 1h30m)")
    return sum(
        float(number) * units[unit] for number, unit in re.findall(r"(\d+(?:\.\d+)?)([smhd])", text)
    )
