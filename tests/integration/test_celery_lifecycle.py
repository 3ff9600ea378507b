"""Every way a singleton task can end, in real prefork workers against real Redis servers."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import uuid

import pytest
from celery import chain, group

from celery_singleton_lock import DuplicateTaskError
from celery_singleton_lock.tokens import LEASE_HEADER

from ..conftest import CeleryEnv
from ..support.runs import (
    UNTIL_OPENED,
    assert_no_overlap,
    lock_keys,
    open_gate,
    runs,
    started,
    wait_for,
    waiting_for_a_wake_up,
)
from ..support.workers import Worker

APP = "tests.support.celery_app"  # the test app's module: its tasks' name prefix

pytestmark = pytest.mark.slow


class TestEnds:
    def test_success_releases_right_away(self, cenv: CeleryEnv, worker: Worker) -> None:
        work = cenv.app_module.work
        result = work.apply_async(("a",), queue=worker.queue)
        assert result.get(timeout=20) == "a"
        wait_for(lambda: not lock_keys(cenv), 2, "release")
        [run] = runs(cenv)
        assert run["fence"] > 0

    def test_a_lease_handed_in_a_producers_headers_is_not_taken(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        """Only the worker's main process hands a run its lease: one a message carries
        (forged, or copied by hand) is dropped before the run sees the request."""
        work = cenv.app_module.work
        task_id = str(uuid.uuid4())
        name = work.singleton_options().key.derive(("forged",), {})
        forged = {
            "name": name, "key": "t:{" + name + "}", "token": f"x|forged|1|n|{task_id}",
            "fence": 7, "ttl": 10.0, "expires_at": time.monotonic() + 3600,
        }  # fmt: skip
        result = work.apply_async(
            ("forged",), queue=worker.queue, task_id=task_id, headers={LEASE_HEADER: forged}
        )
        assert result.get(timeout=20) == "forged"
        [run] = runs(cenv)
        assert run["fence"] > 10**12  # the worker's own fenced take, not the forged 7
        wait_for(lambda: not lock_keys(cenv), 2, "release")

    @pytest.mark.parametrize("mode", ["fail", "ignore", "reject"])
    def test_failure_ignore_and_reject_release(
        self, cenv: CeleryEnv, worker: Worker, mode: str
    ) -> None:
        work = cenv.app_module.work
        result = work.apply_async(("b",), {"mode": mode}, queue=worker.queue)
        wait_for(lambda: runs(cenv), what="execution")
        wait_for(lambda: not lock_keys(cenv), 2, "release")
        if mode == "fail":
            with pytest.raises(ValueError, match="failing on purpose"):
                result.get(timeout=10)
        # The key is free: the same call is accepted and runs again.
        again = work.apply_async(("b",), queue=worker.queue)
        assert again.id != result.id
        assert again.get(timeout=20) == "b"


class TestDispatch:
    def test_duplicate_while_queued_or_running_returns_the_holders_result(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work = cenv.app_module.work
        first = work.apply_async(("c", 1.0), queue=worker.queue)
        second = work.apply_async(("c", 1.0), queue=worker.queue)
        third = work.apply_async(("c",), {"seconds": 1.0}, queue=worker.queue)
        assert second.id == first.id == third.id
        assert first.get(timeout=20) == "c"
        assert len(runs(cenv)) == 1

    def test_on_duplicate_raise_names_the_holder(self, cenv: CeleryEnv, worker: Worker) -> None:
        work = cenv.app_module.work
        first = work.apply_async(("d", 1.0), queue=worker.queue)
        original = work.singleton_options()
        try:
            type(work)._singleton_options = dataclasses.replace(original, on_duplicate="raise")
            with pytest.raises(DuplicateTaskError) as caught:
                work.apply_async(("d", 1.0), queue=worker.queue)
        finally:
            type(work)._singleton_options = original
        assert caught.value.task_id == first.id
        assert first.id in str(caught.value)
        first.get(timeout=20)

    def test_tasks_sharing_a_format_key_exclude_each_other(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        process, callback = cenv.app_module.process_request, cenv.app_module.callback_request
        first = process.apply_async((7, 1.0), queue=worker.queue)
        refused = callback.apply_async((7,), queue=worker.queue)
        assert refused.id == first.id
        first.get(timeout=20)
        assert callback.apply_async((7,), queue=worker.queue).get(timeout=20) == 7


class TestRetry:
    def test_retry_is_sent_and_keeps_the_key_between_attempts(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work = cenv.app_module.work
        result = work.apply_async(("e",), {"mode": "retry"}, queue=worker.queue)
        wait_for(lambda: runs(cenv), what="first attempt")
        # Between the attempts (the retry waits 1 s) the key is still taken.
        duplicate = work.apply_async(("e",), {"mode": "retry"}, queue=worker.queue)
        assert duplicate.id == result.id
        assert result.get(timeout=20) == "e"
        attempts = runs(cenv)
        assert [a["retries"] for a in attempts] == [0, 1]
        assert {a["id"] for a in attempts} == {result.id}
        assert_no_overlap(attempts)
        wait_for(lambda: not lock_keys(cenv), 2, "release")

    def test_autoretry_for_is_sent_and_keeps_the_key(self, cenv: CeleryEnv, worker: Worker) -> None:
        flaky = cenv.app_module.flaky
        result = flaky.apply_async(("f",), queue=worker.queue)
        wait_for(lambda: runs(cenv), what="first attempt")
        assert flaky.apply_async(("f",), queue=worker.queue).id == result.id
        assert result.get(timeout=20) == "f"
        assert [a["retries"] for a in runs(cenv)] == [0, 1]
        wait_for(lambda: not lock_keys(cenv), 2, "release")


class TestTimeLimits:
    def test_soft_time_limit_releases_after_the_handler(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        limited = cenv.app_module.limited
        result = limited.apply_async(("g", 0.8), {"mode": "soft"}, queue=worker.queue)
        assert result.get(timeout=20) == "soft-handled"
        wait_for(lambda: not lock_keys(cenv), 2, "release")

    def test_hard_time_limit_is_released_by_the_main_process(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        limited = cenv.app_module.limited
        result = limited.apply_async(("h", 30), queue=worker.queue)
        wait_for(lambda: started(cenv), what="start")
        wait_for(lambda: result.state == "FAILURE", 20, "hard time limit")
        failed_at = time.monotonic()
        wait_for(lambda: not lock_keys(cenv), 1.0, "release within 1 s")
        print(f"\nhard time limit: released {time.monotonic() - failed_at:.3f}s after FAILURE")


class TestRevoke:
    def test_revoke_of_a_queued_task_releases(self, cenv: CeleryEnv, worker: Worker) -> None:
        work = cenv.app_module.work
        result = work.apply_async(("i",), countdown=2, queue=worker.queue)
        assert lock_keys(cenv)
        result.revoke()
        wait_for(lambda: not lock_keys(cenv), 10, "release of the revoked task's hold")
        assert runs(cenv) == []

    def test_a_revoked_message_still_in_the_broker_frees_its_key_when_a_worker_takes_it(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work, app = cenv.app_module.work, cenv.app_module.app
        queue = f"q-later-{time.monotonic_ns()}"
        result = work.apply_async(("in-broker",), queue=queue)  # nobody consumes it yet
        result.revoke()
        # Until a worker takes it off the queue, a duplicate is told of the revoked task
        # (documented: its AsyncResult ends REVOKED).
        assert work.apply_async(("in-broker",), queue=queue).id == result.id
        app.control.add_consumer(queue, destination=[worker.nodename], reply=True)
        try:
            # The worker discards the revoked message as it receives it, and frees the key.
            wait_for(lambda: not lock_keys(cenv), 10, "release when the worker takes it")
            wait_for(lambda: result.state == "REVOKED", 10, "the revoked state")
            again = work.apply_async(("in-broker",), queue=queue)
            assert again.id != result.id
            assert again.get(timeout=20) == "in-broker"
        finally:
            app.control.cancel_consumer(queue, destination=[worker.nodename], reply=True)

    def test_revoke_terminate_of_a_running_task_releases(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work = cenv.app_module.work
        result = work.apply_async(("j", 30), queue=worker.queue)
        wait_for(lambda: started(cenv), what="start")
        result.revoke(terminate=True, signal="SIGKILL")
        wait_for(lambda: not lock_keys(cenv), 5, "release after terminate")
        wait_for(lambda: result.state == "REVOKED", 10, "revoked state")


class TestChildDeath:
    def test_killed_child_is_released_by_the_main_process_within_a_second(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        durable = cenv.app_module.durable
        result = durable.apply_async(("k", 3), queue=worker.queue)
        [first] = wait_for(lambda: started(cenv), what="start")
        os.kill(first["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        # acks_late + reject_on_worker_lost: the message comes back and runs once.
        assert result.get(timeout=30) == "k"
        [run] = runs(cenv)
        assert run["pid"] != first["pid"]
        print(
            f"\nchild SIGKILL: redelivered run finished {time.monotonic() - killed_at:.2f}s later"
        )
        wait_for(lambda: not lock_keys(cenv), 2, "release")

    def test_killed_child_lease_is_freed_within_a_second(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work = cenv.app_module.work
        work.apply_async(("k2", 30), queue=worker.queue)
        [first] = wait_for(lambda: started(cenv), what="start")
        os.kill(first["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: not lock_keys(cenv), 1.0, "release within 1 s")
        print(f"\nchild SIGKILL: released {time.monotonic() - killed_at:.3f}s later")
        assert work.apply_async(("k2",), queue=worker.queue).get(timeout=20) == "k2"


class TestCanvas:
    def test_duplicates_inside_a_chain_all_run_one_at_a_time(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work = cenv.app_module.work
        sig = work.si("m", 0.2).set(queue=worker.queue)
        result = chain(sig, sig.clone(), sig.clone()).apply_async()
        assert result.get(timeout=30) == "m"
        records = runs(cenv)
        assert len(records) == 3
        assert_no_overlap(records)

    def test_duplicates_inside_a_group_run_once_and_each_answers(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        """The first member holds the key, the others attach to it and end with its
        result (``test_attach.py``)."""
        work = cenv.app_module.work
        sig = work.si("n", 0.2).set(queue=worker.queue)
        result = group(sig.clone() for _ in range(3)).apply_async()
        assert result.get(timeout=60) == ["n", "n", "n"]
        assert len(runs(cenv)) == 1


class TestBypass:
    def test_send_task_duplicates_never_overlap_and_all_run(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        app = cenv.app_module.app
        results = [app.send_task(f"{APP}.work", ("o", 0.3), queue=worker.queue) for _ in range(3)]
        for result in results:
            assert result.get(timeout=60) == "o"
        records = runs(cenv)
        assert len(records) == 3
        assert_no_overlap(records)

    def test_on_contention_fail_ends_the_duplicate_naming_the_holder(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        strict = cenv.app_module.strict
        first = strict.apply_async(("p", UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: started(cenv), what="first start")
        second = strict.apply_async(("p",), queue=worker.queue)
        with pytest.raises(DuplicateTaskError) as caught:
            second.get(timeout=20)
        open_gate(cenv, "p")
        assert first.id in str(caught.value)
        assert first.get(timeout=20) == "p"

        # One greppable INFO line says why; the failure is expected, not an ERROR. Celery
        # logs a failure after it stores it: wait for the line, not for the state.
        def expected_failure_logged() -> bool:
            return any(
                second.id in line and "raised expected: DuplicateTaskError" in line
                for line in worker.output().splitlines()
            )

        wait_for(expected_failure_logged, what="the expected failure logged")
        log = worker.output()
        lock = strict.singleton_options().key.derive(("p",), {})
        assert (
            f"contended at execution: task={APP}.strict id={second.id} lock={lock} "
            f"holder={first.id} state=running then=fail" in log
        )
        mine = [line for line in log.splitlines() if second.id in line]
        assert any("raised expected: DuplicateTaskError" in line for line in mine), mine
        assert not any("ERROR" in line for line in mine), mine

    def test_requeue_is_bounded_then_fails(self, cenv: CeleryEnv, worker: Worker) -> None:
        impatient = cenv.app_module.impatient
        holder = impatient.apply_async(("r", UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: started(cenv), what="holder start")
        contender = impatient.apply_async(("r",), queue=worker.queue)
        with pytest.raises(DuplicateTaskError, match="gave up after 2 requeues"):
            contender.get(timeout=20)
        open_gate(cenv, "r")
        assert holder.get(timeout=20) == "r"
        assert len(runs(cenv)) == 1

    def test_on_contention_wait_runs_right_after_the_holder(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        patient = cenv.app_module.patient
        first = patient.apply_async(("q", UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: started(cenv), what="first start")
        second = patient.apply_async(("q",), queue=worker.queue)
        wait_for(lambda: waiting_for_a_wake_up(cenv), 10, "the second parked")
        open_gate(cenv, "q")
        assert second.get(timeout=20) == "q"
        a, b = sorted(runs(cenv), key=lambda r: r["start"])
        assert a["id"] == first.id
        handoff = b["start"] - a["end"]
        print(f"\nwait hand-off: next start {handoff * 1000:.1f} ms after the release")
        assert 0 <= handoff < 1.0
