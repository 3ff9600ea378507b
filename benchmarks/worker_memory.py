"""A worker's main process over many singleton tasks: its RSS, what the library keeps, and
the lock store's connections.

    python3 scripts/dev.py memory [--tasks 100000] [--pool prefork]

Starts a private redis-server and one worker, sends ``--tasks`` short singleton tasks in
batches (each on its own key), and prints the main process's RSS and the library's
tables (``celery inspect singleton_stats``) and the lock store's client count (``CLIENT
LIST``, this script's own connection left out) at 0, 10%, 50% and 100% of the run.
Appends the table to docs/worker-memory.md. The numbers are only what this run measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.servers import RedisServer  # noqa: E402  (after the path is set)
from tests.support.workers import Worker  # noqa: E402

BATCH = 500


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--pool", default="prefork")
    parser.add_argument("--output", default=str(ROOT / "docs" / "worker-memory.md"))
    args = parser.parse_args()
    broker, locks, checker = RedisServer().start(), RedisServer().start(), RedisServer().start()
    env = {"CSL_BROKER_URL": broker.url, "CSL_LOCK_URL": locks.url, "CSL_CHECK_URL": checker.url}
    os.environ.update(env)
    from tests.support import celery_app  # noqa: PLC0415  (configured from the environment above)

    app = celery_app.app
    worker = Worker(env, pool=args.pool, concurrency=1 if args.pool == "solo" else 2).start()
    marks = sorted({0, args.tasks // 10, args.tasks // 2, args.tasks})
    rows: list[tuple[int, int, dict[str, object], float, int]] = []
    lock_store = locks.client()
    started = time.monotonic()
    try:
        sent = 0
        for mark in marks:
            while sent < mark:
                count = min(BATCH, mark - sent)
                for n in range(sent, sent + count):
                    celery_app.noop.apply_async((f"m-{n}",), queue=worker.queue)
                sent += count
                while broker.client().llen(worker.queue) > BATCH:
                    time.sleep(0.05)
            while int(checker.client().get("noop") or 0) < mark:
                time.sleep(0.05)
            [reply] = app.control.broadcast(
                "singleton_stats", destination=[worker.nodename], reply=True, timeout=5
            )
            clients = len(lock_store.client_list()) - 1  # this script's own connection
            row = (
                mark, worker.rss_kib(), reply[worker.nodename], time.monotonic() - started, clients
            )  # fmt: skip
            rows.append(row)
            print(
                f"{mark:>7} tasks  main process RSS {row[1] / 1024:7.1f} MiB  {row[2]}  "
                f"lock-store clients {clients}",
                flush=True,
            )
    finally:
        worker.stop()
        for server in (broker, locks, checker):
            server.cleanup()
    lines = [
        f"## {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, pool {args.pool}, {args.tasks} tasks",
        "",
        "| tasks run | main process RSS | reservations | watched children | lock-store "
        "clients | elapsed |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {mark} | {rss / 1024:.1f} MiB | {stats['reservations']} | "
            f"{stats['watched_children']} | {clients} | {elapsed:.0f} s |"
            for mark, rss, stats, elapsed, clients in rows
        ),
        "",
    ]
    output = Path(args.output)
    header = (
        ""
        if output.exists()
        else (
            "# A worker's main process over many tasks\n\nWritten by `python3 scripts/dev.py "
            "memory`; each run appends its table. Only what the run measured.\n\n"
        )
    )
    with output.open("a") as out:
        out.write(header + "\n".join(lines) + "\n")
    first = rows[1] if len(rows) > 2 else rows[0]
    growth = (rows[-1][1] - first[1]) / 1024
    print(f"RSS growth from {first[0]} to {rows[-1][0]} tasks: {growth:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
