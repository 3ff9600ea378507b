"""Redis Cluster and Sentinel, started here from redis-server processes: the lease and the
Celery integration through the documented configuration, failovers, frozen nodes and
wrong topologies."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_singleton_lock import (
    AsyncRedisLock,
    BackpressureError,
    ConfigurationError,
    Contended,
    Lease,
    LockLostError,
    LockStoreConfigurationError,
    LockStoreUnavailableError,
    RedisLock,
    ReleaseResult,
)
from celery_singleton_lock.config.settings import SingletonConfig
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.lease import HOLD, LockKeys, Rate, companion, rates_of
from celery_singleton_lock.lease.limits.backlog import backlog_of
from celery_singleton_lock.lease.limits.overrides import Override, overrides_of
from celery_singleton_lock.worker.setupchecks import START_CHECK

from ..conftest import CeleryEnv
from ..support.apps import app_with, lock_url
from ..support.modes import concurrency
from ..support.rates import check_rate, rated_runs
from ..support.redlock import held
from ..support.runs import assert_no_overlap, runs, wait_for, wait_renewed
from ..support.topologies import Cluster, SentinelGroup
from ..support.workers import ROOT, Worker

APP = "tests.support.celery_app"  # the test app's module: its tasks' name prefix

pytestmark = [pytest.mark.slow, pytest.mark.oneoff]


# -- Cluster --------------------------------------------------------------------------


@pytest.fixture(name="cluster", scope="module")
def fixture_cluster() -> Iterator[Cluster]:
    cluster = Cluster(masters=3, replicas=1).start()
    try:
        yield cluster
    finally:
        cluster.cleanup()


class TestCluster:
    def test_keys_spread_over_every_master_and_fences_increase(self, cluster: Cluster) -> None:
        lock = RedisLock.from_url(cluster.url, prefix="spread")
        leases = [held(lock.try_acquire(f"n{i}", 10)) for i in range(30)]
        assert len({cluster.master_of(lease.key).port for lease in leases}) == 3
        assert isinstance(lock.try_acquire("n0", 10), Contended)
        for lease in leases:
            assert lock.release(lease) is ReleaseResult.RELEASED
        again = held(lock.try_acquire("n0", 10))
        assert again.fence > leases[0].fence
        lock.release(again)
        assert repr(lock).startswith("RedisLock(redis+cluster://127.0.0.1:")

    def test_a_history_lives_in_its_lock_s_slot_and_is_written_by_its_scripts(
        self, cluster: Cluster
    ) -> None:
        from celery_singleton_lock.lease import companion
        from celery_singleton_lock.lease.history import Record
        from celery_singleton_lock.lease.redis.recording import entries

        lock = RedisLock.from_url(cluster.url, prefix="hist")
        names = [f"h{i}" for i in range(12)]  # over every master
        for name in names:
            record = Record(lock.keys(name).history, {"take": ("accepted", "refused", "")})
            # A companion's hold writes in its lock's history: one slot, one script.
            pending = held(
                lock.try_acquire(companion(name, "pending"), 10, take=HOLD, entry=record)
            )
            lock.try_acquire(companion(name, "pending"), 10, entry=record)
            assert [e.event for e in entries(lock, lock.keys(name).history)] == [
                "refused", "accepted",
            ]  # fmt: skip
            lock.release(pending)
        assert len({cluster.master_of(lock.keys(n).history).port for n in names}) == 3

    def test_the_inventory_reads_every_master_and_the_cli_lists_them(
        self, cluster: Cluster, cenv: CeleryEnv
    ) -> None:
        lock = RedisLock.from_url(cluster.url, prefix="t")
        leases = [
            held(lock.try_acquire(f"inv{i}", 30, token=f"x|w@h|1|1-2|id{i}")) for i in range(30)
        ]
        try:
            found = {h.name: h for h in lock.holdings(batch=7)}  # several batches per master
            assert set(found) == {f"inv{i}" for i in range(30)}
            assert {found[f"inv{i}"].fence for i in range(30)} == {le.fence for le in leases}
            assert len({cluster.master_of(h.key).port for h in found.values()}) == 3
            listed = subprocess.run(
                [sys.executable, "-m", "celery", "-A", APP, "singleton", "list",
                 "--json"],
                cwd=ROOT, env={**os.environ, **cenv.env, "CSL_LOCK_URL": cluster.url},
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert listed.returncode == 0, listed.stderr
            rows = json.loads(listed.stdout)
            assert {r["task_id"] for r in rows} == {f"id{i}" for i in range(30)}
            assert {r["state"] for r in rows} == {"running"}
        finally:
            for lease in leases:
                lock.release(lease)

    def test_rates_keep_their_order_on_every_master(self, cluster: Cluster) -> None:
        lock = RedisLock.from_url(cluster.url, prefix="rates")
        rates, rate = rates_of(lock), Rate(10, 1.0)
        names = [f"r{i}" for i in range(12)]
        assert len({cluster.master_of(rates.key(n)).port for n in names}) == 3
        for name in names:
            slots = [rates.ask(name, rate, "reserve") for _ in range(3)]
            assert [s.state for s in slots] == ["now", "reserved", "reserved"]
            assert slots[2].at - slots[0].at == pytest.approx(0.2, abs=1e-6)

    def test_run_time_limits_several_rates_and_backlogs_on_every_master(
        self, cluster: Cluster
    ) -> None:
        lock = RedisLock.from_url(cluster.url, prefix="ops")
        rates, backlog = rates_of(lock), backlog_of(lock)
        calls, tokens = Rate(10, 1.0), Rate(100, 60.0, burst=10)
        names = [f"tenant:{i}" for i in range(12)]
        assert len({cluster.master_of(backlog_key(lock, n)).port for n in names}) == 3
        for name in names:
            # Two limits and a cost in one script, on the name's own slot.
            first = rates.ask(name, [(calls, 1.0), (tokens, 6.0)], "reserve")
            second = rates.ask(name, [(calls, 1.0), (tokens, 6.0)], "reserve")
            assert first.now
            assert second.limiting == 1  # 6 + 6 tokens: over the token burst of 10
            # A pause moves the schedule on by its length, once.
            moved = rates.ask(name, calls, "reserve", paused=(first.at, first.at + 5.0))
            assert moved.at - first.at > 5.0
            # At most 2 waiting; a third is refused until one starts.
            assert [backlog.enter(name, c, 2, 60).taken for c in "abc"] == [True, True, False]
            backlog.leave(name, "a")
            assert backlog.enter(name, "c", 2, 60).taken
        # The operators' overrides: one hash in a slot of its own, read with the cluster.
        overrides = overrides_of(lock)
        overrides.save(Override("tenant:{id}", rates=(Rate(5, 1.0),), paused=True))
        found = overrides.find("tenant:7", ["tenant:{id}"], fresh=True)
        assert found is not None
        assert found.paused
        overrides.save(Override("tenant:{id}"))
        assert overrides.find("tenant:7", ["tenant:{id}"], fresh=True) is None

    def test_a_lease_yields_to_its_pending_companion_on_the_cluster(self, cluster: Cluster) -> None:
        lock = RedisLock.from_url(cluster.url, prefix="yield")
        leases = [held(lock.try_acquire(f"y{i}", 30)) for i in range(6)]
        for lease in leases:
            lease.yield_to(companion(lease.name, "pending"), every=0.05)
            lock.renew(lease)
        waiting = held(lock.try_acquire(companion("y3", "pending"), 30))
        wait_for(lambda: leases[3].cancelled, 3, "the lease cancelled")
        # Every lease has looked at its own pending lock since that one was taken: two
        # renewals more each (one already on its way then may have looked before).
        wait_renewed(leases)
        assert [lease.cancelled for lease in leases] == [False, False, False, True, False, False]
        for lease in [*leases, waiting]:
            assert lock.release(lease) is ReleaseResult.RELEASED

    def test_a_cluster_node_given_as_a_plain_url_says_to_use_the_cluster_form(
        self, cluster: Cluster
    ) -> None:
        node = cluster.nodes[0]
        lock = RedisLock.from_url(f"redis://127.0.0.1:{node.port}/0", prefix="plain")
        # A name served by another master: the plain client gets MOVED.
        name = next(f"m{i}" for i in range(100) if cluster.master_of(f"plain:{{m{i}}}") is not node)
        with pytest.raises(LockStoreConfigurationError, match=r"redis\+cluster://"):
            lock.try_acquire(name, 10)

    def test_a_database_number_in_a_cluster_url_is_refused(self, cluster: Cluster) -> None:
        with pytest.raises(ConfigurationError, match="database 0"):
            RedisLock.from_url(cluster.url + "/3")

    def test_renewal_follows_a_replica_promoted_after_its_master_is_killed(self) -> None:
        cluster = Cluster(masters=3, replicas=1, node_timeout_ms=1000).start()
        try:
            lock = RedisLock.from_url(cluster.url, prefix="fo", socket_timeout=1)
            leases = [held(lock.acquire(f"f{i}", 8, blocking=False, renew=True)) for i in range(9)]
            victim = cluster.master_of(leases[0].key)
            time.sleep(0.5)  # replication on loopback is immediate; leave it room anyway
            victim.kill()
            wait_for(lambda: _promoted(cluster, leases[0].key, victim), 20, "failover")
            time.sleep(8 / 3 + 1)  # at least one renewal on the new topology
            for lease in leases:
                lease.check()
            assert lock.holder(leases[0].name) == leases[0].token
            for lease in leases:
                assert lock.release(lease) is ReleaseResult.RELEASED
        finally:
            cluster.cleanup()

    def test_a_frozen_master_costs_only_its_own_leases(self) -> None:
        cluster = Cluster(masters=3, replicas=0, node_timeout_ms=60_000).start()
        frozen = None
        try:
            lock = RedisLock.from_url(cluster.url, prefix="fz", socket_timeout=5)
            lost: dict[str, float] = {}
            leases = [
                held(
                    lock.acquire(
                        f"z{i}",
                        1.5,
                        blocking=False,
                        renew=True,
                        on_lost=lambda lease: lost.setdefault(lease.name, time.monotonic()),
                    )
                )
                for i in range(12)
            ]
            frozen = cluster.master_of(leases[0].key)
            doomed = [ls for ls in leases if cluster.master_of(ls.key) is frozen]
            kept = [ls for ls in leases if ls not in doomed]
            assert kept, "every name hashed to one master"
            expiry = max(lease.expires_at for lease in doomed)
            frozen.pause()
            time.sleep(4.0)
            for lease in kept:
                lease.check()  # renewed on their own masters all along
            for lease in doomed:
                assert lease.name in lost
                assert lost[lease.name] <= expiry + 0.5  # no later than check() would raise
                with pytest.raises(LockLostError):
                    lease.check()
            for lease in kept:
                lock.release(lease)
        finally:
            if frozen is not None:
                frozen.resume()
            cluster.cleanup()


def _promoted(cluster: Cluster, key: str, victim: Any) -> bool:
    with contextlib.suppress(Exception):
        cluster.wait_ok(timeout=0.5)
        return cluster.master_of(key) is not victim
    return False


@pytest.fixture(name="cluster_env")
def fixture_cluster_env(cenv: CeleryEnv, cluster: Cluster) -> Iterator[CeleryEnv]:
    with lock_url(cenv, cluster.url) as env:
        yield env


def test_celery_end_to_end_on_a_cluster(cluster_env: CeleryEnv, cluster: Cluster) -> None:
    worker = Worker(cluster_env.env, extra_env={"CSL_LOCK_URL": cluster.url}).start()
    try:
        work = cluster_env.app_module.work
        first = work.apply_async(("c", 1.0), queue=worker.queue)
        second = work.apply_async(("c", 1.0), queue=worker.queue)
        assert second.id == first.id  # deduplicated at dispatch, through the cluster
        assert first.get(timeout=30) == "c"
        app = cluster_env.app_module.app
        copies = [app.send_task(f"{APP}.work", ("o", 0.3), queue=worker.queue) for _ in range(3)]
        for result in copies:
            assert result.get(timeout=60) == "o"
        records = [r for r in runs(cluster_env) if r["item"] == "o"]
        assert len(records) == 3
        assert_no_overlap(records)  # excluded at execution, fences increasing
        # A rate on the cluster: deferred runs on slots 1/20 s apart, none early.
        rated = [
            cluster_env.app_module.rated.apply_async(("c", n), queue=worker.queue) for n in range(6)
        ]
        assert [r.get(timeout=30) for r in rated] == list(range(6))
        check_rate(rated_runs(cluster_env), 20, 1.0)
        client = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        # Fence keys are bookkeeping that expires with the lease; the locks must be gone.
        wait_for(
            lambda: not [k for k in client.scan_iter("t:*") if not k.endswith(b":fence")],
            5,
            "every lock released",
        )
        client.close()
    finally:
        worker.stop()


def test_a_total_and_a_cap_on_waiting_calls_across_masters(
    cluster_env: CeleryEnv, cluster: Cluster
) -> None:
    app = cluster_env.app_module
    worker = Worker(cluster_env.env, concurrency=6, extra_env={"CSL_LOCK_URL": cluster.url})
    worker.start()
    try:
        # 12 keys on every master, one total in a slot of its own: never more than 3 at once.
        calls = [
            app.export_total.apply_async((f"ct-{n}", 0.3), queue=worker.queue) for n in range(12)
        ]
        assert sorted(c.get(timeout=60) for c in calls) == sorted(f"ct-{n}" for n in range(12))
        done = [r for r in runs(cluster_env) if str(r["item"]).startswith("ct-")]
        assert len(done) == 12
        assert concurrency(done) == 3
        # At most 5 calls of a key waiting, counted in the key's slot; the sixth is refused.
        parked = "parked-on-the-cluster"
        for n in range(5):
            app.capped.apply_async(("cp", n), queue=parked)
        with pytest.raises(BackpressureError, match="max_pending=5"):
            app.capped.apply_async(("cp", 5), queue=parked)
        cluster_env.broker.client().delete(parked)
    finally:
        worker.stop()


def test_a_cluster_node_as_plain_url_fails_dispatch_and_execution_once(
    cenv: CeleryEnv, cluster: Cluster
) -> None:
    # The worker's start check (a script on its own lock name) passes on the master that
    # holds that name, and stops a worker given any other (below).
    node = cluster.master_of(LockKeys.build("t", START_CHECK).lock)
    node_url = f"redis://127.0.0.1:{node.port}/0"
    other = next(m for m in (cluster.master_of(f"k{i}") for i in range(200)) if m is not node)
    stopped = Worker(cenv.env, extra_env={"CSL_LOCK_URL": f"redis://127.0.0.1:{other.port}/0"})
    with pytest.raises(RuntimeError, match=r"worker exited(.|\n)*redis\+cluster://"):
        stopped.start()
    stopped.stop()
    work = cenv.app_module.work
    # An item whose lock lives on another master: the plain client gets MOVED.
    item = next(
        f"x{i}"
        for i in range(200)
        if cluster.master_of(
            LockKeys.build("t", work.singleton_options().key.derive((f"x{i}",), {})).lock
        )
        is not node
    )
    worker = Worker(cenv.env, extra_env={"CSL_LOCK_URL": node_url}).start()
    broker = cenv.broker.client()
    try:
        with lock_url(cenv, node_url):
            with pytest.raises(LockStoreConfigurationError, match=r"redis\+cluster://"):
                work.apply_async((item,), queue=worker.queue)
            assert broker.llen(worker.queue) == 0  # nothing was published
        # A copy that bypasses dispatch meets the same error at execution: it fails once.
        result = cenv.app_module.app.send_task(f"{APP}.work", (item,), queue=worker.queue)
        with pytest.raises(Exception, match=r"redis\+cluster://") as failed:
            result.get(timeout=30)
        assert type(failed.value).__name__ == "LockStoreConfigurationError"
        assert runs(cenv) == []
        # A requeue or retry would be sent before the failure is stored: it is queued, or
        # in the worker (reserved, waiting for its countdown, running) until it has run.
        wait_for(
            lambda: broker.llen(worker.queue) == 0 and worker.idle(), 30, "no copy left anywhere"
        )
        log = worker.output()
        assert "requeued" not in log
        assert log.count(f"Task {APP}.work[{result.id}] raised") == 1
    finally:
        worker.stop()


# -- Sentinel -------------------------------------------------------------------------


def sentinel_group() -> Iterator[SentinelGroup]:
    """A master, a replica and three sentinels, stopped after use."""
    group = SentinelGroup(replicas=1, sentinels=3).start()
    try:
        yield group
    finally:
        group.cleanup()


@pytest.fixture(name="sentinel_group", scope="module")
def fixture_sentinel_group() -> Iterator[SentinelGroup]:
    """One Sentinel group for the module's tests that leave its master in place."""
    yield from sentinel_group()


