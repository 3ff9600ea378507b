"""``celery singleton limits list|set``: rates, limits, weights and pauses, changed at run time."""

from __future__ import annotations

import json
import time

import click
from celery.bin.base import CeleryCommand

from ..exceptions import SingletonLockError
from ..lease.limits.overrides import MAX_WEIGHT, MIN_WEIGHT
from . import limits as operator_limits
from .cli_base import Locks, exit_with, preload

EXAMPLES = """
\b
Examples:
  celery -A proj singleton limits list
  celery -A proj singleton limits set proj.tasks.sync --rate 10/m --rate 500/d
  celery -A proj singleton limits set 'tenant:{tenant}' --limit 5
  celery -A proj singleton limits set tenant:acme --weight 3    (3 turns of the total to 1)
  celery -A proj singleton limits set tenant:acme --pause       (held back, never dropped)
  celery -A proj singleton limits set tenant:acme --resume
  celery -A proj singleton limits set tenant:acme --reset       (the code's limits again)
"""


@click.group(name="limits", epilog=EXAMPLES)
def limits() -> None:
    """See and change rates, limits and pauses without a deploy (every worker within a
    second)."""


@limits.command("list", cls=CeleryCommand, epilog=EXAMPLES)
@click.option("--json", "as_json", is_flag=True, help="A JSON array of objects.")
@click.pass_context
@preload
def list_limits(ctx: click.Context, /, *, as_json: bool, **_: object) -> None:
    """Every task with a rate or a limit, the code's values and the override in force."""
    app = Locks(ctx).app
    try:
        found = operator_limits.rows(app)
    except SingletonLockError as error:
        exit_with(str(error))
    if as_json:
        click.echo(json.dumps([row.as_dict() for row in found]))
        return
    if not found:
        click.echo("no task with a rate or a limit")
        return
    width = max(len(row.target) for row in found)
    click.echo(f"{'TARGET':<{width}}  {'CODE':<28}  OVERRIDE")
    for row in found:
        when = ""
        if row.changed_at:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.changed_at))
            when = f"  (since {stamp}, {row.changed_by})"
        waiting = f"  [{row.waiting_said}]" if row.waiting else ""
        click.echo(f"{row.target:<{width}}  {row.code:<28}  {row.override or '-'}{when}{waiting}")


@limits.command("set", cls=CeleryCommand, epilog=EXAMPLES)
@click.argument("target")
@click.option("--rate", "rates", multiple=True, help="A rate in place of the code's: 10/m, 5/s.")
@click.option(
    "--burst",
    type=click.IntRange(min=1),
    help="Calls (or units) at once, for each --rate [default: the code's burst in its place].",
)
@click.option("--limit", type=click.IntRange(min=1), help="Runs at once per key, for limit=N.")
@click.option(
    "--weight",
    type=click.FloatRange(min=MIN_WEIGHT, max=MAX_WEIGHT),
    help=f"A key's share of its task's total_limit while others wait (default 1), "
    f"from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}: 0.5 is one turn to another key's two.",
)
@click.option("--pause", "paused", flag_value=True, default=None, help="Hold its calls back.")
@click.option("--resume", "paused", flag_value=False, help="Let held-back calls go, in order.")
@click.option("--reset", is_flag=True, help="Remove the override: the code's limits again.")
@click.pass_context
@preload
def set_limits(
    ctx: click.Context,
    /,
    *,
    target: str,
    rates: tuple[str, ...],
    burst: int | None,
    limit: int | None,
    weight: float | None,
    paused: bool | None,
    reset: bool,
    **_: object,
) -> None:
    """Change TARGET's limits: a task's name, a key template or one key's lock name."""
    app = Locks(ctx).app
    try:
        now = operator_limits.set(
            app,
            target,
            rate=list(rates) or None,
            burst=burst,
            limit=limit,
            paused=paused,
            weight=weight,
            reset=reset,
        )
    except SingletonLockError as error:
        exit_with(str(error))
    click.echo(f"{target}: " + ("the code's limits" if now is None else now.describe()))
