"""The bench reads where its apps connect after it has set the environment: importing
its runner does not read ``benchmarks.settings`` (its values would stay the defaults)."""

from __future__ import annotations

import subprocess
import sys

from ..support.workers import ROOT

CHECK = "import sys, benchmarks.run; print('benchmarks.settings' in sys.modules)"


def test_the_runner_reads_no_settings_as_it_is_imported() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "False"