@pytest.fixture(name="sentinels")
def fixture_sentinels(sentinel_group: SentinelGroup) -> SentinelGroup:
    """The module's group, flushed, its replica in sync again (a test may cut it off)."""
    return sentinel_group.ready()


@pytest.fixture(name="failover_sentinels")
def fixture_failover_sentinels() -> Iterator[SentinelGroup]:
    """A group of the test's own, for a test that fails its master over."""
    yield from sentinel_group()


class TestSentinel:
    def test_configured_by_a_sentinel_url_the_kombu_way(self, sentinels: SentinelGroup) -> None:
        app = app_with(
            singleton_lock_url=sentinels.url,
            singleton_lock_transport_options={"master_name": sentinels.MASTER_NAME},
        )
        lock = LockStores.for_app(app).lock
        lease = held(lock.try_acquire("s", 10))
        assert lock.release(lease) is ReleaseResult.RELEASED
        assert LockStores.for_app(app).describe().startswith("sentinel://127.0.0.1:")

    def test_rates_and_cancels_on_a_sentinel_master(self, sentinels: SentinelGroup) -> None:
        app = app_with(
            singleton_lock_url=sentinels.url,
            singleton_lock_transport_options={"master_name": sentinels.MASTER_NAME},
        )
        lock = LockStores.for_app(app).lock
        slots = [rates_of(lock).ask("sr", Rate(10, 1.0), "reserve") for _ in range(3)]
        assert [s.state for s in slots] == ["now", "reserved", "reserved"]
        assert slots[2].at - slots[0].at == pytest.approx(0.2, abs=1e-6)
        lease = held(lock.try_acquire("sc", 30))
        lease.yield_to(companion("sc", "pending"), every=0.05)
        lock.renew(lease)
        waiting = held(lock.try_acquire(companion("sc", "pending"), 30))
        wait_for(lambda: lease.cancelled, 3, "the lease cancelled")
        for each in (lease, waiting):
            assert lock.release(each) is ReleaseResult.RELEASED

    def test_found_from_a_sentinel_broker_with_its_transport_options(
        self, sentinels: SentinelGroup
    ) -> None:
        app = app_with(
            broker_url=sentinels.url,
            broker_transport_options={
                "master_name": sentinels.MASTER_NAME,
                "visibility_timeout": 60,
            },
        )
        config = SingletonConfig.from_app(app)
        assert config.url == sentinels.url
        assert config.url_source == "broker_url"
        assert config.transport_options == {"master_name": sentinels.MASTER_NAME}
        lease = held(LockStores.for_app(app).lock.try_acquire("b", 10))
        assert lease.fence > 0

    def test_a_sentinel_url_without_master_name_says_what_to_set(self) -> None:
        app = app_with(singleton_lock_url="sentinel://127.0.0.1:26379")
        with pytest.raises(ConfigurationError, match="master_name"):
            _ = LockStores.for_app(app).lock

    def test_a_replica_url_is_a_configuration_error_that_names_sentinel(
        self, sentinels: SentinelGroup
    ) -> None:
        replica = sentinels.replicas[0]
        lock = RedisLock.from_url(replica.url, prefix="ro")
        with pytest.raises(LockStoreConfigurationError, match="replica"):
            lock.try_acquire("r", 10)

    def test_renewal_follows_the_new_master_after_a_failover(
        self, failover_sentinels: SentinelGroup
    ) -> None:
        lock = RedisLock.from_url(
            failover_sentinels.url,
            master_name=failover_sentinels.MASTER_NAME,
            prefix="fo",
            socket_timeout=1,
        )
        leases = [held(lock.acquire(f"f{i}", 8, blocking=False, renew=True)) for i in range(3)]
        old = failover_sentinels.master_port()
        time.sleep(0.3)
        failover_sentinels.server_on(old).kill()
        wait_for(lambda: failover_sentinels.master_port() != old, 30, "sentinel failover")
        time.sleep(8 / 3 + 1)
        for lease in leases:
            lease.check()
            assert lock.holder(lease.name) == lease.token
            assert lock.release(lease) is ReleaseResult.RELEASED

    def test_a_write_the_replica_missed_is_reported_lost_and_the_next_fence_is_greater(
        self, failover_sentinels: SentinelGroup
    ) -> None:
        lock = RedisLock.from_url(
            failover_sentinels.url,
            master_name=failover_sentinels.MASTER_NAME,
            prefix="mw",
            socket_timeout=1,
        )
        lost = threading.Event()
        old = failover_sentinels.master_port()
        master = failover_sentinels.server_on(old)
        admin = master.client()
        # Freeze the replica and cut its link, so it can neither read the write nor
        # reconnect to fetch it; kill the master; then let the replica go on. The lease
        # now exists nowhere the failover can reach. (A running replica reconnects at
        # once otherwise; the freeze stays well under the sentinels' down-after time.)
        replica = failover_sentinels.replicas[0]
        replica.pause()
        try:
            admin.client_kill_filter(_type="replica")
            lease = held(
                lock.acquire("m", 6, blocking=False, renew=True, on_lost=lambda _: lost.set())
            )
        finally:
            master.kill()
            replica.resume()
        wait_for(lambda: failover_sentinels.master_port() != old, 30, "sentinel failover")
        assert lost.wait(10)
        with pytest.raises(LockLostError):
            lease.check()
        successor = held(lock.try_acquire("m", 6))
        assert successor.fence > lease.fence


