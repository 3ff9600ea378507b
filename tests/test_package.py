"""The release: sdist and wheel build, pass ``twine check``, and carry every module, the
LICENSE, the typing marker and the entry points, at the version the package reports."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import celery_singleton_lock

from .workers import ROOT

pytestmark = pytest.mark.slow


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
    info = f"celery_singleton_lock-{version}.dist-info"
    assert f"{info}/licenses/LICENSE" in names
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert f"Version: {version}" in metadata
    assert "License-Expression: MIT" in metadata
    assert "singleton = celery_singleton_lock.cli:singleton" in entry_points


def test_the_sdist_carries_the_license_the_readme_and_the_package(dist: Path) -> None:
    [sdist] = dist.glob("celery_singleton_lock-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", "celery_singleton_lock/cli.py"} <= names
