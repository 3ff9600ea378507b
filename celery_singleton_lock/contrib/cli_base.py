"""What every ``celery singleton`` command shares: the app's locks as rows that end the
command cleanly on a store error, the error exit, Celery's preload options, the examples."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar, cast

import click
from celery.bin.base import handle_preload_options

from ..config.stores import LockStores
from ..exceptions import SingletonLockError
from .locks import LockRow, app_rows, family_rows

EXAMPLES = """
\b
Examples:
  celery -A proj singleton list
  celery -A proj singleton list --state running --older-than 1h
  celery -A proj singleton list --task proj.tasks.sync --json
  celery -A proj singleton list --idempotency                (idempotency keys, first calls)
  celery -A proj singleton show proj.tasks.sync:4f1c...      (a name, a Redis key or a task id)
  celery -A proj singleton release 2b6a8c1e-...              (refused while the holder lives)
  celery -A proj singleton orphans --release
  celery -A proj singleton history proj.tasks.sync:4f1c...   (with singleton_lock_history)
  celery -A proj singleton limits set tenant:acme --pause     (held back; --resume lets go)
  celery -A proj singleton web --port 5556                    (the locks page, this machine only)
"""


_T = TypeVar("_T")


class Locks:
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
        """The locks ``ref`` names, and the rest of their families. A lock's name or key
        is read alone, in one round trip; a task id is looked for in a pass over every
        lock, then its locks are read alone."""
        try:
            family = family_rows(self.app, self.store, ref)
            if any(row.matches(ref) for row in family):
                return family
            bases = sorted({row.base_name for row in self.rows() if row.matches(ref)})
            return [row for base in bases for row in family_rows(self.app, self.store, base)]
        except SingletonLockError as error:
            exit_with(str(error))

    def guarded(self, read: Callable[[], _T]) -> _T:
        """``read()``, a store error ending the command cleanly."""
        try:
            return read()
        except SingletonLockError as error:
            exit_with(str(error))

    def where(self) -> str:
        return f"{self.stores.describe()} under prefix {self.store.prefix!r}"


_F = TypeVar("_F")


def preload(command: _F) -> _F:
    """Celery's handling of --preload options (untyped in Celery)."""
    return cast(_F, handle_preload_options(command))


def exit_with(message: str, code: int = 1) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)
