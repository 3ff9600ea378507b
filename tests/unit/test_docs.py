"""The documentation site builds in strict mode (no broken link, no page left out of the
navigation), and the configuration page names every setting and task option there is."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from celery_singleton_lock.config.options import OPTION_NAMES
from celery_singleton_lock.config.settings import DEFAULTS

from ..support.workers import ROOT

DOCS = ROOT / "docs"


@pytest.mark.slow
@pytest.mark.oneoff
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "operations" / "index.html").exists()
    for config in ("default", "separate"):
        assert (tmp_path / "img" / f"benchmark-ratios-{config}.svg").exists()


def test_the_configuration_page_names_every_setting_and_option() -> None:
    page = (DOCS / "configuration.md").read_text()
    for setting in DEFAULTS:
        assert f"`{setting}`" in page, setting
        assert f"`CELERY_{setting.upper()}`" in page, setting
    for option in OPTION_NAMES:
        assert f"`{option}`" in page, option


def test_the_readme_is_a_front_door() -> None:
    """Tables live once, in the docs; the README stays short (its example runs in
    tests/integration/test_readme.py, on a real worker)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    assert "\n|" not in readme, "a table in README.md: it belongs on its docs page"
    # What it is, Install, a short example, then the two commands.
    sections = re.findall(r"^## (.+)$", readme, re.M)
    assert sections[:3] == ["Install", "Example", "The demo and the tests"], sections
    example = re.search(r"^```python\n(.*?)^```", readme, re.S | re.M)
    assert example is not None
    assert len(example.group(1).splitlines()) <= 25


def test_every_image_a_page_shows_exists() -> None:
    for page in DOCS.glob("*.md"):
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text()):
            assert (DOCS / image).exists(), f"{page.name} shows {image}, which is missing"


ROOMS = ("lease", "modes", "config", "broker", "publish", "run", "worker", "contrib", "task")


def _items(cell: str) -> list[str]:
    """A table cell's items: split at commas and semicolons outside parentheses."""
    items, depth, current = [], 0, ""
    for char in cell:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char in ",;" and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += char
    return [*items, current.strip()]


def test_the_design_page_names_modules_that_exist() -> None:
    package = Path(importlib.import_module("celery_singleton_lock").__file__ or "").parent
    page = (DOCS / "design.md").read_text()
    rooms = page.split("## The rooms", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in rooms.splitlines() if line.startswith("| `")]
    assert len(rows) >= 10, "the rooms table"
    for room, _, modules in rows:
        folder = package / room.strip().strip("`").rstrip("/")
        for item in _items(modules):
            name = re.match(r"`([a-z_]+)`", item)
            if name is not None:
                module = folder / name.group(1)
                assert module.with_suffix(".py").exists() or module.is_dir(), (room, item)
    # Dotted names in the text (`run.execution.Execution.take`) resolve to what they name.
    for dotted in set(re.findall(rf"`((?:{'|'.join(ROOMS)})\.[\w.]+)`", page)):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(
                    "celery_singleton_lock." + ".".join(parts[:cut])
                )
            except ImportError:
                continue
            for attribute in parts[cut:]:
                assert hasattr(found, attribute), dotted
                found = getattr(found, attribute)
            break
        else:
            raise AssertionError(f"{dotted}: no such module")


def test_the_design_page_names_every_module() -> None:
    """The rooms table is the tree: every module is named in its folder's row (or a
    parent folder's, as `contrib/`'s row names the locks page's modules)."""
    package = Path(importlib.import_module("celery_singleton_lock").__file__ or "").parent
    page = (DOCS / "design.md").read_text()
    rooms = page.split("## The rooms", 1)[1].split("\n## ", 1)[0]
    named: dict[Path, set[str]] = {}
    for line in rooms.splitlines():
        if line.startswith("| `"):
            room, _, modules = line.split("|")[1:-1]
            folder = Path(room.strip().strip("`").rstrip("/"))
            named.setdefault(folder, set()).update(re.findall(r"`([a-z_]+)`", modules))
    for module in package.rglob("*.py"):
        if module.name == "__init__.py":
            continue
        folder = module.parent.relative_to(package)
        rooms_up = [folder, *folder.parents]
        assert any(module.stem in named.get(room, ()) for room in rooms_up), (
            f"{module.relative_to(package)} is in no row of docs/design.md's rooms table"
        )
