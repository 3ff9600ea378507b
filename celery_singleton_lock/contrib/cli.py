"""``celery -A proj singleton ...``: see, explain and free locks, and change limits at run time.

A Celery CLI extension (the ``celery.commands`` entry point). It reads the app's own
settings, so it talks to the same lock store, prefix and broker as the app's workers.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Callable
from functools import partial

import click
from celery.bin.base import CeleryCommand

from .._time import human
from ..exceptions import SingletonLockError
from ..lease import ReleaseResult
from . import idempotency_keys
from .cli_base import EXAMPLES, Locks, exit_with, preload
from .limits_command import limits
from .liveness import Liveness
from .lock_history import entries_of, shown
from .lock_table import COLUMNS, cells, line
from .locks import (
    STATES,
    LockRow,
    attached_calls,
    new_call,
    operator_record,
    parse_duration,
    release,
)
from .web_command import web

ALIASES = {"ls": "list"}


class _Aliased(click.Group):
    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, ALIASES.get(cmd_name, cmd_name))


@click.group(name="singleton", cls=_Aliased, epilog=EXAMPLES)
def singleton() -> None:
    """See, explain and free celery-singleton-lock's locks (``ls`` is ``list``)."""


def _command(name: str) -> Callable[[Callable[..., object]], click.Command]:
    return singleton.command(name, cls=CeleryCommand, epilog=EXAMPLES)


@_command("list")
@click.option("--task", "task_name", help="Only the locks of this task (its registered name).")
@click.option(
    "--state",
    type=click.Choice([*STATES, *idempotency_keys.MEANINGS]),
    help="Only locks (or, with --idempotency, keys) in this state.",
)
@click.option("--older-than", help="Only holds taken longer ago than this: 90, 90s, 5m, 1h.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of objects.")
@click.option(
    "--idempotency",
    "keys",
    is_flag=True,
    help="The idempotency keys instead: each key's first call and how it ended.",
)
@click.option(
    "--batch",
    default=1000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Keys read per round trip.",
)
@click.option(
    "--store-only",
    is_flag=True,
    help="Only what the store says: ask no worker which runs have started.",
)
@click.pass_context
@preload
def list_locks(
    ctx: click.Context,
    /,
    *,
    task_name: str | None,
    state: str | None,
    older_than: str | None,
    as_json: bool,
    keys: bool,
    batch: int,
    store_only: bool,
    **_: object,
) -> None:
    """Every lock under the prefix, and which runs have started (the workers holding a
    running lease are asked once, as show does; --store-only asks none).

    States: queued (message in the broker), reserved (a worker has it, not started:
    prefetched, waiting for its ETA or for the key), running (PID: the pool child's),
    throttled (a throttle window), limited (a rate's schedule: the runs that
    may start now and when the next may), held (a value this library did not write).
    A limit=N key shows one row per slot held. With --idempotency: the idempotency
    keys (accepted, running, succeeded, failed) and the calls they are bound to.
    """
    try:
        min_age = None if older_than is None else parse_duration(older_than)
    except ValueError as error:
        exit_with(str(error), 2)
    locks = Locks(ctx)
    if keys:
        _list_keys(locks, task_name, state, as_json=as_json)
        return

    def wanted(row: LockRow) -> bool:
        return (
            (task_name is None or row.task == task_name)
            and (state is None or row.state == state)
            and (min_age is None or (row.age is not None and row.age >= min_age))
        )

    found = locks.rows(batch)
    if not store_only:
        found = map(Liveness(locks.app).as_seen, found)
    shown = 0
    counts: dict[str, int] = {}
    for row in filter(wanted, found):
        if as_json:
            click.echo(("[" if not shown else ",") + json.dumps(row.as_json()))
        else:
            if not shown:
                click.echo(line([name for name, _ in COLUMNS]))
            click.echo(line(cells(row)))
        shown += 1
        counts[row.state] = counts.get(row.state, 0) + 1
    if as_json:
        click.echo("[]" if not shown else "]")
    elif not shown:
        click.echo(f"No locks at {locks.where()}.")
    else:
        summary = ", ".join(f"{counts[s]} {s}" for s in STATES if s in counts)
        click.echo(f"{shown} lock(s): {summary}.")


