"""The figures the default ttl is chosen from: what renewal costs at 100 and 1,000
concurrent leases, and how long a key stays blocked after its whole worker is SIGKILLed
while a second worker waits for it."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from celery_singleton_lock import Lease, RedisLock

from ..conftest import CeleryEnv
from ..support.runs import runs, started, wait_for
from ..support.servers import RedisServer
from ..support.workers import Worker
from .conftest import SCALE, Figures

# Measurements for the reliability page, run by the chaos command: the promise they
# bound (a dead worker's key free within its ttl) is tested in the default suite (3b).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("CHAOS_RESULTS"), reason="runs with `dev.py chaos`"),
]

TTLS = (30.0, 10.0, 5.0) if SCALE == "full" else (10.0, 5.0)
RECOVERY_TTLS = (30.0, 10.0, 5.0) if SCALE == "full" else (5.0,)


class Counted(RedisLock):
    """A lock store counting its renewal round trips (one ``extend_many`` per batch)."""

    round_trips = 0

    def extend_many(self, leases: Sequence[Lease]) -> list[Any]:
        self.round_trips += 1
        return super().extend_many(leases)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def extends(server: RedisServer) -> int:
    stats = server.client().info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval")
    )


def test_what_renewal_costs_per_ttl_at_100_and_1000_leases(figures: Figures) -> None:
    rows: dict[str, dict[str, float]] = {}
    for ttl in TTLS:
        for count in (100, 1000):
            server = RedisServer().start()
            try:
                lock = Counted(server.client(), prefix="cost")
                leases = [lock.acquire(f"n{i}", ttl, blocking=False, renew=True)
                          for i in range(count)]  # fmt: skip
                time.sleep(ttl / 3)  # every lease renewed once: the steady state
                window = ttl / 3 * 2
                trips, commands = lock.round_trips, extends(server)
                ours, theirs = time.process_time(), cpu_seconds(server.pid)
                time.sleep(window)
                rows[f"ttl {ttl:g} s, {count} leases"] = {
                    "renewals_per_s": round((extends(server) - commands) / window, 1),
                    "round_trips_per_s": round((lock.round_trips - trips) / window, 1),
                    "client_cpu_pct": round(100 * (time.process_time() - ours) / window, 2),
                    "server_cpu_pct": round(100 * (cpu_seconds(server.pid) - theirs) / window, 2),
                }
                assert not any(lease.lost for lease in leases)
                for lease in leases:
                    lock.release(lease)
            finally:
                server.cleanup()
    figures.record("renewal_cost", **rows)
    for name, row in rows.items():
        ttl, count = float(name.split()[1]), int(name.split()[3])
        # Every lease is renewed every ttl/3, in batches: about 3/ttl per lease a second.
        assert row["renewals_per_s"] == pytest.approx(3 * count / ttl, rel=0.35)
        assert row["round_trips_per_s"] < row["renewals_per_s"]


@pytest.mark.parametrize("ttl", RECOVERY_TTLS)
def test_recovery_after_a_whole_worker_sigkill(
    cenv: CeleryEnv, figures: Figures, ttl: float
) -> None:
    """A run holds the key on worker A; its copy waits on worker B (requeued with backoff);
    A is SIGKILLed whole: the copy starts when the key's ttl runs out."""
    env = {"CSL_TTL": str(ttl)}
    holder, waiter = (
        Worker(cenv.env, extra_env=env).start(),
        Worker(cenv.env, extra_env=env).start(),
    )
    try:
        swarm = cenv.app_module.swarm
        first = swarm.apply_async(("recover", 600), queue=holder.queue)
        wait_for(lambda: any(s["id"] == first.id for s in started(cenv)), 30, "the holder to start")
        copy = swarm.apply_async(("recover", 0.1), queue=waiter.queue)
        time.sleep(ttl / 3 + 1)  # the holder has renewed at least once
        holder.kill()
        killed = time.time()
        wait_for(lambda: any(s["id"] == copy.id for s in started(cenv)), 2 * ttl + 10,
                 "the copy to start")  # fmt: skip
        assert copy.get(timeout=30) == "recover"
    finally:
        holder.stop()
        waiter.stop()
    recovery = next(r["start"] for r in runs(cenv) if r["id"] == copy.id) - killed
    figures.record("recovery", **{f"ttl {ttl:g} s: blocked after the kill (s)": round(recovery, 2)})
    assert recovery <= ttl + 1.0  # the ttl, and the waiter's backoff (cap 0.3 s)
