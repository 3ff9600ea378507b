"""A network namespace a test made, joined to the host by a veth pair, that nft cuts off.

The partition tests run a worker (or a producer) inside it: it reaches the test's
servers only at the host end of its veth pair, so rules in its own namespace can drop
its traffic to one server's port, both ways or one way, and a relay on the host can
slow it down. Nothing here touches the host's own network settings: the rules live in
the namespace, which is deleted (with its veth pair) at the end.

Addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for benchmarking
network devices; they exist only on the veth pair, so no packet leaves the machine.
This kernel has no ``netem`` (``CONFIG_NET_SCH_NETEM`` is not set), so a slow link is
a relay that holds each chunk for a delay (``DelayRelay``), as toxiproxy's latency does.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .servers import free_port

RELAY = Path(__file__).with_name("relay.py")


def run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=10)


def unavailable() -> str | None:
    """Why this machine cannot make a namespace here, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (the test command installs them)"
    return None


class Namespace:
    """``csl<pid>n<index>``: one end of a veth pair at 198.18.<index>.2, the host end at .1."""

    def __init__(self, index: int) -> None:
        tag = f"{os.getpid() % 100000}n{index}"
        self.name = f"csl{tag}"
        self.host_if, self.ns_if = f"cslh{tag}", f"csln{tag}"
        self.host_ip, self.ns_ip = f"198.18.{index}.1", f"198.18.{index}.2"
        self.cut_ports: tuple[int, ...] = ()

    def create(self) -> Namespace:
        self.destroy()  # one left behind by a test run that was killed
        sweep_stale()
        run("ip", "netns", "add", self.name)
        try:
            run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            run("ip", "link", "set", self.ns_if, "netns", self.name)
            run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            run("ip", "link", "set", self.host_if, "up")
            self.inside("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            self.inside("ip", "link", "set", self.ns_if, "up")
            self.inside("ip", "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def inside(self, *args: str) -> None:
        run("ip", "netns", "exec", self.name, *args)

    @property
    def prefix(self) -> list[str]:
        """Put this before a command to run it inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def cut(self, *ports: int, way: str = "both") -> None:
        """Drop this namespace's traffic with the host's ``ports``: ``both`` ways, only
        ``out`` (requests never arrive) or only ``in`` (requests arrive and are carried
        out, answers never come back). TCP keeps retrying what it sent, as it would."""
        if way not in ("both", "out", "in"):
            raise ValueError(f"way is both, out or in, not {way!r}")
        self.heal()
        listed = ", ".join(map(str, ports))
        rules = ["add table inet csl"]
        if way in ("both", "out"):
            rules += [
                "add chain inet csl out { type filter hook output priority 0; }",
                f"add rule inet csl out ip daddr {self.host_ip} tcp dport {{ {listed} }} drop",
            ]
        if way in ("both", "in"):
            rules += [
                "add chain inet csl in { type filter hook input priority 0; }",
                f"add rule inet csl in ip saddr {self.host_ip} tcp sport {{ {listed} }} drop",
            ]
        self._nft("\n".join(rules))
        self.cut_ports = ports

    def _nft(self, script: str) -> None:
        subprocess.run(
            [*self.prefix, "nft", "-f", "-"],
            input=script.encode(),
            check=True,
            capture_output=True,
            timeout=10,
        )

    def heal(self) -> None:
        self.inside("nft", "flush", "ruleset")
        self.cut_ports = ()

    def pids(self) -> list[int]:
        out = subprocess.run(
            ["ip", "netns", "pids", self.name],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return [int(p) for p in out.split()]

    def destroy(self) -> None:
        """Kill what still runs inside, then delete the namespace (and its veth pair)."""
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            run("ip", "netns", "del", self.name)
        with contextlib.suppress(subprocess.CalledProcessError):
            run("ip", "link", "del", self.host_if)  # gone with the namespace, normally


def sweep_stale() -> None:
    """Delete the namespaces of test runs that were killed (their pid is gone): their
    host ends keep 198.18.<index>.1, and a second route to it cuts the new one off."""
    listed = subprocess.run(
        ["ip", "netns", "list"], check=False, capture_output=True, text=True, timeout=10
    ).stdout
    for line in listed.splitlines():
        match = re.fullmatch(r"csl(\d+)n(\d+)", line.split(" ", 1)[0])
        if match is None or int(match.group(1)) == os.getpid() % 100000:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            stale = Namespace.__new__(Namespace)
            tag = f"{match.group(1)}n{match.group(2)}"
            stale.name, stale.host_if = f"csl{tag}", f"cslh{tag}"
            stale.destroy()
        except PermissionError:
            continue  # alive, someone else's


class DelayRelay:
    """A TCP relay on the host end of a namespace's veth pair that holds every chunk
    ``delay`` seconds each way: a slow link to one server, in its own process."""

    def __init__(self, listen_host: str, target_port: int, delay: float) -> None:
        self.listen_host, self.target_port, self.delay = listen_host, target_port, delay
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> DelayRelay:
        self.process = subprocess.Popen(
            [sys.executable, str(RELAY), self.listen_host, str(self.port),
             "127.0.0.1", str(self.target_port), str(self.delay)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.stdout.readline().strip() == b"ready":
                return self
        self.stop()
        raise RuntimeError("the delay relay did not start")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None
