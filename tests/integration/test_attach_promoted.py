"""Calls attached to a holder that ended without an outcome (its worker or pool child
killed, its message revoked): one is promoted and runs as a call of its own, the others
attach to it and are answered with its outcome; each body runs once (real workers)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from celery import chain

from celery_singleton_lock.lease.outcomes import text
from celery_singleton_lock.tokens import holder_task_id

from ..conftest import CeleryEnv
from ..support.runs import UNTIL_OPENED, open_gate, started, wait_for
from ..support.workers import Worker
from .test_attach import attached, bodies, follows, running


@pytest.fixture(name="pair")
def fixture_pair(cenv: CeleryEnv) -> Iterator[tuple[Worker, Worker]]:
    first = Worker(cenv.env).start()
    second = Worker(cenv.env).start()
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


class TestHolderKilled:
    def test_a_holder_whose_child_is_killed_leaves_its_calls_to_run(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        """The holder's pool child SIGKILLed: the main process frees the key, and the
        attached step runs its own body once, its chain going on."""
        if worker.pool != "prefork":
            pytest.skip("a pool child of its own to kill: prefork's")
        work, follow = cenv.app_module.work, cenv.app_module.follow
        q = worker.queue
        work.apply_async(("k2", UNTIL_OPENED), queue=q)
        running(cenv, "k2")
        [first] = [s for s in started(cenv) if s["item"] == "k2"]
        after = chain(work.si("k2").set(queue=q), follow.s(1).set(queue=q)).apply_async()
        assert len(attached(cenv, "k2")) == 1
        os.kill(first["pid"], signal.SIGKILL)
        assert after.get(timeout=30) == ["k2", 1]
        assert [run["id"] for run in bodies(cenv, "k2")] == [after.parent.id]
        assert follows(cenv) == [[1, "k2"]]

    def test_calls_attached_to_a_revoked_holder_run_as_calls_of_their_own(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        """A queued holder revoked before it runs (its message dropped as it arrives)."""
        if worker.pool != "prefork":
            # The thread pool takes a message while its threads are busy: a revoke then
            # comes too late, the holder runs, and its call is answered (as it should).
            pytest.skip("a message waiting for a free pool child: prefork's")
        work, follow = cenv.app_module.work, cenv.app_module.follow
        q = worker.queue
        blocker = work.apply_async(("k3-blocker", UNTIL_OPENED), queue=q)
        other = work.apply_async(("k3-other", UNTIL_OPENED), queue=q)
        running(cenv, "k3-blocker")
        running(cenv, "k3-other")  # both children busy: the holder waits, queued
        holder = work.apply_async(("k3",), queue=q)
        after = chain(work.si("k3").set(queue=q), follow.s(1).set(queue=q)).apply_async()
        assert len(attached(cenv, "k3")) == 1
        # Waited for: the worker knows of the revoke before its children are free.
        replies = cenv.app_module.app.control.revoke(
            holder.id, destination=[worker.nodename], reply=True, timeout=10
        )
        assert replies, "the worker did not answer the revoke"
        open_gate(cenv, "k3-blocker")
        open_gate(cenv, "k3-other")
        assert (blocker.get(timeout=20), other.get(timeout=20)) == ("k3-blocker", "k3-other")
        assert after.get(timeout=30) == ["k3", 1]
        assert [run["id"] for run in bodies(cenv, "k3")] == [after.parent.id]

    def test_calls_attached_to_a_killed_holder_run_as_calls_of_their_own(
        self, cenv: CeleryEnv, pair: tuple[Worker, Worker]
    ) -> None:
        """The holder's whole worker SIGKILLed while it runs: its lease runs out, another
        worker's sweep promotes one attached call (it runs its own body, holding the key)
        and the other attaches to it; each chain goes on once."""
        doomed, alive = pair
        work, follow = cenv.app_module.work, cenv.app_module.follow
        work.apply_async(("k1", UNTIL_OPENED), queue=doomed.queue)
        running(cenv, "k1")
        q = alive.queue
        chains = [
            chain(work.si("k1").set(queue=q), follow.s(tag).set(queue=q)).apply_async()
            for tag in (1, 2)
        ]
        assert len(attached(cenv, "k1")) == 2
        os.killpg(doomed.pid, signal.SIGKILL)
        assert [c.get(timeout=60) for c in chains] == [["k1", 1], ["k1", 2]]
        [ran] = [run["id"] for run in bodies(cenv, "k1")]  # the promoted call's body, once
        assert ran in {c.parent.id for c in chains}
        assert sorted(follows(cenv)) == [[1, "k1"], [2, "k1"]]
        wait_for(lambda: not attached(cenv, "k1"), 5, "attached calls forgotten")

    def test_a_call_attached_anew_waits_for_the_promoted_calls_outcome(
        self, cenv: CeleryEnv
    ) -> None:
        """The promoted call's run frees its key before its result is stored (its chain's
        next step is sent between): the other call, attached to it at the promotion,
        waits for that outcome as long as for any holder's (``GRACE``), not from when
        the killed holder was first found gone. The gap held open by a gate while two
        sweeps look: it is answered, and the body runs once."""
        doomed = Worker(cenv.env).start()
        alive = Worker(cenv.env, extra_env={"CSL_GATED_FOLLOW": "1"}).start()
        try:
            work, follow = cenv.app_module.work, cenv.app_module.follow
            work.apply_async(("k5", UNTIL_OPENED), queue=doomed.queue)
            running(cenv, "k5")
            q = alive.queue
            tags = [f"{cenv.app_module.GATED}-{n}" for n in (1, 2)]
            chains = [
                chain(work.si("k5").set(queue=q), follow.s(tag).set(queue=q)).apply_async()
                for tag in tags
            ]
            assert len(attached(cenv, "k5")) == 2
            os.killpg(doomed.pid, signal.SIGKILL)
            [promoted] = wait_for(lambda: bodies(cenv, "k5"), 60, "the promoted call's body")
            lock = cenv.lock_client()
            name = cenv.app_module.work.singleton_options().key.derive(("k5",), {})
            wait_for(
                lambda: holder_task_id(text(lock.get(f"t:{{{name}}}") or b"")) != promoted["id"],
                10,
                "the promoted call's key freed",
            )
            # Its result not stored (its chain's step waits at the gate) while two sweeps
            # list the lock's calls: the first after the key was freed, and its decision.
            looked = listings(cenv)
            wait_for(lambda: listings(cenv) >= looked + 2, 10, "two sweeps")
            for tag in tags:
                open_gate(cenv, tag)
            assert [c.get(timeout=30) for c in chains] == [["k5", tag] for tag in tags]
            assert [run["id"] for run in bodies(cenv, "k5")] == [promoted["id"]]
            assert sorted(follows(cenv)) == sorted([tag, "k5"] for tag in tags)
            wait_for(lambda: not attached(cenv, "k5"), 5, "attached calls forgotten")
        finally:
            doomed.stop()
            alive.stop()


def listings(cenv: CeleryEnv) -> int:
    """The lock store's HGETALLs so far: a sweep lists each lock's attached calls so."""
    stats = cenv.lock_client().info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))
