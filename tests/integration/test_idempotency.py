"""Idempotency keys in real workers: a repeated request never does the work twice and gets
the first call's answer; other arguments under the same key are refused before publishing."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery
from celery.beat import ScheduleEntry, Scheduler

from celery_singleton_lock import (
    ConfigurationError,
    IdempotencyConflictError,
    IdempotencyResultMissingError,
    LockStoreUnavailableError,
    signals,
    singleton_task,
)
from celery_singleton_lock.lease.idempotency import idempotency_keys_of

from ..conftest import CeleryEnv
from ..support.cli import cli
from ..support.docs_runner import definition
from ..support.modes import of
from ..support.runs import UNTIL_OPENED, open_gate, requeued, runs, started, wait_for
from ..support.workers import ROOT, Worker


def _key() -> str:
    return f"idem-{uuid.uuid4()}"


def _record(task: Any, key: str) -> Any:
    return idempotency_keys_of(task.singleton_context.store).read(key)


def _unacked_since(broker: Any) -> float:
    """When the newest message a worker holds unacked was delivered (kombu's index)."""
    newest = broker.zrange("unacked_index", -1, -1, withscores=True)
    return float(newest[0][1]) if newest else float("inf")


def _queued(cenv: CeleryEnv, queue: str) -> int:
    return int(cenv.broker.client().llen(queue))


class TestRepeats:
    def test_two_producers_racing_one_key_share_the_first_call(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        charge = cenv.app_module.charge
        key, ids, barrier = _key(), [], threading.Barrier(2)

        def produce() -> None:
            barrier.wait()
            for _ in range(20):
                sent = charge.apply_async(("race",), idempotency_key=key, queue=worker.queue)
                ids.append(sent.id)

        threads = [threading.Thread(target=produce) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(ids) == 40
        assert len(set(ids)) == 1
        assert charge.AsyncResult(ids[0]).get(timeout=20) == "race"
        assert len(of(runs(cenv), "race")) == 1

    def test_a_repeat_while_queued_while_running_and_after_success_gets_the_first(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        charge = cenv.app_module.charge
        key = _key()
        headers = {"Idempotency-Key": key}
        # Queued: on a queue no worker reads, so it stays there.
        parked = charge.apply_async(("parked",), headers=headers, queue="nobody-reads-this")
        again = charge.apply_async(("parked",), headers=headers, queue="nobody-reads-this")
        assert again.id == parked.id
        assert _queued(cenv, "nobody-reads-this") == 1
        assert _record(charge, key).state == "accepted"

        key = _key()
        first = charge.apply_async(("slow", UNTIL_OPENED), idempotency_key=key, queue=worker.queue)
        wait_for(lambda: any(s["id"] == first.id for s in started(cenv)), 20, "running")
        assert _record(charge, key).state == "running"
        while_running = charge.apply_async(
            ("slow", UNTIL_OPENED), idempotency_key=key, queue=worker.queue
        )
        assert while_running.id == first.id
        open_gate(cenv, "slow")
        assert first.get(timeout=20) == "slow"
        wait_for(lambda: _record(charge, key).state == "succeeded", 10, "recorded")
        after = charge.apply_async(("slow", UNTIL_OPENED), idempotency_key=key, queue=worker.queue)
        assert after.id == first.id
        assert after.get(timeout=5) == "slow"
        assert len(of(runs(cenv), "slow")) == 1

    def test_other_arguments_raise_before_anything_is_published(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        charge = cenv.app_module.charge
        key = _key()
        first = charge.apply_async(("a",), idempotency_key=key, queue="nobody-reads-this-2")
        with pytest.raises(IdempotencyConflictError) as raised:
            charge.apply_async(("b",), idempotency_key=key, queue="nobody-reads-this-2")
        assert raised.value.task_id == first.id
        assert raised.value.idempotency_key == key
        assert _queued(cenv, "nobody-reads-this-2") == 1
        # Another task under the same key is another request too.
        with pytest.raises(IdempotencyConflictError):
            cenv.app_module.charge_kept.apply_async(
                ("a",), idempotency_key=key, queue="nobody-reads-this-2"
            )
        assert _queued(cenv, "nobody-reads-this-2") == 1

    def test_the_same_call_written_another_way_is_a_repeat(self, cenv: CeleryEnv) -> None:
        # The fingerprint is of the bound arguments: by position, by name, or with a
        # default written out, charge(item, seconds=0.0, mode="ok") is one call.
        charge, key, queue = cenv.app_module.charge, _key(), "nobody-reads-this-3"
        first = charge.apply_async(("a",), idempotency_key=key, queue=queue)
        for args, kwargs in (
            ((), {"item": "a"}),
            (("a", 0.0), {}),
            (("a",), {"mode": "ok", "seconds": 0.0}),
        ):
            again = charge.apply_async(args, kwargs, idempotency_key=key, queue=queue)
            assert again.id == first.id
        for seconds in (1.0, 0):  # another value; one of another type (as a key tells them)
            with pytest.raises(IdempotencyConflictError):
                charge.apply_async(("a", seconds), idempotency_key=key, queue=queue)
        assert _queued(cenv, queue) == 1

    def test_a_failed_call_frees_its_key_so_the_retry_runs(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        charge = cenv.app_module.charge
        key = _key()
        failed = charge.apply_async(("f", 0.0, "fail"), idempotency_key=key, queue=worker.queue)
        with pytest.raises(ValueError, match="on purpose"):
            failed.get(timeout=20)
        wait_for(lambda: _record(charge, key) is None, 10, "freed")
        retried = charge.apply_async(("f", 0.0, "fail"), idempotency_key=key, queue=worker.queue)
        assert retried.id != failed.id
        with pytest.raises(ValueError, match="on purpose"):
            retried.get(timeout=20)
        assert len(of(runs(cenv), "f")) == 2

    def test_keep_failures_answers_a_repeat_with_the_failure(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        kept = cenv.app_module.charge_kept
        key = _key()
        failed = kept.apply_async(("k", 0.0, "fail"), idempotency_key=key, queue=worker.queue)
        with pytest.raises(ValueError, match="on purpose"):
            failed.get(timeout=20)
        wait_for(lambda: _record(kept, key).state == "failed", 10, "kept")
        repeat = kept.apply_async(("k", 0.0, "fail"), idempotency_key=key, queue=worker.queue)
        assert repeat.id == failed.id
        # A copy sent around the dispatch (same key in its header) fails the same way
        # without running.
        copy = kept.apply_async(
            ("k", 0.0, "fail"),
            headers={"singleton_lock_idempotency_key": key},
            queue=worker.queue,
        )
        with pytest.raises(ValueError, match="on purpose"):
            copy.get(timeout=20)
        assert len(of(runs(cenv), "k")) == 1

    def test_a_retried_call_keeps_its_key_to_the_end(self, cenv: CeleryEnv, worker: Worker) -> None:
        charge = cenv.app_module.charge
        key = _key()
        first = charge.apply_async(("r", 0.0, "retry"), idempotency_key=key, queue=worker.queue)
        assert first.get(timeout=20) == "r"
        wait_for(lambda: _record(charge, key).state == "succeeded", 10, "recorded")
        record = _record(charge, key)
        assert (record.call, record.by) == (first.id, first.id)
        assert charge.apply_async(("r", 0.0, "retry"), idempotency_key=key).id == first.id
        assert len(of(runs(cenv), "r")) == 2  # the run that asked for a retry, and the retry

    def test_a_key_after_its_window_is_new(self, cenv: CeleryEnv, worker: Worker) -> None:
        brief = cenv.app_module.charge_brief
        request_id = _key()
        first = brief.apply_async(("w", request_id), queue=worker.queue)
        assert first.get(timeout=20) == "w"
        assert brief.apply_async(("w", request_id), queue=worker.queue).id == first.id
        wait_for(lambda: _record(brief, request_id) is None, 10, "the window's end")
        later = brief.apply_async(("w", request_id), queue=worker.queue)
        assert later.id != first.id
        assert later.get(timeout=20) == "w"
        assert len(of(runs(cenv), "w")) == 2


class TestCopies:
    def test_a_send_task_copy_after_success_ends_with_the_recorded_result(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        charge = cenv.app_module.charge
        key = _key()
        first = charge.apply_async(("c",), idempotency_key=key, queue=worker.queue)
        assert first.get(timeout=20) == "c"
        wait_for(lambda: _record(charge, key).state == "succeeded", 10, "recorded")
        copy = charge.app.send_task(
            charge.name, ("c",), headers={"Idempotency-Key": key}, queue=worker.queue
        )
        assert copy.id != first.id
        assert copy.get(timeout=20) == "c"
        assert len(of(runs(cenv), "c")) == 1

    def test_a_copy_requeued_by_the_first_run_s_lease_is_sent_again_and_answers(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        # A copy that meets the first run's lease (one sent as the caller reads the result
        # can: the run lets go once its end is written) is requeued. That requeue is the
        # copy's own message sent again, never a repeat answered at dispatch, which sent
        # nothing and left the copy's id without a result.
        charge = cenv.app_module.charge
        key, item = _key(), "requeued-copy"
        first = charge.apply_async((item, UNTIL_OPENED), idempotency_key=key, queue=worker.queue)
        wait_for(lambda: any(s["item"] == item for s in started(cenv)), 20, "first started")
        copy = charge.app.send_task(
            charge.name, (item, UNTIL_OPENED), headers={"Idempotency-Key": key}, queue=worker.queue
        )
        wait_for(lambda: requeued(worker.output(), copy.id), 20, "the copy requeued")
        open_gate(cenv, item)
        assert first.get(timeout=20) == item
        assert copy.get(timeout=20) == item
        assert len(of(runs(cenv), item)) == 1

    def test_a_copy_after_the_first_result_expired_says_so_without_running(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        charge = cenv.app_module.charge
        key = _key()
        first = charge.apply_async(("gone",), idempotency_key=key, queue=worker.queue)
        assert first.get(timeout=20) == "gone"
        wait_for(lambda: _record(charge, key).state == "succeeded", 10, "recorded")
        first.forget()  # as result_expires would, before the idempotency window ends
        copy = charge.app.send_task(
            charge.name, ("gone",), headers={"Idempotency-Key": key}, queue=worker.queue
        )
        with pytest.raises(IdempotencyResultMissingError, match="raise result_expires") as raised:
            copy.get(timeout=20)
        assert first.id in str(raised.value)  # (the result backend keeps the message)
        assert len(of(runs(cenv), "gone")) == 1, "the copy did not run the work again"

    def test_a_beat_entry_sent_twice_with_its_key_runs_once(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        """celery beat sends an entry through the task's apply_async with the entry's
        options: a key in its headers makes a doubled tick (two beats, a restart) one call."""
        charge = cenv.app_module.charge
        key = _key()
        entry = ScheduleEntry(
            name="nightly-charge",
            task=charge.name,
            args=("beat",),
            options={"queue": worker.queue, "headers": {"Idempotency-Key": key}},
            app=charge.app,
        )
        beat = Scheduler(charge.app, lazy=True)
        first = beat.apply_async(entry, advance=False)
        again = beat.apply_async(entry, advance=False)
        assert again.id == first.id
        assert first.get(timeout=20) == "beat"
        assert len(of(runs(cenv), "beat")) == 1

    def test_a_copy_with_other_arguments_fails_without_running(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        charge = cenv.app_module.charge
        key = _key()
        assert charge.apply_async(("x",), idempotency_key=key, queue=worker.queue).get(20) == "x"
        copy = charge.app.send_task(
            charge.name, ("y",), headers={"Idempotency-Key": key}, queue=worker.queue
        )
        with pytest.raises(IdempotencyConflictError):
            copy.get(timeout=20)
        assert of(runs(cenv), "y") == []

    def test_an_acks_late_redelivery_after_success_does_not_run_again(
        self, cenv: CeleryEnv
    ) -> None:
        durable = cenv.app_module.charge_durable
        key, queue = _key(), "idem-redelivery"
        # A short lease: the redelivery contends with the dead worker's lease until it
        # runs out (its requeues back off meanwhile), then ends without running.
        env = {"CSL_VISIBILITY_TIMEOUT": "2", "CSL_TTL": "3"}
        # The whole worker dies once the success is stored, before the ack; the message
        # comes back to the next worker, which ends with that result without running.
        doomed = Worker(cenv.env, extra_env=env, queue=queue).start()
        survivor: Worker | None = None
        try:
            first = durable.apply_async(("d",), idempotency_key=key, queue=queue)
            assert first.get(timeout=30) == "d"
            wait_for(lambda: cenv.checker_client().get(f"killed:{first.id}"), 10, "the kill")
            # Past the visibility timeout before the next worker starts: it puts the
            # message back as it starts (kombu before 5.4 otherwise only every ~10 s).
            broker = cenv.broker.client()
            wait_for(lambda: _unacked_since(broker) < time.time() - 2.0, 10, "visibility")
            survivor = Worker(cenv.env, extra_env=env, queue=queue).start()
            wait_for(lambda: f"[{first.id}] received" in survivor.output(), 20, "redelivery")
            wait_for(lambda: _record(durable, key).state == "succeeded", 20, "its end")
        finally:
            doomed.stop()
            if survivor is not None:
                survivor.stop()
        assert durable.AsyncResult(first.id).get(timeout=5) == "d"
        assert len(of(runs(cenv), "d")) == 1

    def test_a_run_whose_end_was_not_written_still_answers_a_copy(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        # Celery saw the success before the worker was lost and did not deliver again:
        # the record still says running. A copy finds the stored success and answers.
        charge = cenv.app_module.charge
        key = _key()
        first = charge.apply_async(("e",), idempotency_key=key, queue=worker.queue)
        assert first.get(timeout=20) == "e"
        wait_for(lambda: _record(charge, key).state == "succeeded", 10, "recorded")
        store = charge.singleton_context.store
        cenv.lock_client().hset(idempotency_keys_of(store).key(key), mapping={"state": "running"})
        copy = charge.app.send_task(
            charge.name, ("e",), headers={"Idempotency-Key": key}, queue=worker.queue
        )
        assert copy.get(timeout=20) == "e"
        assert len(of(runs(cenv), "e")) == 1


class TestEdges:
    def test_a_copy_woken_by_the_first_run_s_release_answers_with_its_result(
        self, cenv: CeleryEnv
    ) -> None:
        # The copy waits on the lock and wakes the moment the first run lets go. Without
        # the broker ride the release is sent as the body returns, before Celery stores
        # the result: the run keeps its lease until its outcome is written, so the copy
        # answers with it instead of running.
        unridden = Worker(cenv.env, extra_env={"CSL_RIDE": "0"}, queue="idem-unridden").start()
        try:
            task = cenv.app_module.charge_waiting
            for n in range(3):
                key, item = _key(), f"gap-{n}"
                first = task.apply_async((item, 0.5), idempotency_key=key, queue=unridden.queue)
                received = f"[{first.id}] received"
                wait_for(lambda: received in unridden.output(), 20, "received")  # noqa: B023
                copy = task.app.send_task(
                    task.name,
                    (item, 0.5),
                    headers={"singleton_lock_idempotency_key": key},
                    queue=unridden.queue,
                )
                assert first.get(timeout=20) == item
                assert copy.get(timeout=20) == item
                assert len(of(runs(cenv), item)) == 1
        finally:
            unridden.stop()

    def test_a_run_lets_its_lease_go_only_once_its_outcome_is_written(self) -> None:
        app = Celery("idem-order", set_as_current=False)
        app.conf.update(
            task_always_eager=True,
            singleton_lock_url="memory://",
            result_backend="cache+memory://",
            task_store_eager_result=True,
        )
        seen: list[str] = []

        @singleton_task(app=app, name="idem.order", key=["k"], idempotency=True)
        def task(k: str) -> str:
            return k

        def at_release(sender: object = None, **_: object) -> None:
            seen.append(_record(task, "o1").state)

        signals.lease_released.connect(at_release, weak=False)
        try:
            assert task.apply_async(("a",), idempotency_key="o1").get() == "a"
        finally:
            signals.lease_released.disconnect(at_release)
            app.close()
        assert seen == ["succeeded"]  # a copy taking the lease now answers, never runs

    def test_a_first_call_that_failed_without_writing_its_end_frees_the_key(
        self, cenv: CeleryEnv
    ) -> None:
        # A worker lost, a hard time limit or a revoke leave the record in flight while
        # the result says FAILURE or REVOKED: the next repeat is a first call again.
        charge = cenv.app_module.charge_unheld  # no lock hold to answer the repeat first
        key = _key()
        lost = charge.apply_async(("lost",), idempotency_key=key, queue="nobody-reads-this-4")
        with warnings.catch_warnings():  # Celery's backend calls redis-py's deprecated setex
            warnings.simplefilter("ignore", DeprecationWarning)
            charge.backend.mark_as_failure(lost.id, RuntimeError("worker lost"))
        again = charge.apply_async(("lost",), idempotency_key=key, queue="nobody-reads-this-4")
        assert again.id != lost.id
        assert _record(charge, key).call == again.id

    def test_a_claim_sent_twice_by_one_call_is_still_its_own(self, cenv: CeleryEnv) -> None:
        keys = idempotency_keys_of(cenv.app_module.charge.singleton_context.store)
        key = _key()
        assert keys.claim(key, "call-1", "fp", 60_000, "t").first
        assert keys.claim(key, "call-1", "fp", 60_000, "t").first  # its reply was lost
        assert not keys.claim(key, "call-2", "fp", 60_000, "t").first
        assert keys.begin(key, "call-1", "fp", 60_000, "t").first
        assert not keys.end(key, "call-1", "unsent")  # a run began: the dispatch keeps out
        assert keys.end(key, "call-1", "succeeded")
        assert _record(cenv.app_module.charge, key).state == "succeeded"

    def test_a_copy_for_a_mode_that_refuses_keys_fails_saying_so(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        debounced = cenv.app_module.debounced
        copy = debounced.app.send_task(
            debounced.name,
            ("refused", "v1"),
            headers={"singleton_lock_idempotency_key": _key()},
            queue=worker.queue,
        )
        with pytest.raises(ConfigurationError, match="debounce"):
            copy.get(timeout=20)


class TestModes:
    def test_modes_where_a_newer_call_wins_refuse_keys(self) -> None:
        app = Celery("idem-modes", set_as_current=False)
        app.conf.update(task_always_eager=True, singleton_lock_url="memory://")
        with pytest.raises(ConfigurationError, match="replace"):

            @singleton_task(app=app, name="idem.replace", on_duplicate="replace", idempotency=True)
            def replaced(k: str) -> str:
                return k

        @singleton_task(app=app, name="idem.debounce", debounce=1)
        def debounced(k: str) -> str:
            return k

        with pytest.raises(ConfigurationError, match="debounce"):
            debounced.apply_async(("a",), idempotency_key="k1")
        with pytest.raises(ConfigurationError, match="on_duplicate='cancel'"):
            singleton_task(app=app, name="idem.cancel", on_duplicate="cancel", idempotency=True)(
                lambda k: k
            )
        with pytest.raises(ConfigurationError, match="limit=3: a copy of a call could run"):
            singleton_task(app=app, name="idem.limit", limit=3, idempotency=True)(lambda k: k)

    def test_a_redlock_refuses_keys_at_the_first_keyed_call_saying_why(self) -> None:
        app = Celery("idem-redlock", set_as_current=False)
        app.conf.update(
            task_always_eager=True,
            singleton_lock_url="redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        )

        @singleton_task(app=app, name="idem.redlock")
        def keyed(k: str) -> str:
            return k

        with pytest.raises(ConfigurationError, match="Redlock of several masters"):
            keyed.apply_async(("a",), idempotency_key="k1")

    def test_eager_calls_with_a_key_run_once(self) -> None:
        app = Celery("idem-eager", set_as_current=False)
        app.conf.update(task_always_eager=True, singleton_lock_url="memory://")
        calls: list[str] = []

        @singleton_task(app=app, name="idem.eager", key=["k"])
        def once(k: str) -> str:
            calls.append(k)
            return k

        first = once.apply_async(("a",), idempotency_key="e1")
        assert once.apply_async(("a",), idempotency_key="e1").id == first.id
        with pytest.raises(IdempotencyConflictError):
            once.apply_async(("b",), idempotency_key="e1")
        assert calls == ["a"]

    def test_the_decorator_warns_when_results_cannot_answer_repeats(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        app = Celery("idem-warn", set_as_current=False)
        app.conf.update(singleton_lock_url="memory://", result_expires=3600)

        @singleton_task(app=app, name="idem.short", idempotency=True)
        def short(k: str) -> str:
            return k

        @singleton_task(app=app, name="idem.ignored", idempotency=True, ignore_result=True)
        def ignored(k: str) -> str:
            return k

        @singleton_task(app=app, name="idem.kept", idempotency={"window": 600})
        def kept(k: str) -> str:
            return k

        app.finalize()
        said = caplog.text
        assert "idem.short: result_expires (3600s) is shorter than the idempotency window" in said
        assert "idem.ignored: ignore_result is set" in said
        assert "idem.kept" not in said

    def test_a_task_keyed_per_call_only_warns_at_its_first_keyed_call(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        app = Celery("idem-warn-call", set_as_current=False)
        app.conf.update(task_always_eager=True, singleton_lock_url="memory://", result_expires=3600)

        @singleton_task(app=app, name="idem.per_call")
        def per_call(k: str) -> str:
            return k

        app.finalize()
        assert "idem.per_call" not in caplog.text  # no keys declared: nothing to say yet
        per_call.apply_async(("a",))
        assert "idem.per_call" not in caplog.text  # a call without a key: nothing either
        per_call.apply_async(("a",), idempotency_key="k-1")
        per_call.apply_async(("b",), idempotency_key="k-2")
        said = [r.getMessage() for r in caplog.records if "idem.per_call" in r.getMessage()]
        assert len(said) == 1, said  # once per task
        assert "task_always_eager without task_store_eager_result" in said[0]

    def test_a_bad_key_says_what_to_pass(self) -> None:
        app = Celery("idem-bad", set_as_current=False)
        app.conf.update(task_always_eager=True, singleton_lock_url="memory://")

        @singleton_task(app=app, name="idem.bad")
        def task(k: str) -> str:
            return k

        with pytest.raises(ConfigurationError, match="non-empty str"):
            task.apply_async(("a",), idempotency_key="")
        with pytest.raises(ConfigurationError, match="more than 255"):
            task.apply_async(("a",), idempotency_key="x" * 300)
        with pytest.raises(ConfigurationError, match="not parameters"):

            @singleton_task(app=app, name="idem.bad2", idempotency={"key_from": "nope"})
            def task2(k: str) -> str:
                return k


class TestOperators:
    def test_list_and_show_name_each_key_its_first_call_and_state(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        charge = cenv.app_module.charge
        done_key, parked_key = _key(), _key()
        done = charge.apply_async(("op-done",), idempotency_key=done_key, queue=worker.queue)
        assert done.get(timeout=20) == "op-done"
        wait_for(lambda: _record(charge, done_key).state == "succeeded", 10, "recorded")
        parked = charge.apply_async(
            ("op-parked",), idempotency_key=parked_key, queue="nobody-reads-this-3"
        )
        listing = cli(cenv, "list", "--idempotency", "--json")
        assert listing.returncode == 0, listing.stderr
        keys = {entry["key"]: entry for entry in json.loads(listing.stdout)}
        assert keys[done_key]["state"] == "succeeded"
        assert keys[done_key]["first_call"] == keys[done_key]["run_by"] == done.id
        assert keys[parked_key]["state"] == "accepted"
        assert keys[parked_key]["first_call"] == parked.id
        assert 86000 < keys[parked_key]["expires_in"] <= 86400
        table = cli(cenv, "list", "--idempotency", "--state", "accepted")
        assert parked_key in table.stdout
        assert done_key not in table.stdout
        shown = cli(cenv, "show", done_key)
        assert shown.returncode == 0, shown.stderr
        assert f"first call: {done.id}" in shown.stdout
        assert "a repeat gets its stored result" in shown.stdout
        missing = cli(cenv, "show", "no-such-key")
        assert missing.returncode == 1
        assert "no lock nor idempotency key matches" in missing.stderr


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"lock": "until_executing"},
        {"lock": "while_executing"},
        {"throttle": 60},
        {"rate": "100/s"},
        {"reopen_on": ("failure",)},
    ],
    ids=lambda options: ",".join(options) or "default",
)
def test_every_mode_that_keeps_the_first_call_answers_repeats(options: dict[str, Any]) -> None:
    app = Celery("idem-each-mode", set_as_current=False)
    app.conf.update(
        task_always_eager=True,
        singleton_lock_url="memory://",
        result_backend="cache+memory://",
        task_store_eager_result=True,
    )
    calls: list[str] = []

    @singleton_task(app=app, shared=False, name="idem.mode", key=["k"], **options)
    def task(k: str) -> str:
        calls.append(k)
        return k.upper()

    first = task.apply_async(("a",), idempotency_key="m1")
    repeat = task.apply_async(("a",), idempotency_key="m1")
    assert repeat.id == first.id
    assert repeat.get() == "A"
    with pytest.raises(IdempotencyConflictError):
        task.apply_async(("b",), idempotency_key="m1")
    assert calls == ["a"]
    app.close()


class TestOutages:
    def test_an_unreachable_store_refuses_or_publishes_by_the_outage_policy(
        self, cenv: CeleryEnv
    ) -> None:
        dead = "redis://127.0.0.1:1/0"  # nothing listens there
        for policy in ("fail_closed", "fail_open"):
            app = Celery(f"idem-outage-{policy}", set_as_current=False)
            app.conf.update(
                broker_url=cenv.broker.url,
                singleton_lock_url=dead,
                singleton_lock_on_redis_error=policy,
                singleton_lock_ride_broker=False,
            )

            @singleton_task(app=app, name=f"idem.outage.{policy}", key=["k"])
            def task(k: str) -> str:
                return k

            queue = f"idem-outage-{policy}"
            if policy == "fail_closed":
                with pytest.raises(LockStoreUnavailableError, match="nothing was published"):
                    task.apply_async(("a",), idempotency_key="o1", queue=queue)
                assert _queued(cenv, queue) == 0
            else:
                task.apply_async(("a",), idempotency_key="o1", queue=queue)
                assert _queued(cenv, queue) == 1  # sent without the check, logged
            app.close()


class TestWebEndpoint:
    """The docs' own view and endpoint (docs/idempotency.md), taken from the page, with a
    real worker: 202 while the first call runs, the same id for a repeat, 409 for another
    body, then 200 with the result (the page itself runs them eagerly: 200 at once)."""

    @pytest.mark.parametrize("web", ["django", "fastapi"])
    def test_a_repeated_request_gets_202_with_the_same_id_then_200_with_the_result(
        self, cenv: CeleryEnv, worker: Worker, web: str
    ) -> None:
        real, item = cenv.app_module.charge, f"web-{web}-{uuid.uuid4().hex[:8]}"

        class Charge:
            """The page's ``charge(order_id, amount)``: a second's run on the test worker."""

            def apply_async(self, args: tuple[int, int], **options: Any) -> Any:
                order_id, amount = args
                call = (f"{item}-{order_id}-{amount}", 1.0)
                return real.apply_async(call, queue=worker.queue, **options)

        send = (_django if web == "django" else _fastapi)(Charge(), _key())
        first, repeat = send(300), send(300)
        assert (first[0], repeat[0]) == (202, 202)
        assert repeat[1]["task_id"] == first[1]["task_id"]
        mismatch = send(999)
        assert mismatch[0] == 409
        assert mismatch[1]["task_id"] == first[1]["task_id"]
        real.AsyncResult(first[1]["task_id"]).get(timeout=20)
        assert send(300) == (200, {"task_id": first[1]["task_id"], "result": f"{item}-8-300"})
        assert len(of(runs(cenv), f"{item}-8-300")) == 1
        assert of(runs(cenv), f"{item}-8-999") == []


Answer = tuple[int, dict[str, Any]]
PAGE = ROOT / "docs" / "idempotency.md"


def _django(charge: Any, key: str) -> Callable[[int], Answer]:
    """The page's Django view, posted to with ``key`` for order 8."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.django_project.settings")
    import django
    from django.test import RequestFactory

    django.setup()
    view, factory = definition(PAGE, "charge_view", {"charge": charge}), RequestFactory()

    def post(amount: int) -> Answer:
        request = factory.post("/charges/8", {"amount": amount}, HTTP_IDEMPOTENCY_KEY=key)
        response = view(request, order_id=8)
        return response.status_code, json.loads(response.content)

    return post


def _fastapi(charge: Any, key: str) -> Callable[[int], Answer]:
    """The page's FastAPI endpoint, mounted as the page mounts it, posted to with ``key``."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    api = FastAPI()
    api.post("/charges/{order_id}")(definition(PAGE, "charge_endpoint", {"charge": charge}))
    client = TestClient(api)

    def post(amount: int) -> Answer:
        response = client.post(f"/charges/8?amount={amount}", headers={"Idempotency-Key": key})
        return response.status_code, response.json()

    return post
