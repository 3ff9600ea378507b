"""``celery -A proj singleton list|show|release|orphans|web``: see, explain and free locks.

A Celery CLI extension (the ``celery.commands`` entry point). It reads the app's own
settings, so it talks to the same lock store, prefix and broker as the app's workers.
"""

from __future__ import annotations

import getpass
import json
import socket
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar, cast

import click
from celery.bin.base import CeleryCommand, handle_preload_options

from .._time import human
from ..config.stores import LockStores
from ..exceptions import SingletonLockError
from ..lease import ReleaseResult
from .liveness import Liveness
from .lock_history import entries_of, shown
from .locks import (
    STATES,
    LockRow,
    app_rows,
    family_rows,
    new_call,
    operator_record,
    parse_duration,
    release,
)

EXAMPLES = """
\b
Examples:
  celery -A proj singleton list
  celery -A proj singleton list --state running --older-than 1h
  celery -A proj singleton list --task proj.tasks.sync --json
  celery -A proj singleton show proj.tasks.sync:4f1c...      (a name, a Redis key or a task id)
  celery -A proj singleton release 2b6a8c1e-...              (refused while the holder lives)
  celery -A proj singleton orphans --release
  celery -A proj singleton history proj.tasks.sync:4f1c...   (with singleton_lock_history)
  celery -A proj singleton web --port 5556                    (the locks page, this machine only)
"""

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


class _Locks:
    """The app's lock store, read as rows; every store error ends the command cleanly."""

    def __init__(self, ctx: click.Context) -> None:
        self.app = ctx.obj.app
        try:
            self.stores = LockStores.for_app(self.app)
            self.store = self.stores.lock
        except SingletonLockError as error:
            exit_with(str(error))

    def rows(self, batch: int = 1000) -> Iterator[LockRow]:
        try:
            yield from app_rows(self.app, self.store, batch)
        except SingletonLockError as error:
            exit_with(str(error))  # the store's messages name it without its password

    def named(self, ref: str) -> list[LockRow]:
        """The holds of the locks ``ref`` names, and the other holds of those locks. A
        lock's name or key is read alone, in one round trip; a task id is looked for in
        a pass over every lock, then its locks are read alone."""
        try:
            family = family_rows(self.app, self.store, ref)
            if any(row.matches(ref) for row in family):
                return family
            bases = sorted({row.base_name for row in self.rows() if row.matches(ref)})
            return [row for base in bases for row in family_rows(self.app, self.store, base)]
        except SingletonLockError as error:
            exit_with(str(error))

    def where(self) -> str:
        return f"{self.stores.describe()} under prefix {self.store.prefix!r}"


_F = TypeVar("_F")


def _preload(command: _F) -> _F:
    """Celery's handling of --preload options (untyped in Celery)."""
    return cast(_F, handle_preload_options(command))


def exit_with(message: str, code: int = 1) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


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
@click.option("--state", type=click.Choice(STATES), help="Only locks in this state.")
@click.option("--older-than", help="Only holds taken longer ago than this: 90, 90s, 5m, 1h.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of objects.")
@click.option(
    "--batch",
    default=1000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Keys read per round trip.",
)
@click.pass_context
@_preload
def list_locks(
    ctx: click.Context,
    /,
    *,
    task_name: str | None,
    state: str | None,
    older_than: str | None,
    as_json: bool,
    batch: int,
    **_: object,
) -> None:
    """Every lock under the prefix (what the store says; no worker is asked).

    States: queued (message in the broker), reserved (a worker has it, not started),
    running, throttled (a throttle window), limited (a rate's schedule: the runs that
    may start now and when the next may), held (a value this library did not write).
    A limit=N key shows one row per slot held.
    """
    try:
        min_age = None if older_than is None else parse_duration(older_than)
    except ValueError as error:
        exit_with(str(error), 2)
    locks = _Locks(ctx)

    def wanted(row: LockRow) -> bool:
        return (
            (task_name is None or row.task == task_name)
            and (state is None or row.state == state)
            and (min_age is None or (row.age is not None and row.age >= min_age))
        )

    shown = 0
    counts: dict[str, int] = {}
    for row in filter(wanted, locks.rows(batch)):
        if as_json:
            click.echo(("[" if not shown else ",") + json.dumps(row.as_json()))
        else:
            if not shown:
                click.echo(_line([name for name, _ in COLUMNS]))
            click.echo(_line(_cells(row)))
        shown += 1
        counts[row.state] = counts.get(row.state, 0) + 1
    if as_json:
        click.echo("[]" if not shown else "]")
    elif not shown:
        click.echo(f"No locks at {locks.where()}.")
    else:
        summary = ", ".join(f"{counts[s]} {s}" for s in STATES if s in counts)
        click.echo(f"{shown} lock(s): {summary}.")


def _cells(row: LockRow) -> list[str]:
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


