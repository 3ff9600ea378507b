"""Faults around singleton tasks: dead workers, redelivery, an unreachable lock store, bad input."""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import time
import uuid
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import (
    ConfigurationError,
    DuplicateTaskError,
    KeyDerivationError,
    Lease,
    LockStoreUnavailableError,
    singleton_task,
)
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.contrib.lock_history import entries_of
from celery_singleton_lock.tokens import OUTAGE_HEADER, OUTAGE_MAX_REQUEUES, retry_token
from celery_singleton_lock.worker.setupchecks import check_worker_setup

from ..conftest import CeleryEnv
from ..support.rates import all_delivered, rated_runs
from ..support.runs import (
    UNTIL_OPENED,
    dropped,
    lock_keys,
    open_gate,
    runs,
    started,
    wait_for,
)
from ..support.servers import RedisServer, free_port
from ..support.workers import Worker

pytestmark = pytest.mark.slow


def child_died(worker: Worker, task_id: str) -> bool:
    """Whether the worker's main process released what the dead child of ``task_id`` held."""
    return f"[{task_id}] after its pool child " in worker.output()


def pending_holds(cenv: CeleryEnv) -> list[bytes]:
    return [k for k in lock_keys(cenv) if k.endswith(b":pending")]


def queue_length(cenv: CeleryEnv, queue: str) -> int:
    return int(cenv.broker.client().llen(queue))


