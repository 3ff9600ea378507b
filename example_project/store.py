"""The service's own database (SQLite): requests, their effects, and a fenced coupon stock.

Kept apart from the lock store on purpose: the effects are what must happen exactly
once, and this is where the demo counts them.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from . import settings

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    request_idx INTEGER PRIMARY KEY,
    state TEXT NOT NULL,              -- pending, processing, processed, called_back
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS starts (request_idx INTEGER, worker TEXT, at REAL);
CREATE TABLE IF NOT EXISTS processed (request_idx INTEGER, task_id TEXT, worker TEXT, at REAL);
CREATE TABLE IF NOT EXISTS callbacks (request_idx INTEGER, task_id TEXT, at REAL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS coupon (id INTEGER PRIMARY KEY, stock INTEGER, last_fence INTEGER);
CREATE TABLE IF NOT EXISTS claims (user_id INTEGER, fence INTEGER, accepted INTEGER, at REAL);
"""

_local = threading.local()


def connect() -> sqlite3.Connection:
    """One connection per process and thread (prefork children each open their own; an
    SQLite connection may not cross threads, as in a threads pool or Celery's test worker)."""
    mine: tuple[int, sqlite3.Connection] | None = getattr(_local, "connection", None)
    if mine is None or mine[0] != os.getpid():
        db = sqlite3.connect(settings.EFFECTS_DB, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA busy_timeout=30000")
        mine = _local.connection = (os.getpid(), db)
    return mine[1]


@contextmanager
def transaction() -> Iterator[sqlite3.Connection]:
    db = connect()
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def create(requests: int, coupons: int) -> None:
    db = connect()
    db.executescript(SCHEMA)
    now = time.time()
    with transaction() as tx:
        tx.executemany(
            "INSERT INTO requests VALUES (?, 'pending', ?)", ((i, now) for i in range(requests))
        )
        tx.execute("INSERT INTO coupon VALUES (1, ?, 0)", (coupons,))


def bump(counter: str, by: int = 1) -> None:
    connect().execute(
        "INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET n = n + ?",
        (counter, by, by),
    )


def counter(name: str) -> int:
    row = connect().execute("SELECT n FROM counters WHERE name = ?", (name,)).fetchone()
    return int(row[0]) if row else 0


def state(request_idx: int) -> str:
    row = (
        connect()
        .execute("SELECT state FROM requests WHERE request_idx = ?", (request_idx,))
        .fetchone()
    )
    return str(row[0])


def set_state(request_idx: int, new_state: str) -> None:
    _move(connect(), request_idx, new_state, time.time())


def in_state(wanted: str, older_than: float = 0.0) -> list[int]:
    rows = connect().execute(
        "SELECT request_idx FROM requests WHERE state = ? AND updated_at <= ?",
        (wanted, time.time() - older_than),
    )
    return [int(r[0]) for r in rows]


def record_start(request_idx: int, worker: str) -> None:
    connect().execute("INSERT INTO starts VALUES (?, ?, ?)", (request_idx, worker, time.time()))


# The effect and the request's new state commit together. Written apart, a worker
# killed between the two would leave the effect done and the request still in its old
# state, and the sweep's re-drive would do the work again: no lock closes that window
# (the lease is gone with the worker), a transaction does.


def record_processed(request_idx: int, task_id: str, worker: str) -> None:
    with transaction() as tx:
        now = time.time()
        tx.execute("INSERT INTO processed VALUES (?, ?, ?, ?)", (request_idx, task_id, worker, now))
        _move(tx, request_idx, "processed", now)


def record_callback(request_idx: int, task_id: str) -> None:
    with transaction() as tx:
        now = time.time()
        tx.execute("INSERT INTO callbacks VALUES (?, ?, ?)", (request_idx, task_id, now))
        _move(tx, request_idx, "called_back", now)


def _move(tx: sqlite3.Connection, request_idx: int, new_state: str, now: float) -> None:
    tx.execute(
        "UPDATE requests SET state = ?, updated_at = ? WHERE request_idx = ?",
        (new_state, now, request_idx),
    )


def processed_count() -> int:
    return int(connect().execute("SELECT COUNT(DISTINCT request_idx) FROM processed").fetchone()[0])


def in_flight(worker: str) -> int:
    """Requests a worker has started and not finished yet."""
    return int(
        connect()
        .execute(
            "SELECT COUNT(*) FROM starts s WHERE s.worker = ? AND NOT EXISTS "
            "(SELECT 1 FROM processed p WHERE p.request_idx = s.request_idx AND p.worker = ?)",
            (worker, worker),
        )
        .fetchone()[0]
    )


def recovered_after(worker: str) -> int:
    """Requests a worker had started but not finished, that another worker then completed."""
    return int(
        connect()
        .execute(
            "SELECT COUNT(DISTINCT s.request_idx) FROM starts s "
            "WHERE s.worker = ? "
            "AND NOT EXISTS (SELECT 1 FROM processed p WHERE p.request_idx = s.request_idx "
            "                AND p.worker = ?) "
            "AND EXISTS (SELECT 1 FROM processed p WHERE p.request_idx = s.request_idx)",
            (worker, worker),
        )
        .fetchone()[0]
    )


def claim_coupon(user_id: int, fence: int | None) -> bool:
    """Take one coupon; with a fence, refuse a write older than the last one accepted.

    The check and the write are one statement, so the store itself is the judge: a
    holder that lost its lease (paused past its TTL) carries an older fence than the
    one who took over, and is refused however its own check() went.
    """
    if fence is None:
        # The --without-lock comparison: check, work, then write, as code that trusts a
        # lock it does not have would. Two claimers can both see the last coupon.
        (stock,) = connect().execute("SELECT stock FROM coupon WHERE id = 1").fetchone()
        time.sleep(settings.WORK_SECONDS)
    with transaction() as tx:
        if fence is None:
            accepted = stock > 0
            if accepted:
                tx.execute("UPDATE coupon SET stock = ? WHERE id = 1", (stock - 1,))
        else:
            cursor = tx.execute(
                "UPDATE coupon SET stock = stock - 1, last_fence = ? "
                "WHERE id = 1 AND stock > 0 AND last_fence < ?",
                (fence, fence),
            )
            accepted = cursor.rowcount == 1
        tx.execute(
            "INSERT INTO claims VALUES (?, ?, ?, ?)",
            (user_id, fence or 0, int(accepted), time.time()),
        )
    return accepted


def report() -> dict[str, int]:
    db = connect()

    def scalar(sql: str) -> int:
        return int(db.execute(sql).fetchone()[0])

    return {
        "requests": scalar("SELECT COUNT(*) FROM requests"),
        "processed_once": scalar(
            "SELECT COUNT(*) FROM (SELECT request_idx FROM processed "
            "GROUP BY request_idx HAVING COUNT(*) = 1)"
        ),
        "processed_twice": scalar(
            "SELECT COUNT(*) FROM (SELECT request_idx FROM processed "
            "GROUP BY request_idx HAVING COUNT(*) > 1)"
        ),
        "callbacks_twice": scalar(
            "SELECT COUNT(*) FROM (SELECT request_idx FROM callbacks "
            "GROUP BY request_idx HAVING COUNT(*) > 1)"
        ),
        "called_back": scalar("SELECT COUNT(DISTINCT request_idx) FROM callbacks"),
        "coupon_stock_left": scalar("SELECT stock FROM coupon WHERE id = 1"),
        "coupons_claimed": scalar("SELECT COUNT(*) FROM claims WHERE accepted = 1"),
        "stale_writes_rejected": scalar(
            "SELECT COUNT(*) FROM claims WHERE accepted = 0 AND fence > 0 "
            "AND fence < (SELECT last_fence FROM coupon WHERE id = 1)"
        ),
    }
