"""A private ``rabbitmq-server`` for the tests: loopback ports, its own node and data dir.

Debian's package (the test command installs it when missing, as root). Its own epmd
runs as our child on a free port, so nothing is left behind: both are stopped by PID
(process group) at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import kombu

from .servers import free_port

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # as root, without Debian's su wrapper


def rabbitmq_available() -> bool:
    return Path(RABBITMQ_SERVER).exists() and shutil.which("epmd") is not None


class RabbitMQServer:
    """One RabbitMQ node (and its epmd) on free loopback ports."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="csl-rabbitmq-"))
        self.node = f"csl{self.port}@localhost"
        self._epmd_port = free_port()
        self._epmd: subprocess.Popen[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _env(self) -> dict[str, str]:
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        (self.dir / "enabled_plugins").write_text("[].\n")
        return {
            **os.environ,
            "HOME": str(self.dir),  # the Erlang cookie lives there
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "ERL_EPMD_PORT": str(self._epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
            "RABBITMQ_LOGS": "-",
        }

    def start(self, timeout: float = 90.0) -> RabbitMQServer:
        env = self._env()
        with (self.dir / "server.log").open("ab") as log:
            self._epmd = subprocess.Popen(
                ["epmd", "-port", str(self._epmd_port), "-address", "127.0.0.1"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            self.process = subprocess.Popen(
                [RABBITMQ_SERVER], env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"rabbitmq-server exited:\n{self.output()[-3000:]}")
            if "Server startup complete" in self.output():
                with contextlib.suppress(Exception), kombu.Connection(self.url) as connection:
                    connection.connect()
                    return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"rabbitmq-server not up in {timeout}s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        path = self.dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for process in (self.process, self._epmd):
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.process = self._epmd = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