def _list_keys(locks: Locks, task_name: str | None, state: str | None, *, as_json: bool) -> None:
    found = [
        record
        for record in locks.guarded(lambda: list(idempotency_keys.records(locks.store)))
        if (task_name is None or record.task == task_name)
        and (state is None or record.state == state)
    ]
    if as_json:
        click.echo(json.dumps([idempotency_keys.as_json(record) for record in found]))
        return
    if not found:
        click.echo(f"No idempotency keys at {locks.where()}.")
        return
    columns = idempotency_keys.KEY_COLUMNS
    click.echo(line([name for name, _ in columns], columns))
    for record in found:
        click.echo(line(idempotency_keys.key_cells(record), columns))
    click.echo(f"{len(found)} idempotency key(s).")


@_command("show")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="A JSON object per lock.")
@click.pass_context
@preload
def show(ctx: click.Context, /, ref: str, as_json: bool, **_: object) -> None:
    """One lock (by name, Redis key or task id): everything known, and what a new call
    would get now."""
    locks = Locks(ctx)
    family = locks.named(ref)
    if not family:
        key = locks.guarded(lambda: idempotency_keys.record(locks.store, ref))
        if key is None:
            exit_with(f"no lock nor idempotency key matches {ref!r} at {locks.where()}")
        if as_json:
            click.echo(json.dumps(idempotency_keys.as_json(key)))
        else:
            click.echo("\n".join(idempotency_keys.described(key)))
        return
    bases = {row.base_name for row in family}
    liveness = Liveness(locks.app)
    liveness.prepare(family)
    family = [liveness.as_seen(row) for row in family]
    for base in sorted(bases):
        members = [row for row in family if row.base_name == base]
        task = locks.app.tasks.get(members[0].task) if members[0].task else None
        outlook = new_call(task.singleton_options() if task is not None else None, members)
        attached = locks.guarded(partial(attached_calls, locks.store, base))
        if as_json:
            verdicts = [(r, liveness.verdict(r)) for r in members]
            click.echo(
                json.dumps(
                    {
                        "name": base,
                        "new_call": outlook,
                        "holds": [
                            {**r.as_json(), "alive": v.alive, "why": v.why} for r, v in verdicts
                        ],
                        "attached": attached,
                    }
                )
            )
            continue
        click.echo(f"lock {base}")
        click.echo(f"  task:     {members[0].task or 'unknown (a name shared across tasks)'}")
        click.echo(f"  new call: {outlook}")
        for row in members:
            verdict = liveness.verdict(row)
            alive = {True: "alive", False: "gone", None: "cannot tell"}[verdict.alive]
            role = f" ({row.role})" if row.role else ""
            click.echo(
                f"  - {row.state}{role}: task id {row.task_id or '-'}, worker "
                f"{row.worker or '-'}, pid {row.pid or '-'}"
            )
            click.echo(f"    key {row.key}")
            click.echo(f"    age {human(row.age)}, ttl {human(row.ttl)}, fence {row.fence or '-'}")
            click.echo(f"    holder {alive}: {verdict.why}")
        for call in attached:  # canvas members waiting for their holder's end
            sending = ", being sent" if call["sending"] else ""
            click.echo(f"  - attached: task id {call['task_id']}, to {call['holder']}{sending}")


@_command("release")
@click.argument("ref")
@click.option("--force", is_flag=True, help="Release even while the holder is alive.")
@click.pass_context
@preload
def release_lock(ctx: click.Context, /, ref: str, force: bool, **_: object) -> None:
    """Release one lock (by name, Redis key or task id), owner-checked; refused while its
    holder is alive (its worker answers a ping and still has the task) unless --force."""
    locks = Locks(ctx)
    found = [row for row in locks.named(ref) if row.matches(ref)]
    if not found:
        exit_with(f"no lock matches {ref!r} at {locks.where()}")
    if len(found) > 1:
        keys = "\n  ".join(row.key for row in found)
        exit_with(f"{ref!r} matches {len(found)} locks; name one by its key:\n  {keys}")
    [row] = found
    if row.state == "limited":
        exit_with(
            f"not released: {row.name} is a rate's schedule, not a lock; it frees "
            f"itself as its slots pass (the next in {human(row.next_slot)})"
        )
    if not force:
        liveness = Liveness(locks.app)
        liveness.prepare([row])
        verdict = liveness.verdict(row)
        if verdict.alive or (verdict.alive is None and row.state != "throttled"):
            what = "is alive" if verdict.alive else "may be alive"
            exit_with(
                f"not released: the holder of {row.name} {what} ({verdict.why}); --force "
                "releases it anyway"
            )
    _release(locks, row)


