"""The release: sdist and wheel build, pass ``twine check``, and carry every module, the
LICENSE, the typing marker and the entry points, at the version the package reports."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

import celery_singleton_lock

from ..support.servers import RedisServer
from ..support.workers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.oneoff]


@pytest.fixture(name="dist", scope="module")
def fixture_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the test extras hold the build backend, so no download is needed.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return out


def test_twine_check_passes(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_wheel_carries_every_module_the_license_and_the_entry_points(dist: Path) -> None:
    version = celery_singleton_lock.__version__
    [wheel] = dist.glob(f"celery_singleton_lock-{version}-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "celery_singleton_lock"
    modules = {p.relative_to(ROOT).as_posix() for p in package.rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert "celery_singleton_lock/py.typed" in names
    web = package / "contrib" / "web"
    assets = {
        p.relative_to(ROOT).as_posix() for d in ("templates", "static") for p in (web / d).iterdir()
    }
    assert assets <= names, sorted(assets - names)  # the locks page's templates and script
    info = f"celery_singleton_lock-{version}.dist-info"
    assert f"{info}/licenses/LICENSE" in names
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert f"Version: {version}" in metadata
    assert "License-Expression: MIT" in metadata
    assert "singleton = celery_singleton_lock.contrib.cli:singleton" in entry_points


def test_the_sdist_carries_the_license_the_readme_and_the_package(dist: Path) -> None:
    [sdist] = dist.glob("celery_singleton_lock-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    shipped = {"LICENSE", "README.md", "pyproject.toml", "celery_singleton_lock/contrib/cli.py"}
    assert shipped <= names


CLEAN_APP = """
import os
from celery import Celery
from celery_singleton_lock import singleton_task

app = Celery("cleanapp", broker=os.environ["URL"], backend=os.environ["URL"])


@singleton_task(app=app)
def add(x, y):
    return x + y
"""

CLEAN_CALL = """
from cleanapp import add
first = add.delay(2, 3)
assert add.delay(2, 3).id == first.id  # the duplicate is refused: the holder's result
print("result", first.get(timeout=60))
"""


def test_a_clean_install_of_the_wheel_runs_a_worker_on_a_redis_broker(
    dist: Path, tmp_path: Path, raw: object, redis_server: RedisServer
) -> None:
    """pip install of the wheel alone (no test or dev tools) into a new virtualenv: a
    real worker on a redis:// broker starts, and a dispatch runs once."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    [wheel] = dist.glob("*.whl")
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        check=True, timeout=600,
    )  # fmt: skip
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.lower()  # fmt: skip
    assert "pytest" not in listed  # nothing of the test environment leaks in
    (tmp_path / "cleanapp.py").write_text(CLEAN_APP)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "URL": redis_server.url, "HOME": str(tmp_path)}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [venv / "bin" / "celery", "-A", "cleanapp", "worker", "-P", "solo", "-l", "info",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while " ready." not in log.read_text(errors="replace"):
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.1)
        called = subprocess.run(
            [python, "-c", CLEAN_CALL],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert called.returncode == 0, called.stdout + called.stderr
        assert "result 5" in called.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
    assert log.read_text(errors="replace").count("succeeded") == 1
