"""What the partition and clock scenarios share: a network namespace, the servers its
processes reach at its host address, and views of them from either side.

The fixtures (``net``) are in conftest.py; each test module asks for them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.states import READY_STATES

from ..conftest import CeleryEnv
from ..support.netns import Namespace
from ..support.runs import lock_keys, runs, wait_for
from ..support.servers import RedisServer
from ..support.workers import Worker

APP = "tests.support.celery_app"


@dataclass
class Net:
    """A namespace, the servers its processes reach at its host address, and both views."""

    ns: Namespace
    host: CeleryEnv  # URLs at 127.0.0.1: the test, and workers outside the namespace
    inside: dict[str, str]  # the same servers at the host end of the veth pair
    sender: Celery

    @property
    def lock(self) -> RedisServer:
        return self.host.lock

    def send(self, item: str, seconds: float, queue: str, task: str = "cut_off_writer") -> Any:
        return self.sender.send_task(f"{APP}.{task}", (item, seconds), queue=queue)

    def result(self, call: Any, timeout: float = 30.0) -> Any:
        """The call's result, polled from the backend: ``AsyncResult.get`` subscribes, and
        the subscription would outlive these servers (the session's end stops them)."""
        meta = wait_for(
            lambda: (
                (m := self.sender.backend.get_task_meta(call.id))["status"] in READY_STATES and m
            ),
            timeout,
            f"the result of {call.id}",
        )
        assert meta["status"] == "SUCCESS", meta
        return meta["result"]

    def worker(self, ttl: float, *, inside: bool, **options: Any) -> Worker:
        env = self.inside if inside else self.host.env
        prefix = self.ns.prefix if inside else []
        extra = {"CSL_TTL": str(ttl), **options.pop("extra_env", {})}
        return Worker(env, extra_env=extra, prefix=prefix, **options).start()


def at(server: RedisServer, address: str) -> str:
    return server.url.replace("127.0.0.1", address)


def net_servers() -> Iterator[Net]:
    """A namespace and three servers (broker, lock store, checker) it can reach."""
    ns = Namespace(7).create()
    # Each server listens on loopback and on the host end of the veth pair only.
    bind = ("--bind", "127.0.0.1", ns.host_ip, "--protected-mode", "no")
    servers = [RedisServer(*bind).start() for _ in range(3)]
    broker, lock, checker = servers
    host_env = {
        "CSL_BROKER_URL": broker.url, "CSL_LOCK_URL": lock.url, "CSL_CHECK_URL": checker.url
    }  # fmt: skip
    inside = {name: at(s, ns.host_ip) for name, s in zip(host_env, servers, strict=True)}
    sender = Celery("partition-tests", broker=broker.url, backend=broker.url)
    try:
        yield Net(ns, CeleryEnv(broker, lock, checker, host_env, None), inside, sender)
    finally:
        sender.close()
        ns.destroy()
        for server in servers:
            server.cleanup()


def fresh(net: Net) -> Net:
    """``net`` healed, with an empty lock store and checker."""
    net.ns.heal()
    for server in (net.host.lock, net.host.checker):
        server.client().flushall()
    return net


# What a run that kept its lease answers (cut_off_writer).
KEPT = {
    "accepted": True, "lost": False,
    "lost_at": None, "lost_at_real": None, "check_raised_at": None,
}  # fmt: skip
REFUSED = ["refused", "LockStoreUnavailableError"]


def timeouts(policy: str, seconds: float) -> dict[str, str]:
    return {"CSL_ON_REDIS_ERROR": policy, "CSL_SOCKET_TIMEOUT": str(seconds)}


def record_of(net: Net, task_id: str) -> dict[str, Any]:
    return next(r for r in runs(net.host) if r["id"] == task_id)


def keys_left(net: Net, ttl: float) -> list[bytes]:
    # Fence bookkeeping expires with the leases, a waiter's announcement a second later.
    time.sleep(ttl + 1.5)
    return lock_keys(net.host) + list(net.lock.client().scan_iter("t:*"))
