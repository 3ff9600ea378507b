"""``celery singleton web``: serve the locks page until ^C (the web extra, loaded only here)."""

from __future__ import annotations

import click
from celery.bin.base import CeleryCommand

from ..exceptions import SingletonLockError
from .cli_base import EXAMPLES, Locks, exit_with, preload


@click.command("web", cls=CeleryCommand, epilog=EXAMPLES)
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
@preload
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
        f"celery-singleton-lock: the locks at {Locks(ctx).where()} on "
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
