"""``celery -A tests.support.celery_app singleton ...``, run in this process or as a new one."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback

from ..conftest import CeleryEnv
from .workers import ROOT

APP = "tests.support.celery_app"


def cli(
    cenv: CeleryEnv,
    *args: str,
    env: dict[str, str] | None = None,
    probe: bool = False,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.support.celery_app singleton <args>``: in this process through Celery's own
    command group (the test app is already configured), or as a new process found through
    the entry point (``process``, ``env``, ``probe``)."""
    if not (process or env or probe):
        from celery.bin.celery import celery as celery_command
        from click.testing import CliRunner

        done = CliRunner().invoke(celery_command, ["-A", APP, "singleton", *args])
        stderr = done.stderr
        if done.exc_info is not None and not isinstance(done.exception, SystemExit):
            # An exception the command let out: say which, or a failure reads as empty.
            stderr += "".join(traceback.format_exception(*done.exc_info))
        return subprocess.CompletedProcess(args, done.exit_code, done.stdout, stderr)
    runner = ["tests.support.cli_probe"] if probe else ["celery"]
    return subprocess.run(
        [sys.executable, "-m", *runner, "-A", APP, "singleton", *args],
        cwd=ROOT, env={**os.environ, **cenv.env, **(env or {})},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
