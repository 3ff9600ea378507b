"""The example project's own tests (example_project/tests), run as a user would run theirs:
a fresh pytest process that finds the plugin through its entry point, once on the
in-memory store and once on a real Redis (``--singleton-lock-url``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..support.servers import RedisServer
from ..support.workers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.oneoff]


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_the_example_projects_tests_pass_with_the_plugin(
    store: str, redis_server: RedisServer
) -> None:
    url = ["--singleton-lock-url", redis_server.url] if store == "redis" else []
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "example_project/tests", "-q", "-p", "no:randomly",
         *url],
        cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=240,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # The test that moves the store's clock by hand runs on memory:// only.
    assert ("6 passed" if store == "memory" else "5 passed, 1 skipped") in done.stdout
