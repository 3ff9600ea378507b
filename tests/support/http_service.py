"""A server process of a test's own (Flower, Prometheus): a free loopback port, its output in
a log, ready once its health URL answers, stopped by its process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from .runs import wait_for
from .servers import free_port


class HttpService:
    """Started by ``start``; ``HEALTH`` is the path that answers once it serves."""

    HEALTH = "/"

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_for(self._answers, 30, f"{type(self).__name__} answering")

    def _answers(self) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, self.output()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.HEALTH}", timeout=2).read()
        except OSError:
            return False
        return True

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)


__all__ = ["HttpService"]
