"""Network partitions: a worker or producer in a network namespace cut off from the lock store.

The namespace (``tests/support/netns.py``) reaches this module's own servers at the
host end of a veth pair; nft rules inside it drop its traffic to the lock store's port
(both ways, or one way), and a relay slows it down. Workers outside it keep full
access, so one can take over what the cut-off one held. Real processes throughout:
``celery worker`` in the namespace (``ip netns exec``), redis-server on the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from ..support.netns import DelayRelay, unavailable
from ..support.runs import runs, started, wait_for
from ..support.workers import ROOT, Worker
from .checker import assert_outage, check, outage_figures
from .conftest import Figures, size
from .net import APP, KEPT, REFUSED, Net, keys_left, record_of, timeouts

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(unavailable()), reason=str(unavailable()))]


class TestCutOffHolder:
    @pytest.mark.parametrize("way", ["both", "out", "in"])
    def test_cut_off_holder_learns_first_and_is_fenced(
        self, net: Net, figures: Figures, way: str
    ) -> None:
        """The lease expires on the server while its worker cannot reach it; a worker
        outside takes the key with a greater fence. The cut-off run learns of the loss
        (``on_lost``, ``check()``) before the successor starts, and its write to the
        fenced store is refused. One way too: with answers dropped (``in``), its
        renewals still land, so the key lives until a ttl after the last one did."""
        ttl = 2.0
        inner = net.worker(ttl, inside=True, concurrency=1)
        outer = net.worker(ttl, inside=False, concurrency=1)
        try:
            cut_off = net.send("p", 4 * ttl, inner.queue)
            wait_for(lambda: started(net.host), 20, "the holder to start")
            time.sleep(0.3)
            net.ns.cut(net.lock.port, way=way)
            cut_at = time.time()
            time.sleep(ttl)  # the lease can only have run out on the server after this
            successor = net.send("p", 0.0, outer.queue)
            took_over = net.result(successor, 30)
            net.ns.heal()
            late = net.result(cut_off, 30)
            after = net.result(net.send("p2", 2 * ttl, inner.queue), 30)  # renewal resumed
            left = keys_left(net, ttl)
        finally:
            inner.stop()
            outer.stop()
        first, second = record_of(net, cut_off.id), record_of(net, successor.id)
        figures.record(
            f"partition_{way}",
            ttl_s=ttl,
            learned_after_cut_s=round(late["lost_at"] - cut_at, 3),
            learned_before_successor_s=round(second["start"] - late["lost_at"], 3),
            on_lost_before_check_raised_s=round(late["check_raised_at"] - late["lost_at"], 3),
            stale_write_refused=not late["accepted"],
            successor_fence_greater=second["fence"] > first["fence"],
            keys_left=len(left),
        )
        assert late["lost"]
        assert late["lost_at"] is not None
        assert not late["accepted"]
        assert took_over == {**took_over, "accepted": True, "lost": False}
        assert second["fence"] > first["fence"]
        assert late["lost_at"] < second["start"]  # told before anyone else could take it
        assert late["lost_at"] - cut_at <= ttl + 0.1
        # on_lost has run by the time check() first raises (whichever thread found it).
        assert late["lost_at"] <= late["check_raised_at"]
        assert after == KEPT
        assert left == []

    def test_a_partition_shorter_than_the_lease_keeps_it(self, net: Net, figures: Figures) -> None:
        """Cut for a third of the ttl while the run holds the key: renewal fails, then
        resumes when the link heals, and the run never knew (same fence, write accepted)."""
        ttl = 3.0
        inner = net.worker(ttl, inside=True, concurrency=1)
        try:
            result = net.send("short", 3 * ttl, inner.queue)
            wait_for(lambda: started(net.host), 20, "the holder to start")
            time.sleep(0.5)
            net.ns.cut(net.lock.port)
            time.sleep(ttl / 3)
            net.ns.heal()
            outcome = net.result(result, 30)
            left = keys_left(net, ttl)
        finally:
            inner.stop()
        figures.record("partition_short", ttl_s=ttl, cut_s=ttl / 3, lease_kept=not outcome["lost"])
        assert outcome == KEPT
        assert left == []


PRODUCER = """
import json, sys, time
from celery_singleton_lock import DuplicateTaskError
import tests.support.celery_app as m
queue, calls = sys.argv[1], int(sys.argv[2])
m.work.apply_async(("warm",), queue=queue)  # connections open before the cut
print("ready", flush=True)
for phase in ("cut", "healed"):
    sys.stdin.readline()
    for _ in range(calls):
        began = time.monotonic()
        try:
            outcome = ["sent", m.work.apply_async(("part-d",), queue=queue).id]
        except DuplicateTaskError as error:
            outcome = ["duplicate", error.task_id]
        except Exception as error:
            outcome = ["refused", type(error).__name__]
        print(json.dumps([phase, *outcome, round(time.monotonic() - began, 3)]), flush=True)
    print("done", flush=True)