class TestWorkerDeath:
    def test_whole_worker_killed_frees_the_key_within_ttl(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        ttl = 2.0
        doomed = Worker(cenv.env, extra_env={"CSL_TTL": str(ttl)}).start()
        try:
            work = cenv.app_module.work
            result = work.apply_async(("whole", 60), queue=doomed.queue)
            wait_for(lambda: started(cenv), what="start")
            time.sleep(ttl * 1.5)  # renewed past its ttl while the worker lives
            assert lock_keys(cenv)
            doomed.kill()
            killed_at = time.monotonic()
            wait_for(lambda: not lock_keys(cenv), ttl + 1.0, "expiry within ttl")
            print(f"\nwhole worker SIGKILL: key free {time.monotonic() - killed_at:.2f}s later")
        finally:
            doomed.stop()
        again = work.apply_async(("whole",), queue=worker.queue)
        assert again.id != result.id
        assert again.get(timeout=20) == "whole"

    def test_killed_worker_frees_the_keys_of_messages_it_had_prefetched(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        ttl = 2.0
        doomed = Worker(cenv.env, concurrency=1, extra_env={"CSL_TTL": str(ttl)}).start()
        try:
            work = cenv.app_module.work
            work.apply_async(("busy", 60), queue=doomed.queue)
            wait_for(lambda: started(cenv), what="start")
            waiting = work.apply_async(("prefetched",), queue=doomed.queue)
            key = "t:{" + work.singleton_options().key.derive(("prefetched",), {}) + "}"
            # Received by the worker: its main process now holds (and renews) the lease.
            wait_for(lambda: doomed.took(cenv.lock_client().get(key)), 10, "reserve")
            doomed.kill()
            killed_at = time.monotonic()
            wait_for(lambda: not cenv.lock_client().exists(key), ttl + 1.0, "free within ttl")
            print(f"\nprefetched message: key free {time.monotonic() - killed_at:.2f}s after kill")
        finally:
            doomed.stop()
        again = work.apply_async(("prefetched",), queue=worker.queue)
        assert again.id != waiting.id
        assert again.get(timeout=20) == "prefetched"

    def test_a_lone_countdown_message_is_reserved_on_a_fresh_store(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        """The store knows no script (cenv flushes them): the reservation still applies
        at once, not when a next message comes, so a SIGKILL frees the key within ttl."""
        ttl = 2.0
        doomed = Worker(cenv.env, extra_env={"CSL_TTL": str(ttl)}).start()
        try:
            cenv.lock_client().script_flush()
            work = cenv.app_module.work
            later = work.apply_async(("lone",), countdown=60, queue=doomed.queue)
            key = "t:{" + work.singleton_options().key.derive(("lone",), {}) + "}"
            wait_for(lambda: doomed.took(cenv.lock_client().get(key)), 10, "reserve")
            assert cenv.lock_client().pttl(key) <= ttl * 1000
            doomed.kill()
            wait_for(lambda: not cenv.lock_client().exists(key), ttl + 1.0, "free within ttl")
        finally:
            doomed.stop()
        again = work.apply_async(("lone",), queue=worker.queue)
        assert again.id != later.id
        assert again.get(timeout=20) == "lone"

    def test_a_warm_shutdown_after_many_tasks_releases_nothing_it_no_longer_runs(
        self, cenv: CeleryEnv
    ) -> None:
        """The main process forgets each task when it ends (Celery's generated request
        class skips our on_success): a shutdown has nothing left to release."""
        worker = Worker(cenv.env).start()
        try:
            work = cenv.app_module.work
            results = [work.apply_async((f"many-{n}",), queue=worker.queue) for n in range(100)]
            for result in results:
                result.get(timeout=60)
            [reply] = cenv.app_module.app.control.broadcast(
                "singleton_stats", destination=[worker.nodename], reply=True, timeout=5
            )
            stats = reply[worker.nodename]
            print(f"\nafter 100 tasks: {stats}")
            assert stats["reservations"] == 0
            assert stats["watched_children"] <= worker.concurrency
            assert stats["child_watch"] is True
        finally:
            worker.stop()
        assert "released" not in worker.output()
        assert "pool child" not in worker.output()
        del results
        gc.collect()


class TestAChildKilledSendingOn:
    """A pool child SIGKILLed as it sends its message on, after it passed that message
    its hold: the worker's main process frees the hold, which no message carries."""

    @pytest.fixture(name="dying")
    def fixture_dying(self, cenv: CeleryEnv) -> Any:
        """A prefork worker whose runs of ``DIES_SENDING`` items die sending on."""
        worker = Worker(cenv.env, extra_env={"CSL_DIES_SENDING": "1"}).start()
        try:
            yield worker
        finally:
            worker.stop()

    def test_a_child_killed_sending_a_requeue_frees_the_hold_it_passed_on(
        self, cenv: CeleryEnv, dying: Worker
    ) -> None:
        # The pending call's run passes its hold to its requeue's message, then dies
        # sending it: the worker's main process frees that hold, which no message carries.
        refresh = cenv.app_module.refresh
        item = f"{cenv.app_module.DIES_SENDING}-requeue"
        refresh.apply_async((item, UNTIL_OPENED), queue=dying.queue)
        wait_for(lambda: started(cenv), what="first run")
        pending = refresh.apply_async((item,), queue=dying.queue)
        wait_for(lambda: child_died(dying, pending.id), 10, "the child's death")
        # (the first run still holds the key: the hold beside it is the one passed on)
        wait_for(lambda: not pending_holds(cenv), 3, "the passed-on hold freed")
        later = refresh.apply_async((item,), queue=dying.queue)
        assert later.id != pending.id, "a new call queues: no hold is left behind"
        open_gate(cenv, item)
        assert later.get(timeout=20) == item

    @pytest.mark.parametrize(
        "task",
        ["work", "work_while_executing", "export"],
        ids=["default", "while_executing", "limit"],
    )
    def test_a_child_killed_sending_a_retry_frees_the_key_it_passed_on(
        self, cenv: CeleryEnv, dying: Worker, task: str
    ) -> None:
        # while_executing and limit=N: the message has no queued hold of its own, so the
        # retry's is fresh; the main process finds it by the retry's count and task id.
        work = getattr(cenv.app_module, task)
        item = f"{cenv.app_module.DIES_SENDING}-retry-{task}"
        first = work.apply_async((item, 0.0, "retry"), queue=dying.queue)
        wait_for(lambda: child_died(dying, first.id), 10, "the child's death")
        wait_for(lambda: not lock_keys(cenv), 3, "the key freed")
        again = work.apply_async((item,), queue=dying.queue)
        assert again.id != first.id
        assert again.get(timeout=20) == item


class TestAChildKilledBesideAnotherCopy:
    def test_its_own_slot_is_freed_never_another_copy_s_retry(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        # Two copies of one task id (a reused task_id=) on limit=3's slots: one waits out
        # its retry with the hold its run passed on (on the first slot), the other's
        # child is killed mid-run. Both match the shape the worker frees a retry's hold
        # by; the dead child's own lease is the one freed.
        export, item = cenv.app_module.export, f"copies-{uuid.uuid4().hex[:8]}"
        task_id = str(uuid.uuid4())
        store = LockStores.for_app(cenv.app_module.app).lock
        first, second, _ = export.singleton_options().mode.running_names(
            export.singleton_options().key.derive((item,), {})
        )
        retry_hold = retry_token(task_id, None, 0)  # what the first copy's retry waits with
        assert isinstance(store.try_acquire(first, 60, token=retry_hold), Lease)
        export.apply_async((item, UNTIL_OPENED), task_id=task_id, queue=worker.queue)
        wait_for(lambda: started(cenv), what="the second copy's run")
        assert holder(cenv, store, second) is not None, "the run took the next slot"
        os.kill(started(cenv)[0]["pid"], signal.SIGKILL)
        wait_for(lambda: child_died(worker, task_id), 10, "the child's death")
        assert holder(cenv, store, second) is None, "the dead child's slot is free"
        assert holder(cenv, store, first) == retry_hold, "the other copy's retry keeps its slot"
        store.release_token(first, retry_hold)
        open_gate(cenv, item)


def holder(cenv: CeleryEnv, store: Any, name: str) -> str | None:
    """The token holding lock ``name`` now, if any."""
    value = cenv.lock_client().get(store.keys(name).lock)
    return None if value is None else value.decode()


class TestWorkerStart:
    def test_a_misspelt_setting_stops_the_worker_naming_it_as_written(
        self, cenv: CeleryEnv
    ) -> None:
        worker = Worker(cenv.env, app="tests.support.django_style_app", extra_env={"CSL_TYPO": "1"})
        with pytest.raises(RuntimeError, match="worker exited") as caught:
            worker.start(timeout=30)
        assert worker.process is not None
        code = worker.process.returncode
        worker.stop()
        output = str(caught.value)
        print(output[-600:])
        assert "CELERY_SINGLETON_LOCK_TLL (did you mean CELERY_SINGLETON_LOCK_TTL?)" in output
        assert "Traceback" not in output
        assert " ready." not in output
        assert code != 0

    def test_the_same_error_at_dispatch(self, cenv: CeleryEnv) -> None:
        os.environ["CSL_TYPO"] = "1"
        try:
            module = importlib.reload(importlib.import_module("tests.support.django_style_app"))
        finally:
            del os.environ["CSL_TYPO"]
        with pytest.raises(ConfigurationError, match="did you mean CELERY_SINGLETON_LOCK_TTL"):
            module.job.delay(1)

    def test_a_well_spelt_django_style_app_starts(self, cenv: CeleryEnv) -> None:
        worker = Worker(cenv.env, app="tests.support.django_style_app").start()
        try:
            module = importlib.reload(importlib.import_module("tests.support.django_style_app"))
            result = module.job.apply_async((7,), queue=worker.queue)
            assert result.get(timeout=20) == 7
        finally:
            worker.stop()


class TestRedelivery:
    def test_redelivery_while_the_first_execution_runs_does_not_overlap(
        self, cenv: CeleryEnv
    ) -> None:
        # The Redis transport hands an unacked message out again once the visibility
        # timeout passes, with the same task id, while the first execution still runs.
        hasty = Worker(cenv.env, extra_env={"CSL_VISIBILITY_TIMEOUT": "1"}).start()
        try:
            durable = cenv.app_module.durable
            result = durable.apply_async(("redelivered", 4), queue=hasty.queue)
            assert result.get(timeout=60) == "redelivered"
            # The copy (same task id) met the running original and was dropped: acked,
            # nothing stored under the id. It never ran, alongside or after.
            assert "running" in [s["holder_state"] for s in dropped(cenv, result.id)]
            # A copy requeued instead would be queued, or in the worker, until it had run.
            broker = cenv.broker.client()
            wait_for(
                lambda: broker.llen(hasty.queue) == 0 and hasty.idle(), 30, "no copy left anywhere"
            )
            records = runs(cenv)
            print(f"\nredelivery: {len(records)} execution of one task id")
            assert [r["id"] for r in records] == [result.id]
            assert result.state == "SUCCESS"
        finally:
            hasty.stop()


class TestBadInput:
    def test_unencodable_argument_fails_at_dispatch_and_nothing_is_sent(
        self, cenv: CeleryEnv
    ) -> None:
        work = cenv.app_module.work
        with pytest.raises(KeyDerivationError) as caught:
            work.apply_async(({1, 2},), queue="nobody-listens")
        assert caught.value.param == "item"
        assert queue_length(cenv, "nobody-listens") == 0
        assert lock_keys(cenv) == []

    def test_bad_options_fail_when_the_decorator_is_applied(self, cenv: CeleryEnv) -> None:
        app = cenv.app_module.app

        def job(order_id: int) -> None: ...

        cases = [
            ({"key": ["no_such_param"]}, "not parameters"),
            ({"on_contention": "retry"}, "['fail', 'requeue', 'skip', 'wait']"),
            ({"on_duplicate": "ignore"}, "['return', 'raise', 'replace', 'cancel']"),
            ({"ttl": 0}, "ttl must be positive"),
            ({"queue_ttl": "1h"}, "queue_ttl must be a number"),
            ({"dedupe": "yes"}, "dedupe must be True or False"),
        ]
        for options, message in cases:
            with pytest.raises(ConfigurationError) as caught:
                singleton_task(app=app, name=f"bad.{len(message)}", **options)(job)
            assert message in str(caught.value), options

    def test_foreign_value_is_an_unknown_holder_until_its_ttl(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work = cenv.app_module.work
        key = "t:{" + work.singleton_options().key.derive(("foreign",), {}) + "}"
        cenv.lock_client().set(key, "not-one-of-ours", px=1500)
        with pytest.raises(DuplicateTaskError, match="holder unknown"):
            work.apply_async(("foreign",), queue=worker.queue)
        bypass = cenv.app_module.app.send_task(
            "tests.support.celery_app.work", ("foreign",), queue=worker.queue
        )
        assert bypass.get(timeout=30) == "foreign"
        assert runs(cenv)[0]["start"] > 0


@pytest.fixture(name="dead_lock_app")
def fixture_dead_lock_app(cenv: CeleryEnv) -> Celery:
    """An app whose lock store URL (with a password) points at a port nobody listens on."""
    app = Celery("dead", set_as_current=False)
    app.conf.update(
        broker_url=cenv.broker.url,
        result_backend=cenv.broker.url,
        singleton_lock_url=f"redis://:hunter2@127.0.0.1:{free_port()}/0",
    )
    return app


class TestLockStoreDown:
    def test_fail_closed_dispatch_raises_without_the_password_and_sends_nothing(
        self, cenv: CeleryEnv, dead_lock_app: Celery
    ) -> None:
        @singleton_task(app=dead_lock_app, name="dead.closed")
        def job(x: int) -> int:
            return x

        with pytest.raises(LockStoreUnavailableError) as caught:
            job.apply_async((1,), queue="dead-closed")
        assert caught.value.url.startswith("redis://***@127.0.0.1")
        message = str(caught.value)
        assert "unreachable" in message
        assert "hunter2" not in message
        assert "***@127.0.0.1" in message
        assert queue_length(cenv, "dead-closed") == 0

    def test_fail_open_dispatch_publishes_and_warns(
        self, cenv: CeleryEnv, dead_lock_app: Celery, caplog: pytest.LogCaptureFixture
    ) -> None:
        dead_lock_app.conf.singleton_lock_on_redis_error = "fail_open"

        @singleton_task(app=dead_lock_app, name="dead.open")
        def job(x: int) -> int:
            return x

        with caplog.at_level(logging.WARNING, logger="celery_singleton_lock"):
            job.apply_async((1,), queue="dead-open")
        assert queue_length(cenv, "dead-open") == 1
        assert "without the duplicate check (fail_open)" in caplog.text
        assert "hunter2" not in caplog.text
        cenv.broker.client().delete("dead-open")

    def test_fail_closed_execution_requeues_until_the_store_returns(self, cenv: CeleryEnv) -> None:
        store = RedisServer().start()
        env = {**cenv.env, "CSL_LOCK_URL": store.url}
        outage = Worker(env).start()
        try:
            store.kill()
            result = cenv.app_module.app.send_task(
                "tests.support.celery_app.work", ("outage",), queue=outage.queue
            )
            # The worker met the outage at execution and sent the message back, twice.
            wait_for(lambda: outage.output().count("requeueing") >= 2, 30, "two requeues")
            assert runs(cenv) == []  # not run unlocked, not lost
            store.start()
            assert result.get(timeout=30) == "outage"
            assert len(runs(cenv)) == 1
            assert "requeueing" in outage.output()
        finally:
            outage.stop()
            store.cleanup()

    def test_fail_open_execution_runs_unlocked_and_says_so(self, cenv: CeleryEnv) -> None:
        store = RedisServer().start()
        env = {**cenv.env, "CSL_LOCK_URL": store.url, "CSL_ON_REDIS_ERROR": "fail_open"}
        reckless = Worker(env).start()
        try:
            store.kill()
            result = cenv.app_module.app.send_task(
                "tests.support.celery_app.work", ("open",), queue=reckless.queue
            )
            assert result.get(timeout=30) == "open"
            [run] = runs(cenv)
            assert run["fence"] == 0
            assert "UNLOCKED (fail_open)" in reckless.output()
        finally:
            reckless.stop()
            store.cleanup()

    def test_fail_closed_gives_up_after_its_requeues_with_the_outage_as_the_failure(
        self, cenv: CeleryEnv
    ) -> None:
        # A call requeued through a whole outage (about an hour) fails with the store's
        # error: never run unlocked, never requeued for ever.
        store = RedisServer().start()
        outage = Worker({**cenv.env, "CSL_LOCK_URL": store.url}).start()
        try:
            store.kill()
            result = cenv.app_module.app.send_task(
                "tests.support.celery_app.work",
                ("outage-for-good",),
                queue=outage.queue,
                headers={OUTAGE_HEADER: str(OUTAGE_MAX_REQUEUES)},
            )
            with pytest.raises(LockStoreUnavailableError, match="it is not requeued again"):
                result.get(timeout=30)
            assert runs(cenv) == []
            assert queue_length(cenv, outage.queue) == 0
            # (logged as the failure is reported, which may come after its result)
            wait_for(
                lambda: f"through {OUTAGE_MAX_REQUEUES} requeues" in outage.output(),
                10,
                "the failure logged",
            )
        finally:
            outage.stop()
            store.cleanup()


class TestStartupWarnings:
    def test_evicting_lock_store_and_short_visibility_timeout_are_warned_at_start(
        self, cenv: CeleryEnv
    ) -> None:
        store = RedisServer("--maxmemory-policy", "allkeys-lru").start()
        env = {**cenv.env, "CSL_LOCK_URL": store.url, "CSL_VISIBILITY_TIMEOUT": "1"}
        worker = Worker(env).start()
        try:
            log = wait_for(
                lambda: "maxmemory-policy=allkeys-lru" in worker.output() and worker.output(),
                10,
                "the warning",
            )
            assert "maxmemory-policy noeviction" in log
            # Acked late, its message is unacked while it runs; acked early, it is not.
            assert (
                "tests.support.celery_app.durable_limited: time_limit=2.0s with acks_late is "
                "not below the broker's visibility_timeout=1.0s" in log
            )
            assert "celery_app.limited: time_limit" not in log
            # The default requeue waits up to 60 s; latest's, 0.2 s at most.
            assert (
                "tests.support.celery_app.work: on_contention requeues with countdowns up to "
                "60.0s, not below the broker's visibility_timeout=1.0s" in log
            )
            assert "requeue(cap=...) below 1.0, or raise visibility_timeout" in log
            assert "celery_app.latest: on_contention" not in log
        finally:
            worker.stop()
            store.cleanup()

    def test_a_warning_spells_our_settings_as_the_app_does(self, cenv: CeleryEnv) -> None:
        # Under Django: CELERY_SINGLETON_LOCK_CONSUMER_TIMEOUT, not the name Celery's own
        # settings are read by.
        module = importlib.reload(importlib.import_module("tests.support.django_style_app"))
        module.app.conf.update(
            broker_url="amqp://guest:guest@127.0.0.1:5672//",
            CELERY_SINGLETON_LOCK_URL=cenv.lock.url,
            CELERY_SINGLETON_LOCK_CONSUMER_TIMEOUT=30,
        )
        warnings = "\n".join(check_worker_setup(module.app))
        print(warnings)
        assert "countdowns up to 60.0s, not below the broker's consumer_timeout=30.0s" in warnings
        assert "(and CELERY_SINGLETON_LOCK_CONSUMER_TIMEOUT with it)" in warnings
        assert "singleton_lock_" not in warnings

    def test_healthy_setup_gives_no_warning(self, cenv: CeleryEnv, worker: Worker) -> None:
        # The session's worker: a setup check would warn. Its log also says what it
        # recovered for earlier tests, which is no warning about its setup: a killed
        # worker's unacked messages restored (INFO), and with the locks on the broker's
        # server, messages a killed worker had popped and never recorded, pushed again.
        recovered = "was lost between the broker and a worker"
        lines = worker.output().splitlines()
        ours = [ln for ln in lines if "celery-singleton-lock:" in ln and recovered not in ln]
        assert [ln for ln in ours if "WARNING/" in ln or "ERROR/" in ln] == []


class TestDispatchHolds:
    def test_countdown_task_holds_its_key_past_its_eta(self, cenv: CeleryEnv) -> None:
        work = cenv.app_module.work
        result = work.apply_async(("eta",), countdown=120, queue="nobody-eta")
        key = "t:{" + work.singleton_options().key.derive(("eta",), {}) + "}"
        queue_ttl_ms = 3600 * 1000
        assert cenv.lock_client().pttl(key) > queue_ttl_ms + 110 * 1000
        assert work.apply_async(("eta",), queue="nobody-eta").id == result.id
        cenv.broker.client().delete("nobody-eta")

    def test_failed_publish_gives_the_key_back(self, cenv: CeleryEnv) -> None:
        app = Celery("nobroker", set_as_current=False)
        app.conf.update(
            broker_url=f"redis://127.0.0.1:{free_port()}/0",
            broker_connection_timeout=1,
            broker_connection_retry=False,
            broker_connection_max_retries=0,
            task_publish_retry=False,
            singleton_lock_url=cenv.lock.url,
            singleton_lock_prefix="t",
        )

        @singleton_task(app=app, name="nobroker.job")
        def job(x: int) -> int:
            return x

        with pytest.raises(Exception) as caught:  # noqa: PT011  (kombu's error type varies)
            job.apply_async((1,))
        assert "Connection refused" in str(caught.value) or "Error" in type(caught.value).__name__
        assert lock_keys(cenv) == []

    def test_dedupe_false_per_call_publishes_past_a_hold(self, cenv: CeleryEnv) -> None:
        work = cenv.app_module.work
        first = work.apply_async(("redrive",), queue="nobody-redrive")
        again = work.apply_async(("redrive",), queue="nobody-redrive", dedupe=False)
        assert again.id != first.id
        assert queue_length(cenv, "nobody-redrive") == 2
        cenv.broker.client().delete("nobody-redrive")

    def test_a_redrive_runs_past_a_queued_hold_whose_message_is_lost(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        # The hold of a message no worker will run soon: it sits in a queue nobody
        # consumes, as a message in the prefetch of a worker killed before it could
        # reserve it sits in the broker's unacked set until the visibility timeout.
        work = cenv.app_module.work
        lost = work.apply_async(("lost",), queue="nobody-lost")
        key = "t:{" + work.singleton_options().key.derive(("lost",), {}) + "}"
        assert cenv.lock_client().get(key).startswith(b"q|")
        # The re-drive runs now, fenced, and leaves the key free.
        redrive = work.apply_async(("lost",), dedupe=False, queue=worker.queue)
        assert redrive.get(timeout=20) == "lost"
        assert [r["id"] for r in runs(cenv)] == [redrive.id]
        assert runs(cenv)[0]["fence"] > 0
        assert lost.state == "PENDING"
        cenv.broker.client().delete("nobody-lost")

    def test_a_redrive_never_takes_a_running_lease(self, cenv: CeleryEnv, worker: Worker) -> None:
        strict = cenv.app_module.strict
        running = strict.apply_async(("busy", UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: started(cenv), what="the first execution started")
        redrive = strict.apply_async(("busy",), dedupe=False, queue=worker.queue)
        with pytest.raises(DuplicateTaskError):
            redrive.get(timeout=20)
        open_gate(cenv, "busy")
        assert running.get(timeout=20) == "busy"
        assert [r["id"] for r in runs(cenv)] == [running.id]


class TestCountdownPastTheVisibilityTimeout:
    """A call's own countdown longer than the broker lets a message wait unacked: kombu
    would hand it out again while it waits, and each copy would run in turn (measured
    without the hops: three runs of one call). It arrives early and is sent on in hops,
    holding its key throughout, and runs once, at its ETA."""

    VISIBILITY = 3.0  # the workers' and this producer's: hops of 1.5 s

    @pytest.fixture(
        name="hopping",
        params=[
            "prefork",
            # An in-process pool reads the main process's hand-off as it is (CI's one-offs;
            # gevent, eventlet and solo do the same, and passed when tried by hand).
            pytest.param("threads", marks=pytest.mark.oneoff),
        ],
    )
    def fixture_hopping(
        self, cenv: CeleryEnv, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
    ) -> Any:
        """A worker whose broker hands a message out again after 3 s. (Each hop's hold
        handed back: ``test_eta_hops.py``; here the worker holds each hop meanwhile.)"""
        conf = cenv.app_module.app.conf
        options = {**(conf.broker_transport_options or {}), "visibility_timeout": self.VISIBILITY}
        monkeypatch.setitem(conf, "broker_transport_options", options)
        extra = {"CSL_VISIBILITY_TIMEOUT": str(self.VISIBILITY)}
        pool = request.param
        worker = Worker(
            cenv.env, extra_env=extra, pool=pool, concurrency=2 if pool == "prefork" else 4
        )
        worker.start()
        try:
            yield worker
        finally:
            worker.stop()

    def test_a_waiting_calls_place_is_kept_for_each_hops_wait(
        self, cenv: CeleryEnv, hopping: Worker
    ) -> None:
        # (max_pending: a place among the key's waiting calls, renewed as it goes round)
        capped = cenv.app_module.capped
        item = f"eta-place-{time.monotonic_ns()}"
        call = capped.apply_async((item,), countdown=6, queue=hopping.queue)
        name = capped.singleton_options().key.derive((item,), {})
        place = LockStores.for_app(cenv.app_module.app).lock.keys(name).backlog
        client, queue_ttl = cenv.lock_client(), capped.singleton_context.queue_ttl

        def left() -> float:
            """Seconds until the call's place runs out, on the lock server's clock."""
            seconds, micros = client.time()
            return float(client.zscore(place, call.id) or 0) / 1000 - seconds - micros / 1e6

        wait_for(lambda: f"[{call.id}] waits" in hopping.output(), 10, "a hop")
        # Sent 1.5 s on: its place lasts queue_ttl after it next arrives, not before.
        wait_for(lambda: left() > queue_ttl + 1.0, 3, "the place renewed for the hop too")
        assert call.get(timeout=30) is not None

    def test_a_deferral_in_hops_is_one_entry_in_a_kept_history(
        self, cenv: CeleryEnv, hopping: Worker
    ) -> None:
        rated = cenv.app_module.chronicled_rated  # 1 run per 2 s: the second deferred 2 s
        item = f"eta-history-{time.monotonic_ns()}"
        calls = [rated.apply_async((item, n), queue=hopping.queue) for n in range(2)]
        assert [c.get(timeout=30) for c in calls] == [0, 1]
        second = next(c for c in calls if f"[{c.id}] deferred" in hopping.output())
        # (its first hop arrives 0.5 s before its slot, and is deferred again)
        assert hopping.output().count(f"[{second.id}] deferred") == 2
        name = rated.singleton_options().key.derive((item, 0), {})
        _, entries = entries_of(LockStores.for_app(cenv.app_module.app).lock, name)
        deferred = [e for e in entries if e.event == "rate-limited"]
        assert [e.fields.get("id") for e in deferred] == [second.id]

    @pytest.mark.parametrize("name", ["work", "durable", "refresh", "rated_slowly"])
    def test_it_runs_once_at_its_eta_and_keeps_its_key_meanwhile(
        self, cenv: CeleryEnv, hopping: Worker, name: str
    ) -> None:
        task = getattr(cenv.app_module, name)
        item = f"eta-{name}-{time.monotonic_ns()}"
        sent_at = time.time()
        call = task.apply_async((item,), countdown=6, queue=hopping.queue)
        # Two hops on: the first arrival's hold is no longer the one held.
        wait_for(lambda: hopping.output().count(f"[{call.id}] waits") >= 2, 10, "two hops")
        if name != "rated_slowly":  # (a rate holds no key: every call is sent)
            again = task.apply_async((item,), queue=hopping.queue)
            assert again.id == call.id, "the key is held while the call waits"
        assert call.get(timeout=30) is not None
        wait_for(lambda: all_delivered(cenv, hopping, {call.id}), 15, "every delivery done")
        log = hopping.output()
        records = rated_runs(cenv) if name == "rated_slowly" else runs(cenv)
        mine = [r for r in records if r["item"] == item]
        assert len(mine) == 1, f"it ran once:\n{log[-3000:]}"
        assert mine[0]["start"] >= sent_at + 6 - 0.1, "not before its eta"
        name_ = task.singleton_options().key.derive((item,), {})
        held = LockStores.for_app(cenv.app_module.app).lock.keys(name_).lock
        assert not cenv.lock_client().exists(held), "nothing left held"

    def test_a_later_call_replaces_it_while_it_waits(
        self, cenv: CeleryEnv, hopping: Worker
    ) -> None:
        latest = cenv.app_module.latest_queued
        item = f"eta-replaced-{time.monotonic_ns()}"
        first = latest.apply_async((item, "v1"), countdown=6, queue=hopping.queue)
        wait_for(lambda: f"[{first.id}] waits" in hopping.output(), 10, "a hop")
        second = latest.apply_async((item, "v2"), countdown=6, queue=hopping.queue)
        assert second.id == first.id, "the queued call takes the newer arguments"
        assert second.get(timeout=30) == "v2"
        wait_for(lambda: all_delivered(cenv, hopping, {first.id}), 15, "every delivery done")
        log = hopping.output()
        mine = [r for r in runs(cenv) if r["item"] == item]
        assert [r["version"] for r in mine] == ["v2"], f"the newer ran, once:\n{log[-3000:]}"

    def test_a_retry_with_a_longer_countdown_runs_once_more_at_its_eta(
        self, cenv: CeleryEnv, hopping: Worker
    ) -> None:
        item = f"retry-later-{time.monotonic_ns()}"
        work = cenv.app_module.work
        call = work.apply_async((item, 0.0, "retry_later"), queue=hopping.queue)
        assert call.get(timeout=30) == item
        wait_for(lambda: all_delivered(cenv, hopping, {call.id}), 15, "every delivery done")
        log = hopping.output()
        mine = sorted((r for r in runs(cenv) if r["item"] == item), key=lambda r: r["start"])
        assert [r.get("retrying", False) for r in mine] == [True, False], log[-3000:]
        assert mine[1]["start"] >= mine[0]["end"] + 5 - 0.1, "the retry waited its countdown"
        assert log.count(f"[{call.id}] waits") >= 2, log[-3000:]