PRODUCE_ON_SENTINEL = """
import json, sys
from tests.support import celery_app as c
tag = sys.argv[1]
first = c.work.apply_async((tag, 1.0))
second = c.work.apply_async((tag, 1.0))
copies = [c.app.send_task("tests.support.celery_app.work", (tag + "-copy", 0.3)) for _ in range(3)]
print(json.dumps({
    "same_id": first.id == second.id,
    "results": [first.get(timeout=60)] + [r.get(timeout=60) for r in copies],
    "store": c.work.singleton_context.stores.describe(),
}))
"""


def test_a_celery_worker_on_a_sentinel_broker_locks_there_and_follows_a_failover(
    cenv: CeleryEnv, failover_sentinels: SentinelGroup
) -> None:
    # Broker, backend and lock store all from one sentinel:// URL; singleton_lock_url unset.
    env = {
        **cenv.env,
        "CSL_BROKER_URL": failover_sentinels.url,
        "CSL_RESULT_URL": failover_sentinels.url,
        "CSL_LOCK_URL": "",
        "CSL_MASTER_NAME": failover_sentinels.MASTER_NAME,
    }
    worker = Worker(env).start()
    produce_env = {**os.environ, **env, "CSL_QUEUE": worker.queue}

    def produce(tag: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", PRODUCE_ON_SENTINEL, tag],
            cwd=ROOT, env=produce_env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def check(tag: str) -> None:
        outcome = produce(tag)
        assert outcome["same_id"]  # deduplicated at dispatch through the sentinel's master
        assert outcome["results"] == [tag] + [f"{tag}-copy"] * 3
        assert outcome["store"].startswith("sentinel://127.0.0.1:")
        assert len([r for r in runs(cenv) if r["item"] == tag]) == 1
        copies = [r for r in runs(cenv) if r["item"] == f"{tag}-copy"]
        assert len(copies) == 3
        assert_no_overlap(copies)  # excluded at execution: fences increase

    try:
        check("before")
        old = failover_sentinels.master_port()
        failover_sentinels.server_on(old).kill()
        wait_for(lambda: failover_sentinels.master_port() != old, 30, "sentinel failover")
        check("after")  # broker, backend and lock store all follow the new master
        master = failover_sentinels.server_on(failover_sentinels.master_port()).client()
        # The broker's lists share this database: its in-transit bookkeeping (the queues'
        # push numbers) is not a lock.
        wait_for(
            lambda: not [
                k for k in master.scan_iter("t:*")
                if not k.endswith(b":fence") and not k.startswith(b"t:transit")
            ],
            5,
            "every lock released",
        )  # fmt: skip
    finally:
        worker.stop()


class TestReplicaAcknowledgement:
    def test_with_replicas_1_a_write_no_replica_saw_is_never_a_lease(
        self, sentinels: SentinelGroup
    ) -> None:
        app = app_with(
            singleton_lock_url=sentinels.url,
            singleton_lock_transport_options={"master_name": sentinels.MASTER_NAME},
            singleton_lock_replicas=1,
            singleton_lock_replica_timeout=0.2,
        )
        lock = LockStores.for_app(app).lock
        assert isinstance(lock, RedisLock)
        ok = held(lock.try_acquire("acked", 10))  # the replica acknowledged it
        assert lock.extend(ok) is not None
        lock.release(ok)
        # The replica cut off, as in the missed-write test: the acquire is given back.
        master = sentinels.server_on(sentinels.master_port())
        replica = sentinels.replicas[0]
        replica.pause()
        try:
            master.client().client_kill_filter(_type="replica")
            refused = lock.try_acquire("unacked", 10)
            assert isinstance(refused, Contended)
            assert master.client().exists(lock.keys("unacked").lock) == 0  # given back
        finally:
            replica.resume()
        wait_for(lambda: isinstance(lock.try_acquire("later", 10), Lease), 10, "replica back")

    def test_a_renewal_too_few_replicas_acknowledged_is_a_failed_renewal(
        self, sentinels: SentinelGroup
    ) -> None:
        lock = RedisLock.from_url(
            sentinels.url, master_name=sentinels.MASTER_NAME, prefix="ra", socket_timeout=2
        )
        strict = RedisLock(lock.client, prefix="ra", replicas=1, replica_timeout=0.2)
        lease = held(strict.try_acquire("r", 10))
        replica = sentinels.replicas[0]
        replica.pause()
        try:
            sentinels.server_on(sentinels.master_port()).client().client_kill_filter(
                _type="replica"
            )
            before = lease.expires_at
            with pytest.raises(LockStoreUnavailableError, match="0 of 1 replicas"):
                strict.extend(lease)
            assert lease.expires_at == before  # not counted as renewed
        finally:
            replica.resume()

    def test_replicas_on_a_cluster_client_is_refused(self, cluster: Cluster) -> None:
        client = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        with pytest.raises(ConfigurationError, match="cluster"):
            RedisLock(client, replicas=1)
        client.close()


class TestClientKinds:
    def test_the_asyncio_lock_takes_the_asyncio_cluster_client(self, cluster: Cluster) -> None:
        async def scenario() -> tuple[int, int]:
            lock = AsyncRedisLock.from_url(cluster.url, prefix="aio")
            assert repr(lock).startswith("AsyncRedisLock(redis+cluster://127.0.0.1:")
            first = await lock.acquire("a", 1.0, blocking=False, renew=True)
            await asyncio.sleep(2.0)  # renewed past twice its ttl, on the cluster
            first.check()
            assert await lock.holder("a") == first.token
            assert await lock.release(first) is ReleaseResult.RELEASED
            second = await lock.acquire("a", 5, blocking=False)
            await lock.release(second)
            await lock.client.aclose()
            return first.fence, second.fence

        first, second = asyncio.run(scenario())
        assert second > first

    def test_a_blocking_wait_longer_than_the_cluster_clients_socket_timeout_is_refused(
        self, cluster: Cluster
    ) -> None:
        lock = RedisLock.from_url(cluster.url, prefix="st", socket_timeout=1)
        with pytest.raises(ConfigurationError, match="socket_timeout=1s"):
            lock.acquire("w", 5, timeout=10)

    def test_repr_and_errors_of_a_sentinel_client_show_no_password(self) -> None:
        lock = RedisLock.from_url(
            "sentinel://:hunter2@127.0.0.1:1;sentinel://127.0.0.1:2",
            master_name="m",
            socket_timeout=0.2,
            socket_connect_timeout=0.2,
        )
        shown = "sentinel://***@127.0.0.1:1;127.0.0.1:2/0 (master 'm')"
        assert repr(lock) == f"RedisLock({shown}, prefix='singleton_lock')"
        with pytest.raises(LockStoreUnavailableError) as failed:
            lock.try_acquire("x", 5)
        assert "hunter2" not in str(failed.value)


def backlog_key(lock: RedisLock, name: str) -> str:
    return lock.keys(name).backlog