def _line(cells: list[str]) -> str:
    out = []
    for (_, width), cell in zip(COLUMNS, cells, strict=True):
        fitted = cell[: width - 1] + "~" if width and len(cell) > width else cell
        out.append(fitted.ljust(width) if width else fitted)
    return " ".join(out).rstrip()


@_command("show")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="A JSON object per lock.")
@click.pass_context
@_preload
def show(ctx: click.Context, /, ref: str, as_json: bool, **_: object) -> None:
    """One lock (by name, Redis key or task id): everything known, and what a new call
    would get now."""
    locks = _Locks(ctx)
    family = locks.named(ref)
    if not family:
        exit_with(f"no lock matches {ref!r} at {locks.where()}")
    bases = {row.base_name for row in family}
    liveness = Liveness(locks.app)
    liveness.prepare(family)
    for base in sorted(bases):
        members = [row for row in family if row.base_name == base]
        task = locks.app.tasks.get(members[0].task) if members[0].task else None
        outlook = new_call(task.singleton_options() if task is not None else None, members)
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


@_command("release")
@click.argument("ref")
@click.option("--force", is_flag=True, help="Release even while the holder is alive.")
@click.pass_context
@_preload
def release_lock(ctx: click.Context, /, ref: str, force: bool, **_: object) -> None:
    """Release one lock (by name, Redis key or task id), owner-checked; refused while its
    holder is alive (its worker answers a ping and still has the task) unless --force."""
    locks = _Locks(ctx)
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


def _release(locks: _Locks, row: LockRow, *, err: bool = False) -> bool:
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
@_preload
def orphans(
    ctx: click.Context, /, free: bool, as_json: bool, queues: str | None, **_: object
) -> None:
    """Locks whose holder is gone: its worker does not answer or no longer has the task,
    or (a queued hold) its message is in no queue. Searched without consuming on a Redis
    broker; on RabbitMQ a queued hold counts only when every queue is empty."""
    locks = _Locks(ctx)
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
@_preload
def history(ctx: click.Context, /, ref: str, count: int, as_json: bool, **_: object) -> None:
    """What happened to one lock (by name or Redis key), newest first: calls accepted
    and refused (by whom), runs started and contended (and what they did), releases,
    replacements, cancellations. Kept with singleton_lock_history (or history=True)."""
    locks = _Locks(ctx)
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


@_command("web")
@click.option("--host", help="Address to listen on [default: 127.0.0.1, this machine only].")
@click.option("--port", type=click.IntRange(0, 65535), help="Port [default: 5556].")
@click.option("--prefix", help="URL path to serve the page under, e.g. /locks.")
@click.option(
    "--allow-release/--read-only",
    default=None,
    help="Let the page release locks: owner-checked, a live one only once confirmed "
    "[default: read-only].",
)
@click.option(
    "--basic-auth",
    envvar="SINGLETON_LOCK_WEB_BASIC_AUTH",
    metavar="USER:PASSWORD",
    help="Ask for these credentials (better from $SINGLETON_LOCK_WEB_BASIC_AUTH: a command "
    "line is visible to other users of the machine).",
)
@click.option("--refresh", type=click.FloatRange(min=0), help="Seconds between refreshes (0: off).")
@click.pass_context
@_preload
def web(
    ctx: click.Context,
    /,
    *,
    host: str | None,
    port: int | None,
    prefix: str | None,
    allow_release: bool | None,
    basic_auth: str | None,
    refresh: float | None,
    **_: object,
) -> None:
    """Serve a page of the locks (list, filters, a lock's holders, releases) until ^C."""
    try:
        from .web import LocksPage  # noqa: PLC0415  (the web extra, only for this command)
        from .web.server import serve  # noqa: PLC0415
    except ImportError as error:
        exit_with(
            f"the page needs the web extra: pip install 'celery-singleton-lock[web]' ({error})"
        )
    try:
        page = LocksPage(
            ctx.obj.app,
            host=host,
            port=port,
            prefix=prefix,
            allow_release=allow_release,
            basic_auth=basic_auth,
            refresh=refresh,
        )
    except SingletonLockError as error:
        exit_with(str(error), 2)
    settings = page.settings
    shown = f"[{settings.host}]" if ":" in settings.host else settings.host
    click.echo(
        f"celery-singleton-lock: the locks at {_Locks(ctx).where()} on "
        f"http://{shown}:{settings.port}{settings.prefix}/ ("
        + ("releases on" if settings.allow_release else "read-only")
        + (", basic auth" if settings.basic_auth else ", no auth")
        + ")"
    )
    if settings.host not in ("127.0.0.1", "::1", "localhost") and settings.basic_auth is None:
        click.echo("Warning: listening beyond this machine with no --basic-auth", err=True)
    try:
        serve(page)
    except OSError as error:  # the port is taken, the address is not this machine's
        exit_with(f"cannot listen on {shown}:{settings.port}: {error}")
