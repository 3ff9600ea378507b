"""Limits operators change at run time: ``limits.set(app, target, ...)``; ``limits list``'s rows.

``target`` is a task's name, a key template shared by tasks or one key's lock name; the most
specific override wins. Each change is kept in the lock store, and every worker decides
with it within a second.
"""

from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass, field, replace

from celery import Celery

from ..config.options import SingletonOptions, is_singleton
from ..config.stores import LockStores
from ..exceptions import ConfigurationError, SingletonLockError
from ..lease import LockStore, append_history
from ..lease.history import Record
from ..lease.limits.overrides import Override, changed, check_weight, overrides_of
from ..lease.limits.rate_forms import burst_for, listed_rates
from ..lease.limits.rates import Rate, parse_rate
from ..signals import limits_changed
from ..signals import send as send_signal
from .locks import TaskNames


def set(
    app: Celery,
    target: str,
    *,
    rate: object = None,
    burst: int | None = None,
    limit: int | None = None,
    paused: bool | None = None,
    weight: float | None = None,
    reset: bool = False,
    by: str | None = None,
) -> Override | None:
    """Change ``target``'s limits now: ``rate`` (one rate or a list, in place of the
    code's, in its order; ``burst`` for each, else the code's burst of the limit in its
    place, checked against what the code charges a call), ``limit`` (in place of ``limit=N``),
    ``paused`` (True: its runs wait, never dropped; False: resumed), ``weight`` (a
    key's share of its task's ``total_limit`` while other keys wait: W turns for every
    one of a key of weight 1), or
    ``reset`` (the code's values again). What is not given is kept. Returns the
    override in force (None after a reset).

    ``target`` is what the change applies to: a task's name (every key of it), a key
    template shared by tasks (``"tenant:{tenant}"``) or one key's lock name
    (``"tenant:acme"``, as ``celery singleton list`` shows it). A key's own override wins
    over its template's, which wins over its task's. Each change is kept in the lock store
    (``lease.limits.overrides``), written in the target's history and announced by the
    ``limits_changed`` signal; every worker decides with it within a second."""
    if not reset and rate is None and limit is None and paused is None and weight is None:
        raise ConfigurationError(
            f"{target!r}: nothing to change; give a rate, a limit, a weight, paused=True "
            "or False, or reset=True"
        )
    tasks = tasks_of(app, target)
    if rate is not None and not all(opts.rate is not None for opts in tasks.values()):
        raise ConfigurationError(
            f"{target!r}: {_names(tasks)} has no rate= in its code; an override changes a "
            "rate the code sets (give the task rate=... first)"
        )
    rates = None if rate is None else _rates(target, rate, burst, tasks)
    if limit is not None and not all(opts.limit is not None for opts in tasks.values()):
        raise ConfigurationError(
            f"{target!r}: {_names(tasks)} has no limit= in its code; an override changes "
            "a limit the code sets (give the task limit=... first)"
        )
    if limit is not None and limit > 1:
        keyed = [name for name, opts in tasks.items() if opts.idempotency.given]
        if keyed:
            # An idempotency key promises one run per key: a copy must not run beside it.
            raise ConfigurationError(
                f"{target!r}: {', '.join(sorted(keyed))} takes idempotency keys, whose "
                f"calls run one at a time: a limit of {limit} would run a copy beside one"
            )
    if weight is not None:
        weight = _weight(target, weight, tasks)
    store = LockStores.for_app(app).lock
    overrides = overrides_of(store)
    by = by or f"{getpass.getuser()}@{socket.gethostname()}"
    old = overrides.all().get(target)
    new = changed(
        None if reset else old,
        target,
        rates=rates,
        limit=limit,
        paused=paused,
        weight=weight,
        by=by,
    )
    overrides.save(new)
    change = _change(reset, rates, limit, paused, weight)
    append_history(
        store,
        Record(store.keys(target).history, {}, {"by": by}),
        "limits " + change,
        now=new.describe(),
    )
    send_signal(limits_changed, None, target, change=change, override=new, by=by)
    return None if new.empty else new


def tasks_of(app: Celery, target: str) -> dict[str, SingletonOptions]:
    """The tasks with a rate or a limit that ``target`` applies to (by name, by key
    template, or the task of one lock name); ConfigurationError naming what to write
    when there are none."""
    found: dict[str, SingletonOptions] = {}
    for name, task in app.tasks.items():
        if not is_singleton(task):
            continue
        opts: SingletonOptions = task.singleton_options()
        if opts.rate is None and opts.limit is None:
            continue
        if target in (name, opts.key.key):
            found[name] = opts
    if not found:  # one key's lock name: the task(s) whose keys it may be
        for owner in TaskNames(app).all_of(target):
            opts = app.tasks[owner].singleton_options()
            if opts.rate is not None or opts.limit is not None:
                found[owner] = opts
    if not found:
        raise ConfigurationError(
            f"no task with a rate or a limit has keys named like {target!r}: give a task's "
            "name (every key of it), its key template ('tenant:{tenant}') or one key's lock "
            "name (celery singleton list shows them)"
        )
    return found


