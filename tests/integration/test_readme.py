"""The README's example runs as a newcomer runs it: saved as a file, a worker started
beside it with the README's command, and the script printing what the README shows."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from ..support.servers import RedisServer
from ..support.workers import ROOT


def readme_blocks() -> list[tuple[str, str]]:
    """Every fenced block of the README, as (language, text)."""
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)


def test_the_readme_example_refuses_the_second_call_on_a_real_worker(tmp_path: Path) -> None:
    blocks = readme_blocks()
    example = next(text for lang, text in blocks if lang == "python")
    at = next(i for i, (lang, text) in enumerate(blocks) if "example.py" in text and lang == "bash")
    commands = [line for line in blocks[at][1].splitlines() if line.strip()]
    printed = blocks[at + 1][1]
    assert blocks[at + 1][0] == "", "the commands are followed by what they print"
    worker_line, run_line = commands
    assert worker_line.endswith("&"), worker_line

    (tmp_path / "example.py").write_text(example)
    server = RedisServer().start()
    # A newcomer's shell, not the suite's (no DJANGO_SETTINGS_MODULE another test set):
    # ``celery`` and ``python`` as the virtualenv the suite runs in has them.
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "REDIS_URL": server.url,
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            shlex.split(worker_line.rstrip("&")), cwd=tmp_path, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        # The script's messages wait in the queue until the worker is up.
        ran = subprocess.run(
            shlex.split(run_line), cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
        said = ran.stdout + ran.stderr + log.read_text(errors="replace")
        assert ran.returncode == 0, said
        assert ran.stdout == printed, said
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
        server.cleanup()
