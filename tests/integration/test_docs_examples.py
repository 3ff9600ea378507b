"""Every Python block of the documentation runs, page by page, in order
(``tests/support/docs_runner.py``: one new interpreter per page, a private Redis for the
pages that talk to one)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..support.docs_runner import python_blocks
from ..support.servers import RedisServer
from ..support.workers import ROOT

DOCS = ROOT / "docs"
PAGES = sorted(page.name for page in DOCS.glob("*.md") if python_blocks(page))


def test_the_pages_with_examples_are_all_checked() -> None:
    # index.md includes the README's example, which tests/integration/test_readme.py runs
    assert {"getting-started.md", "lease.md", "migration.md", "modes.md"} <= set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(page: str, redis_server: RedisServer) -> None:
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{redis_server.port}/0"}
    ran = subprocess.run(
        [sys.executable, "-m", "tests.support.docs_runner", str(DOCS / page)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
