"""Real ``celery worker`` processes (prefork unless asked) for the tests, stopped by PID."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from celery_singleton_lock.holders import is_dead

ROOT = Path(__file__).resolve().parent.parent.parent
_names = itertools.count(1)

# A worker's own account of itself, asked over the broker (Celery's remote control) by a
# process configured from the worker's environment, so it reaches the worker's broker
# whatever the test's own app is connected to.
INSPECT = """
import importlib, json, sys
app = importlib.import_module(sys.argv[1]).app
node = sys.argv[2]
inspect = app.control.inspect(destination=[node], timeout=10)
replies = {what: (getattr(inspect, what)() or {}).get(node) for what in sys.argv[3:]}
print(json.dumps(replies))
"""


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


class Worker:
    """One ``celery -A <app> worker`` (prefork unless ``pool`` says) on its own queue."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        concurrency: int = 2,
        extra_env: Mapping[str, str] | None = None,
        queue: str | None = None,
        app: str = "tests.support.celery_app",
        loglevel: str = "info",
        pool: str = "prefork",
        prefix: Sequence[str] = (),
        without: Sequence[str] = ("gossip", "mingle", "heartbeat"),
    ) -> None:
        self.pool = pool
        self.without = [f"--without-{step}" for step in without]
        self.prefix = list(prefix)  # e.g. ``ip netns exec NAME``: run it in a namespace
        self.app = app
        self.loglevel = loglevel
        number = next(_names)
        self.name = f"w{number}-{os.getpid()}"
        self.queue = queue or f"q-{self.name}"
        self.env = {**os.environ, **env, **(extra_env or {}), "CSL_QUEUE": self.queue}
        self.concurrency = concurrency
        self.log = Path(tempfile.mkdtemp(prefix="csl-worker-")) / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Worker:
        args = [
            *self.prefix, sys.executable, "-m", "celery", "-A", self.app, "worker",
            "-P", self.pool, "-c", str(self.concurrency), "-n", f"{self.name}@%h",
            "-Q", self.queue, "-l", self.loglevel, *self.without,
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.output()[-3000:]}")
            if " ready." in self.output():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"worker not ready in {timeout}s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def nodename(self) -> str:
        """The worker's node name, as remote control commands address it."""
        return f"{self.name}@{socket.gethostname()}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def took(self, token: bytes | None) -> bool:
        """Whether ``token`` is a running lease this worker's main process took as the
        message arrived (the default mode's lease of a received message)."""
        return (token or b"").startswith(f"x|{self.nodename}|{self.pid}|".encode())

    def inspect(self, *commands: str) -> dict[str, Any]:
        """The worker's replies to Celery's remote control ``inspect`` commands, by
        command (by default its ``active``, ``reserved`` and ``scheduled`` tasks)."""
        asked = commands or ("active", "reserved", "scheduled")
        done = subprocess.run(
            [sys.executable, "-c", INSPECT, self.app, self.nodename, *asked],
            cwd=ROOT, env={**self.env, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        replies: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        assert None not in replies.values(), f"{self.nodename} did not answer: {replies}"
        return replies

    def idle(self) -> bool:
        """Whether the worker has no task running, reserved or waiting for its ETA."""
        replies = self.inspect()
        return not (replies["active"] or replies["reserved"] or replies["scheduled"])

    def children(self) -> list[int]:
        return children_of(self.pid)

    def settle(self, timeout: float = 15.0) -> None:
        """Wait until the pool is back to full size after a child died.

        Celery's pool notices a dead child in its maintenance pass (every 5 s) and
        counts it busy until then, so a test right after a kill would otherwise run on
        one child where it means two. A dead child stays a zombie until that pass.
        """
        if self.pool != "prefork":
            return  # no children: nothing to replace
        deadline = time.monotonic() + timeout
        while True:
            children = self.children()
            if len(children) == self.concurrency and not any(map(is_dead, children)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"pool not back to {self.concurrency} in {timeout}s")
            time.sleep(0.05)

    def rss_kib(self) -> int:
        """Resident memory of the main process."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and pool children at once."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        # Pool children left behind by a warm shutdown that was cut short.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process = None