"""


class TestProducerCutOff:
    @pytest.mark.parametrize("policy", ["fail_closed", "fail_open"])
    def test_dispatch_during_a_partition_follows_the_policy(
        self, net: Net, figures: Figures, policy: str
    ) -> None:
        """A producer that reaches the broker but not the lock store: fail_closed
        publishes nothing and says so; fail_open publishes without the duplicate check.
        Once healed, the first call takes the key and the rest are refused as
        duplicates; no message is ever published twice, and the copies fail_open let
        through run one at a time."""
        calls, timeout = 2, 1.0
        queue = f"part-{policy}"
        producer = subprocess.Popen(
            [*net.ns.prefix, sys.executable, "-c", PRODUCER, queue, str(calls)],
            cwd=ROOT,
            # A second's timeouts, so the suite does not wait out the default five
            # (with which the first call during the cut took 10 s, the next 5 s).
            env={**os.environ, **net.inside, **timeouts(policy, timeout)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert producer.stdin is not None
        assert producer.stdout is not None
        lines: list[list[Any]] = []
        try:
            assert producer.stdout.readline().strip() == "ready"
            net.ns.cut(net.lock.port)
            for _phase in ("cut", "healed"):
                producer.stdin.write("go\n")
                producer.stdin.flush()
                while (line := producer.stdout.readline().strip()) != "done":
                    assert line, "the producer ended early"
                    lines.append(json.loads(line))
                net.ns.heal()
            producer.stdin.close()
            producer.wait(30)
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait(5)
            producer.stdout.close()
        broker = net.host.broker.client()
        queued = [json.loads(m)["headers"]["id"] for m in broker.lrange(queue, 0, -1)]
        during = [line for line in lines if line[0] == "cut"]
        healed = [line for line in lines if line[0] == "healed"]
        worker = net.worker(10.0, inside=False, queue=queue)
        try:
            wait_for(lambda: len(runs(net.host)) >= len(queued), 60, "the queue to drain")
            time.sleep(0.5)
        finally:
            worker.stop()
        verdict = check(
            [r for r in runs(net.host) if r["item"] == "part-d"],
            submitted=[q for q in queued if q in {line[2] for line in lines}],
            exactly_once=True,
        )
        figures.record(
            f"partition_dispatch_{policy}",
            calls_during=calls,
            refused_during=sum(line[1] == "refused" for line in during),
            published_during=sum(line[1] == "sent" for line in during),
            seconds_per_call_during=max(line[3] for line in during),
            distinct_ids_after_heal=len({line[2] for line in healed}),
            overlaps=len(verdict.overlaps),
        )
        assert len(queued) == len(set(queued))  # nothing published twice
        assert max(line[3] for line in during) <= 2 * timeout + 0.5
        if policy == "fail_closed":
            assert [line[1:3] for line in during] == [REFUSED] * calls
        else:
            assert [line[1] for line in during] == ["sent"] * calls
        # Healed: the first call takes the key and publishes; the rest get its result.
        [after_heal] = {line[2] for line in healed}
        assert [line[1] for line in healed] == ["sent"] * calls
        assert queued.count(after_heal) == 1
        assert verdict.ok, verdict.summary()


class TestWorkerCutOff:
    @pytest.mark.parametrize("policy", ["fail_closed", "fail_open"])
    def test_runs_arriving_during_a_partition_follow_the_policy(
        self, net: Net, figures: Figures, policy: str
    ) -> None:
        """Messages reach a worker that cannot reach the lock store: fail_closed runs
        none of them until the link heals (each is sent again later), fail_open runs
        them unlocked and says so; either way each runs once, and nothing is left."""
        ttl, timeout = 2.0, 1.0
        inner = net.worker(ttl, inside=True, extra_env=timeouts(policy, timeout))
        try:
            net.ns.cut(net.lock.port)
            sent = [
                net.sender.send_task(f"{APP}.swarm", (f"cut-{i}",), queue=inner.queue).id
                for i in range(size("outage_tasks"))
            ]
            if policy == "fail_open":  # each learns the store is out of reach, then runs
                with contextlib.suppress(AssertionError):
                    wait_for(lambda: len(runs(net.host)) >= len(sent),
                             4 * timeout + len(sent) * timeout, "every unlocked run")  # fmt: skip
            else:
                time.sleep(4 * timeout)
            ran_during = len(runs(net.host))
            net.ns.heal()
            wait_for(lambda: len(runs(net.host)) >= len(sent), 90, "every run")
            log = inner.output()
            left = keys_left(net, ttl)
        finally:
            inner.stop()
        verdict = check(runs(net.host), submitted=sent, exactly_once=True)
        figures.record(f"partition_worker_{policy}", **outage_figures(verdict, sent, ran_during))
        assert_outage(verdict, policy, sent, ran_during, log)
        assert left == []


class TestSlowLink:
    def test_leases_hold_over_a_slow_link(self, net: Net, figures: Figures) -> None:
        """The lock store 2 x 100 ms away (a relay: this kernel has no netem): leases of
        ten round trips (2 s) hold while renewed, contending copies take turns, nothing
        runs twice at once. (At 1 s they do not: a new connection's first renewal costs
        four round trips, redis-py's handshake and the script's first load.)"""
        ttl, delay = 2.0, 0.1
        relay = DelayRelay(net.ns.host_ip, net.lock.port, delay).start()
        slow = {**net.inside, "CSL_LOCK_URL": f"redis://{net.ns.host_ip}:{relay.port}/0"}
        inner = Worker(slow, extra_env={"CSL_TTL": str(ttl)}, prefix=net.ns.prefix, concurrency=4)
        inner.start()
        try:
            held = [net.send(f"slow-{i}", 3 * ttl, inner.queue) for i in range(2)]
            swarm = [
                net.sender.send_task(f"{APP}.swarm", ("slow-swarm", 0.05), queue=inner.queue)
                for _ in range(size("outage_tasks"))
            ]
            outcomes = [net.result(r, 60) for r in held]
            for r in swarm:
                net.result(r, 60)
            left = keys_left(net, ttl)
        finally:
            inner.stop()
            relay.stop()
        verdict = check(runs(net.host), submitted=[r.id for r in held + swarm], exactly_once=True)
        figures.record(
            "partition_slow_link",
            ttl_s=ttl,
            added_round_trip_s=2 * delay,
            leases_kept=sum(not o["lost"] for o in outcomes),
            executions=verdict.executions,
            overlaps=len(verdict.overlaps),
        )
        assert all(o["accepted"] and not o["lost"] for o in outcomes)
        assert verdict.ok, verdict.summary()
        assert left == []


class TestWaiterCutOff:
    def test_a_waiting_run_cut_off_ends_its_wait_and_runs_after_the_heal(
        self, net: Net, figures: Figures
    ) -> None:
        """A run waiting for its key (``on_contention=wait``, a BLPOP with no socket
        timeout) when the link drops: the wait ends by its own timeout plus a grace as
        an outage (fail_closed: sent again later), not never; after the heal it runs
        once, after the holder, never beside it."""
        ttl = 2.0
        inner = net.worker(ttl, inside=True, concurrency=1)
        outer = net.worker(ttl, inside=False, concurrency=1)
        try:
            holder = net.send("w", 3 * ttl, outer.queue, task="patient")
            wait_for(lambda: started(net.host), 20, "the holder to start")
            waiter = net.send("w", 0.0, inner.queue, task="patient")
            time.sleep(0.5)  # the waiter is in its BLPOP
            net.ns.cut(net.lock.port)
            cut_at = time.time()
            wait_for(lambda: "unreachable" in inner.output(), 3 * ttl + 5, "the wait to end")
            ended_after = time.time() - cut_at
            net.ns.heal()
            net.result(holder, 30)
            net.result(waiter, 60)
            left = keys_left(net, ttl)
        finally:
            inner.stop()
            outer.stop()
        verdict = check(runs(net.host), submitted=[holder.id, waiter.id], exactly_once=True)
        figures.record(
            "partition_waiter",
            ttl_s=ttl,
            wait_ended_after_cut_s=round(ended_after, 2),
            executions=verdict.executions,
            overlaps=len(verdict.overlaps),
        )
        assert verdict.ok, verdict.summary()
        assert left == []