@dataclass(frozen=True)
class LimitRow:
    """One line of ``limits list``: a target, the code's limits and the override."""

    target: str
    task: str | None
    code: str
    override: str
    changed_at: float | None
    changed_by: str
    # A task's calls waiting for their turn of its total (round robin), by key.
    waiting: dict[str, int] = field(default_factory=dict)

    @property
    def waiting_said(self) -> str:
        """``12 waiting their turn, in 3 keys`` ('' when none wait)."""
        if not self.waiting:
            return ""
        return f"{sum(self.waiting.values())} waiting their turn, in {len(self.waiting)} keys"

    def as_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "task": self.task,
            "code": self.code,
            "override": self.override,
            "changed_at": self.changed_at,
            "changed_by": self.changed_by,
            "waiting": self.waiting,
        }


def rows(app: Celery) -> list[LimitRow]:
    """Every task with a rate or a limit (by its name, or its key template), with the
    override in force, then every other override (one key's, or one whose task is
    gone: ``reset`` removes it)."""
    store = LockStores.for_app(app).lock
    overrides = overrides_of(store).all()
    out: list[LimitRow] = []
    seen: list[str] = []
    for name, task in sorted(app.tasks.items()):
        if not is_singleton(task):
            continue
        opts = task.singleton_options()
        if opts.rate is None and opts.limit is None:
            continue
        template = opts.key.key if isinstance(opts.key.key, str) else None
        for target in (name, template):
            if target is None or target in seen:
                continue
            if target == template and template not in overrides:
                continue  # a template shows once it has an override of its own
            seen.append(target)
            row = _row(target, name, code_of(opts), overrides.get(target))
            if target == name:  # the task's row says who waits for its total's turns
                row = replace(row, waiting=_waiting(opts, store))
            out.append(row)
    names = TaskNames(app)
    for target, override in sorted(overrides.items()):
        if target not in seen:
            task = names.of(target)
            opts = app.tasks[task].singleton_options() if task in app.tasks else None
            out.append(_row(target, task, code_of(opts) if opts else "?", override))
    return out


def code_of(opts: SingletonOptions) -> str:
    """The limits the code gives a task: ``rate 60/m, 10000/d (cost); limit 3``."""
    said = []
    if opts.rate is not None:
        if opts.rate.limits is None:
            said.append("rate per plan")
        else:
            shown = [
                str(each.rate) + ("" if each.cost is None else " (cost)")
                for each in opts.rate.limits
            ]
            said.append("rate " + ", ".join(shown))
    if opts.limit is not None:
        said.append(f"limit {opts.limit}")
    if opts.total_limit is not None:
        said.append(f"total {opts.total_limit}")
    return "; ".join(said)


def _waiting(opts: SingletonOptions, store: LockStore) -> dict[str, int]:
    """The task's calls waiting for their turn, by key ({} where none can, or unread)."""
    try:
        return opts.mode.waiting(store)
    except SingletonLockError:
        return {}


def _row(target: str, task: str | None, code: str, override: Override | None) -> LimitRow:
    if override is None:
        return LimitRow(target, task, code, "", None, "")
    return LimitRow(
        target, task, code, override.describe(), override.changed_at, override.changed_by
    )


def _rates(
    target: str, rate: object, burst: int | None, tasks: dict[str, SingletonOptions]
) -> tuple[Rate, ...]:
    """The rates given, each with ``burst`` or the code's burst of the limit in its
    place; a burst below what the code charges a call there could let no call start."""
    forms = listed_rates(rate)
    specs = [opts.rate for opts in tasks.values() if opts.rate is not None]
    out = []
    for place, form in enumerate(forms):
        bursts, costs = [], []
        for spec in specs:
            code = spec.limits[place] if spec.limits and place < len(spec.limits) else None
            bursts.append(code.burst if code is not None else spec.burst)
            costs.append(code.cost if code is not None and code.cost is not None else spec.cost)
        given = parse_rate(form, burst or max(bursts, default=1), what=f"rate for {target}")
        units = [cost for cost in costs if isinstance(cost, int | float)]
        if units and max(units) > given.burst:
            raise ConfigurationError(
                f"{target!r}: rate {form!r} with burst {given.burst}: the code charges a call "
                f"{max(units):g} units against the limit in its place, so no call could "
                f"start; give --burst {burst_for(max(units))} or more"
            )
        out.append(given)
    return tuple(out)


def _weight(target: str, weight: object, tasks: dict[str, SingletonOptions]) -> float:
    """A weight for ``target``: only where its tasks take a total's turns round robin."""
    plain = [name for name, opts in tasks.items() if not opts.mode.takes_turns]
    if plain:
        raise ConfigurationError(
            f"{target!r}: {', '.join(sorted(plain))} has no total_limit= taken round robin "
            "in its code; a weight is a key's share of its task's total (give the task "
            "total_limit=... first)"
        )
    return check_weight(weight, f"{target!r}: weight")


def _change(
    reset: bool,
    rates: tuple[Rate, ...] | None,
    limit: int | None,
    paused: bool | None,
    weight: float | None = None,
) -> str:
    if reset:
        return "reset"
    given = (("rate", rates), ("limit", limit), ("weight", weight))
    said = [name for name, value in given if value is not None]
    if paused is not None:
        said.append("pause" if paused else "resume")
    return " ".join(said)


def _names(tasks: dict[str, SingletonOptions]) -> str:
    return ", ".join(sorted(tasks))


__all__ = ["LimitRow", "code_of", "rows", "set", "tasks_of"]
