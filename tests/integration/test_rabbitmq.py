"""RabbitMQ as the broker: the same promises as on Redis, with real workers.

A private ``rabbitmq-server`` (tests/support/rabbitmq.py) is the broker; the result backend and
the lock store stay on Redis. The test process publishes through a kombu connection to
RabbitMQ (``connection=``), so the shared test app needs no second configuration.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
from celery import Celery
from celery.exceptions import TaskRevokedError

from celery_singleton_lock import DuplicateTaskError

from ..conftest import CeleryEnv
from ..support.modes import concurrency
from ..support.rabbitmq import RabbitMQServer, rabbitmq_available
from ..support.rates import check_rate, rated_runs
from ..support.runs import lock_keys, runs, started, wait_for
from ..support.workers import ROOT, Worker

pytestmark = [
    pytest.mark.oneoff,
    pytest.mark.skipif(
        not rabbitmq_available(),
        reason="no rabbitmq-server: `python3 scripts/dev.py test` installs Debian's as root",
    ),
]


def _env(cenv: CeleryEnv, rabbit: RabbitMQServer) -> dict[str, str]:
    return {**cenv.env, "CSL_BROKER_URL": rabbit.url, "CSL_RESULT_URL": cenv.broker.url}


@pytest.fixture(name="rworker", scope="module")
def fixture_rworker(celery_env: CeleryEnv, rabbit: RabbitMQServer) -> Iterator[Worker]:
    worker = Worker(_env(celery_env, rabbit)).start()
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(name="amqp")
def fixture_amqp(rabbit: RabbitMQServer) -> Iterator[kombu.Connection]:
    with kombu.Connection(rabbit.url) as connection:
        yield connection


def _forget(*results: Any) -> None:
    del results
    gc.collect()


class TestOnRabbitMQ:
    def test_an_idempotency_key_answers_repeats_and_copies(
        self, cenv: CeleryEnv, rworker: Worker, amqp: kombu.Connection
    ) -> None:
        charge = cenv.app_module.charge
        key = f"r-idem-{time.time_ns()}"
        options: dict[str, Any] = {"queue": rworker.queue, "connection": amqp}
        first = charge.apply_async(("r-idem",), idempotency_key=key, **options)
        assert first.get(timeout=30) == "r-idem"
        assert charge.apply_async(("r-idem",), idempotency_key=key, **options).id == first.id
        copy = charge.apply_async(("r-idem",), headers={"Idempotency-Key": key}, **options)
        assert copy.id == first.id  # the task reads its key from the header at dispatch too
        sent = charge.app.send_task(
            charge.name, ("r-idem",), headers={"Idempotency-Key": key}, **options
        )
        assert sent.get(timeout=30) == "r-idem"  # answered in the worker, not run again
        assert len([r for r in runs(cenv) if r["item"] == "r-idem"]) == 1
        _forget(first, copy, sent)

    def test_a_duplicate_dispatch_is_refused(
        self, cenv: CeleryEnv, rworker: Worker, amqp: kombu.Connection
    ) -> None:
        work = cenv.app_module.work
        first = work.apply_async(("r-dedupe", 0.5), queue=rworker.queue, connection=amqp)
        second = work.apply_async(("r-dedupe", 0.5), queue=rworker.queue, connection=amqp)
        assert second.id == first.id
        assert first.get(timeout=30) == "r-dedupe"
        assert [r["id"] for r in runs(cenv)] == [first.id]
        wait_for(lambda: lock_keys(cenv) == [], what="the key given back")

    def test_a_late_tenant_takes_its_turn_while_another_floods(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, amqp: kombu.Connection
    ) -> None:
        # total_limit round robin: the calls kept in the lock store, sent again through
        # RabbitMQ on their turn.
        flood, late = f"ra-{time.time_ns()}", f"rb-{time.time_ns()}"
        worker = Worker(_env(cenv, rabbit), concurrency=4).start()
        try:
            fair = cenv.app_module.export_fair
            options: dict[str, Any] = {"queue": worker.queue, "connection": amqp}
            calls = [fair.apply_async((flood, 0.3), **options) for _ in range(12)]
            wait_for(lambda: len([r for r in runs(cenv) if r["item"] == flood]) >= 2, 30)
            sent = time.time()
            assert fair.apply_async((late, 0.3), **options).get(timeout=30) == late
            assert [call.get(timeout=60) for call in calls] == [flood] * 12
        finally:
            worker.stop()
        done = [r for r in runs(cenv) if r["item"] in (flood, late)]
        first = min(r["start"] for r in done if r["item"] == late)
        assert first - sent < 1.0, f"the late tenant waited {first - sent:.2f}s"
        assert concurrency(done) <= 2
        _forget(*calls)

    def test_a_rate_defers_runs_to_their_slots_through_rabbitmq(
        self, cenv: CeleryEnv, rworker: Worker, amqp: kombu.Connection
    ) -> None:
        rated = cenv.app_module.rated
        results = [
            rated.apply_async(("r-rate", n), queue=rworker.queue, connection=amqp) for n in range(6)
        ]
        assert [r.get(timeout=30) for r in results] == list(range(6))
        check_rate(rated_runs(cenv), 20, 1.0)
        _forget(*results)

    def test_a_deferral_goes_in_hops_shorter_than_the_consumer_timeout_it_is_told(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, amqp: kombu.Connection
    ) -> None:
        # singleton_lock_consumer_timeout=2: a run deferred to its slot (1/2s) is sent on
        # in hops of at most 1 s, and each call still runs once, on its slot.
        worker = Worker(_env(cenv, rabbit), extra_env={"CSL_CONSUMER_TIMEOUT": "2"}).start()
        try:
            rated = cenv.app_module.rated_slowly
            results = [
                rated.apply_async(("r-hops", n), queue=worker.queue, connection=amqp)
                for n in range(3)
            ]
            assert [r.get(timeout=30) for r in results] == list(range(3))
            log = worker.output()
            assert "(sent 1.0s on: the broker's unacked timeout)" in log
            # and at start it warned of what waits unacked longer than the timeout
            assert (
                "durable_limited: time_limit=2.0s with acks_late is not below the broker's "
                "consumer_timeout=2.0s" in log
            )
            assert "or raise the server's consumer_timeout (and singleton_lock_consumer" in log
            ran = [r["n"] for r in rated_runs(cenv) if r["item"] == "r-hops"]
            assert sorted(ran) == [0, 1, 2]
            _forget(*results)
        finally:
            worker.stop()

    def test_a_newer_call_cancels_the_run_in_progress_through_rabbitmq(
        self, cenv: CeleryEnv, rworker: Worker, amqp: kombu.Connection
    ) -> None:
        preview = cenv.app_module.preview
        old = preview.apply_async(("r-cancel", "v1", 10.0), queue=rworker.queue, connection=amqp)
        wait_for(lambda: started(cenv), what="the first run started")
        new = preview.apply_async(("r-cancel", "v2", 0.1), queue=rworker.queue, connection=amqp)
        assert new.get(timeout=30) == "v2"
        with pytest.raises(TaskRevokedError):
            old.get(timeout=30)
        records = runs(cenv)
        assert [r["version"] for r in records] == ["v1", "v2"]
        assert records[0]["cancelled"] is True
        assert records[1]["fence"] > records[0]["fence"]
        _forget(old, new)

    def test_a_copy_that_bypassed_dispatch_never_overlaps(
        self, cenv: CeleryEnv, rworker: Worker, amqp: kombu.Connection
    ) -> None:
        app, strict = cenv.app_module.app, cenv.app_module.strict
        holder = app.send_task(strict.name, ("r-x", 2.0), queue=rworker.queue, connection=amqp)
        wait_for(lambda: started(cenv), what="the holder started")
        copy = app.send_task(strict.name, ("r-x", 0.0), queue=rworker.queue, connection=amqp)
        with pytest.raises(DuplicateTaskError, match=holder.id):
            copy.get(timeout=30)
        assert holder.get(timeout=30) == "r-x"
        assert [r["id"] for r in runs(cenv)] == [holder.id]

    def test_a_killed_child_runs_again_once_never_overlapping(
        self, cenv: CeleryEnv, rworker: Worker, amqp: kombu.Connection
    ) -> None:
        durable = cenv.app_module.durable
        result = durable.apply_async(("r-child", 2), queue=rworker.queue, connection=amqp)
        [first] = wait_for(lambda: started(cenv), what="start")
        os.kill(first["pid"], signal.SIGKILL)
        # acks_late + reject_on_worker_lost: RabbitMQ hands the message out again.
        assert result.get(timeout=60) == "r-child"
        [run] = runs(cenv)
        assert run["pid"] != first["pid"]
        wait_for(lambda: not lock_keys(cenv), 3, "release")
        rworker.settle()

    def test_a_killed_worker_s_message_goes_to_another_which_waits_for_the_ttl(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, amqp: kombu.Connection
    ) -> None:
        ttl = 3.0
        env = _env(cenv, rabbit)
        shared = f"r-shared-{time.monotonic_ns()}"
        workers = [Worker(env, queue=shared, extra_env={"CSL_TTL": str(ttl)}) for _ in "ab"]
        try:
            for worker in workers:
                worker.start()
            durable = cenv.app_module.durable
            result = durable.apply_async(("r-whole", 4), queue=shared, connection=amqp)
            [first] = wait_for(lambda: started(cenv), what="start")
            [doomed] = [w for w in workers if first["pid"] in w.children()]
            doomed.kill()  # the broker hands the unacked message to the other at once
            killed_at = time.time()
            assert result.get(timeout=60) == "r-whole"
            [run] = runs(cenv)
            delay = run["start"] - killed_at
            print(f"\nRabbitMQ whole-worker SIGKILL: the copy started {delay:.2f}s after the kill")
            # It met the dead worker's lease (renewed every ttl/3, so at least 2/3 of the
            # ttl left) and ran once that expired, never alongside.
            assert delay > ttl / 3
            assert run["pid"] != first["pid"]
        finally:
            for worker in workers:
                worker.stop()

    def test_revoking_a_countdown_task_frees_its_key_within_two_seconds(
        self, cenv: CeleryEnv, rworker: Worker, amqp: kombu.Connection
    ) -> None:
        work = cenv.app_module.work
        later = work.apply_async(("r-rev",), countdown=30, queue=rworker.queue, connection=amqp)
        key = lock_keys(cenv)[0]
        wait_for(lambda: rworker.took(cenv.lock_client().get(key)), what="reserved")
        # Celery publishes control messages through the app's own producer pool whatever
        # connection= says: revoke from an app whose broker is RabbitMQ, as a user's is.
        control = Celery("r-control", broker=amqp.as_uri(include_password=True))
        control.control.revoke(later.id)
        revoked_at = time.monotonic()
        again = wait_for(
            lambda: (
                (r := work.apply_async(("r-rev",), queue=rworker.queue, connection=amqp)).id
                != later.id
                and r
            ),
            timeout=5,
            what="a new dispatch accepted",
        )
        assert time.monotonic() - revoked_at < 2.0
        assert again.get(timeout=30) == "r-rev"
        assert [r["id"] for r in runs(cenv)] == [again.id]
        _forget(later, again)


# A producer of the test app whose broker is RabbitMQ (its environment says so): a held
# call, then two chains whose first step attaches to it; their ids, as JSON.
ATTACHING = """
import json, sys, time
import redis
from celery import chain
from tests.support import celery_app as m
queue = sys.argv[1]
holder = m.work.apply_async(("r-attach", -30.0), queue=queue)
checker = redis.Redis.from_url(m.check_url())
while not any(json.loads(s)["item"] == "r-attach" for s in checker.lrange("started", 0, -1)):
    time.sleep(0.02)
step = lambda tag: chain(m.work.si("r-attach").set(queue=queue), m.follow.s(tag).set(queue=queue))
chains = [step(tag).apply_async() for tag in (1, 2)]
print(json.dumps({"holder": holder.id, "chains": [c.id for c in chains]}))
"""


class TestAttachOnRabbitMQ:
    def test_chains_attach_to_a_running_holder_and_go_on_with_its_result(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, rworker: Worker
    ) -> None:
        """Off the ride (the lock store is not the broker): the attach is the lock store's
        script, the kept message is sent again through RabbitMQ at the holder's end."""
        done = subprocess.run(
            [sys.executable, "-c", ATTACHING, rworker.queue],
            cwd=ROOT, env={**os.environ, **_env(cenv, rabbit)},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        sent = json.loads(done.stdout.strip().splitlines()[-1])
        app = cenv.app_module.app
        cenv.checker_client().rpush("gate:r-attach", 1)
        assert app.AsyncResult(sent["holder"]).get(timeout=30) == "r-attach"
        results = [app.AsyncResult(each).get(timeout=30) for each in sent["chains"]]
        assert results == [["r-attach", 1], ["r-attach", 2]]
        assert len([r for r in runs(cenv) if r["item"] == "r-attach"]) == 1
