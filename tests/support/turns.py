"""What the fair-shares tests read of a task's waiting room and its runs."""

from __future__ import annotations

import itertools
import time
from typing import Any

from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.lease import slot
from celery_singleton_lock.lease.limits.turns import turns_of

from ..conftest import CeleryEnv
from .modes import concurrency
from .runs import started

FAIR = "tests.support.celery_app.export_fair"


def of_items(records: list[dict[str, Any]], items: list[str]) -> list[dict[str, Any]]:
    return sorted((r for r in records if r["item"] in items), key=lambda r: r["start"])


def check_caps(done: list[dict[str, Any]], per_key: int, total: int) -> None:
    """No window ever ran more than ``total`` runs, nor more than ``per_key`` of a key."""
    assert concurrency(done) <= total, f"more than {total} at once"
    for _, runs_of_key in itertools.groupby(
        sorted(done, key=lambda r: r["item"]), key=lambda r: r["item"]
    ):
        assert concurrency(list(runs_of_key)) <= per_key


def waiting(cenv: CeleryEnv, task: str) -> dict[str, int]:
    turns = turns_of(LockStores.for_app(cenv.app_module.app).lock)
    assert turns is not None
    return turns.waiting(f"{task}#total")


def of_started(cenv: CeleryEnv, item: str) -> list[dict[str, Any]]:
    return [s for s in started(cenv) if s["item"] == item]


def stamp_of(cenv: CeleryEnv, task: str, ident: str) -> int:
    """The stamp of a call's turn (``lease.limits.turns``): its one message that may start."""
    store = LockStores.for_app(cenv.app_module.app).lock
    room = f"{store.keys(f'{task}#total').lock}:turns:stamps"
    return int(store.client.hget(room, ident))


def slots_free(cenv: CeleryEnv, task: str, total: int) -> bool:
    store = LockStores.for_app(cenv.app_module.app).lock
    return all(store.holder(slot(f"{task}#total", n)) is None for n in range(1, total + 1))


def stamp_kept_for(cenv: CeleryEnv, task: str, ident: str) -> float:
    """How much longer (s) a call that left the room keeps its stamp."""
    store = LockStores.for_app(cenv.app_module.app).lock
    until = store.client.zscore(f"{store.keys(f'{task}#total').lock}:turns:left", ident)
    assert until is not None, f"{ident} left no stamp"
    return until / 1000 - time.time()