def _release(locks: Locks, row: LockRow, *, err: bool = False) -> bool:
    by = f"celery singleton, {getpass.getuser()}@{socket.gethostname()}"
    try:
        result = release(locks.store, row, operator_record(locks.app, row, by))
    except SingletonLockError as error:
        exit_with(str(error))
    if result is ReleaseResult.RELEASED:
        click.echo(
            f"released {row.name} ({row.state}, task {row.task_id or '-'}, key {row.key})", err=err
        )
        return True
    click.echo(f"not released {row.name}: it changed hands or expired meanwhile", err=True)
    return False


@_command("orphans")
@click.option("--release", "free", is_flag=True, help="Release exactly these, owner-checked.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of objects.")
@click.option("-Q", "--queues", help="More queues to search, comma separated.")
@click.pass_context
@preload
def orphans(
    ctx: click.Context, /, free: bool, as_json: bool, queues: str | None, **_: object
) -> None:
    """Locks whose holder is gone: its worker does not answer or no longer has the task,
    or (a queued hold) its message is in no queue. Searched without consuming on a Redis
    broker; on RabbitMQ a queued hold counts only when every queue is empty."""
    locks = Locks(ctx)
    candidates = [row for row in locks.rows() if row.state in ("queued", "reserved", "running")]
    liveness = Liveness(locks.app, queues=(queues or "").split(",") if queues else ())
    liveness.prepare(candidates)
    gone = [(row, liveness.verdict(row)) for row in candidates]
    gone = [(row, verdict) for row, verdict in gone if verdict.alive is False]
    if as_json:
        click.echo(json.dumps([{**row.as_json(), "why": v.why} for row, v in gone]))
    elif not gone:
        click.echo(f"No orphaned locks at {locks.where()}.")
    else:
        for row, verdict in gone:
            click.echo(f"{row.state:9} {row.task_id or '-':36} {row.name}: {verdict.why}")
    if free:
        freed = sum(_release(locks, row, err=as_json) for row, _ in gone)
        if not as_json:
            click.echo(f"released {freed} of {len(gone)} orphaned lock(s)")


@_command("history")
@click.argument("ref")
@click.option(
    "-n",
    "--count",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="The newest entries to show.",
)
@click.option("--json", "as_json", is_flag=True, help="A JSON array of objects, newest first.")
@click.pass_context
@preload
def history(ctx: click.Context, /, ref: str, count: int, as_json: bool, **_: object) -> None:
    """What happened to one lock (by name or Redis key), newest first: calls accepted
    and refused (by whom), runs started and contended (and what they did), releases,
    replacements, cancellations. Kept with singleton_lock_history (or history=True)."""
    locks = Locks(ctx)
    try:
        name, found = entries_of(locks.store, ref, count)
    except SingletonLockError as error:
        exit_with(str(error))
    if as_json:
        click.echo(json.dumps([shown(entry) for entry in found]))
        return
    if not found:
        exit_with(
            f"no history of {name!r} at {locks.where()} (kept with "
            "singleton_lock_history = True, or a task's history=True)"
        )
    click.echo(f"lock {name}")
    for entry in found:
        fields = shown(entry)
        extra = "  ".join(f"{k}={v}" for k, v in fields.items() if k not in ("at", "event"))
        click.echo(f"{fields['at']}  {fields['event']:<20} {extra}")


# The locks page's command, in a module of its own (it loads the web extra), and the
# run-time limits' group.
singleton.add_command(web)
singleton.add_command(limits)
