"""RabbitMQ quorum queues with Celery's native delayed delivery, as Celery 5.5+ sets up new
deployments (``task_default_queue_type="quorum"``, a topic exchange, publisher confirms).

A countdown there goes through kombu's ``celery_delayed_*`` exchanges, which count whole
seconds and refuse a countdown below one. Every path that sends a call later runs here with
real workers; a producer process of the test app on the same broker dispatches (the test
process's own app publishes through Redis, where nothing is delayed natively).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import kombu
import pytest

from ..conftest import CeleryEnv
from ..support.modes import held
from ..support.rabbitmq import RabbitMQServer, rabbitmq_available
from ..support.rates import check_rate, rated_runs
from ..support.runs import runs, wait_for
from ..support.workers import ROOT, Worker

pytestmark = [
    pytest.mark.oneoff,
    pytest.mark.skipif(
        not rabbitmq_available(),
        reason="no rabbitmq-server: `python3 scripts/dev.py test` installs Debian's as root",
    ),
]

DELAY_LEVELS = 28  # kombu's celery_delayed_0 .. celery_delayed_27
PRODUCER_TIMEOUT = 90.0


def _env(cenv: CeleryEnv, rabbit: RabbitMQServer, **extra: str) -> dict[str, str]:
    return {
        **cenv.env,
        "CSL_BROKER_URL": rabbit.url,
        "CSL_RESULT_URL": cenv.broker.url,
        "CSL_QUEUE_TYPE": "quorum",
        **extra,
    }


@pytest.fixture(name="qworker", scope="module")
def fixture_qworker(celery_env: CeleryEnv, rabbit: RabbitMQServer) -> Iterator[Worker]:
    worker = Worker(_env(celery_env, rabbit)).start()
    try:
        yield worker
    finally:
        worker.stop()


def produce(worker: Worker, code: str, **extra_env: str) -> Any:
    """Run ``code`` in a producer process of the test app configured as ``worker`` is (its
    queue the default); it imports the app as ``m`` and returns what it assigns to ``out``."""
    program = "from tests.support import celery_app as m\nout = None\n"
    program += textwrap.dedent(code)
    program += "\nimport json\nprint('OUT ' + json.dumps(out))\n"
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env={**worker.env, **extra_env},
        capture_output=True,
        text=True,
        timeout=PRODUCER_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("OUT "))
    return json.loads(line[4:])


def delayed_messages(rabbit: RabbitMQServer) -> int:
    """Messages waiting in the delay exchanges' queues (none once every call has run)."""
    total = 0
    with kombu.Connection(rabbit.url) as connection:
        for level in range(DELAY_LEVELS):
            channel = connection.channel()
            try:
                declared = channel.queue_declare(f"celery_delayed_{level}", passive=True)
                total += declared.message_count
            finally:
                channel.close()
    return total


def queued(rabbit: RabbitMQServer, queue: str) -> int:
    with kombu.Connection(rabbit.url) as connection:
        return int(connection.channel().queue_declare(queue, passive=True).message_count)


def settled(cenv: CeleryEnv, rabbit: RabbitMQServer) -> None:
    """Nothing left behind: no lock key and nothing in the delay exchanges."""
    wait_for(lambda: held(cenv) == [], what="every key given back")
    assert delayed_messages(rabbit) == 0


class TestCountdownsOnQuorumQueues:
    def test_a_copy_sent_by_name_while_its_key_is_held_is_requeued_and_runs_after(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, qworker: Worker
    ) -> None:
        # The default requeue backs off 10-100 ms: below a second, which the delay
        # exchanges refuse. The copy carries an inherited x-death, which no re-send keeps.
        out = produce(
            qworker,
            """
            import time
            first = m.work.apply_async(("q-copy", 1.5))
            time.sleep(0.3)
            death = [{"count": 1, "reason": "rejected", "queue": "q", "exchange": ""}]
            assert m.deaths({"x-death": death}) == {"x_death": ["rejected:q"]}
            copy = m.app.send_task(m.work.name, ("q-copy", 0), headers={"x-death": death})
            out = [first.get(timeout=30), copy.get(timeout=30), first.id, copy.id]
            """,
        )
        assert out[:2] == ["q-copy", "q-copy"]
        ran = [r for r in runs(cenv) if r["item"] == "q-copy"]
        assert [r["id"] for r in ran] == out[2:]  # each once, the copy after the holder
        assert ran[1]["start"] >= ran[0]["end"]
        assert "requeued in" in qworker.output()
        # Its delays add the delay queues' own deaths (expired); the inherited one is gone.
        assert "rejected:q" not in ran[1].get("x_death", [])
        settled(cenv, rabbit)

    def test_a_rate_defers_at_dispatch_and_at_execution(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, qworker: Worker
    ) -> None:
        # ``delayed`` (10/s, on_limited="delay") reserves each slot at dispatch and sends
        # the call with a countdown to it; ``rated`` (20/s) defers at execution.
        out = produce(
            qworker,
            """
            delayed = [m.delayed.apply_async(("q-delay", n)) for n in range(5)]
            rated = [m.rated.apply_async(("q-rate", n)) for n in range(5)]
            out = [r.get(timeout=30) for r in delayed + rated]
            """,
        )
        assert out == [0, 1, 2, 3, 4] * 2
        records = rated_runs(cenv)
        for item, limit in (("q-delay", 10), ("q-rate", 20)):
            mine = [r for r in records if r["item"] == item]
            assert sorted(r["n"] for r in mine) == [0, 1, 2, 3, 4]  # each once
            check_rate(mine, limit, 1.0)
        settled(cenv, rabbit)

    def test_a_debounce_runs_once_with_the_latest_arguments(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, qworker: Worker
    ) -> None:
        out = produce(
            qworker,
            """
            import time
            sent = time.time()
            results = [m.debounced.apply_async(("q-debounce", f"v{n}")) for n in range(3)]
            out = [results[0].get(timeout=30), sent]
            """,
        )
        assert out[0] == "v2"
        ran = [r for r in runs(cenv) if r["item"] == "q-debounce"]
        assert [r["version"] for r in ran] == ["v2"]
        assert ran[0]["start"] >= out[1] + 0.5  # at or after its window's end
        settled(cenv, rabbit)

    def test_a_replaced_call_runs_once_with_the_latest_arguments(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, qworker: Worker
    ) -> None:
        # lock="until_executing" with replace: a pending call waits (requeued with a
        # sub-second backoff) behind the running one and takes the latest arguments.
        out = produce(
            qworker,
            """
            import time
            running = m.latest.apply_async(("q-latest", "v0", 1.0))
            time.sleep(0.4)
            pending = [m.latest.apply_async(("q-latest", f"v{n}")) for n in range(1, 4)]
            out = [running.get(timeout=30), pending[-1].get(timeout=30)]
            """,
        )
        assert out == ["v0", "v3"]
        ran = [r for r in runs(cenv) if r["item"] == "q-latest"]
        assert [r["version"] for r in ran] == ["v0", "v3"]
        settled(cenv, rabbit)

    def test_a_call_past_max_pending_waits_for_its_slot(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, qworker: Worker
    ) -> None:
        # capped_soon: 1/4s, on_limited="delay", max_pending=3.
        out = produce(
            qworker,
            """
            results = [m.capped_soon.apply_async(("q-capped", n)) for n in range(2)]
            out = [r.get(timeout=30) for r in results]
            """,
        )
        assert out == [0, 1]
        mine = [r for r in rated_runs(cenv) if r["item"] == "q-capped"]
        check_rate(mine, 1, 4.0)
        settled(cenv, rabbit)

    def test_a_failed_run_reopens_its_key_for_the_next_call(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer, qworker: Worker
    ) -> None:
        out = produce(
            qworker,
            """
            failed = m.reopened.apply_async(("q-reopen", 0, "fail"))
            try:
                failed.get(timeout=30)
            except ValueError:
                pass
            out = m.reopened.apply_async(("q-reopen", 0)).get(timeout=30)
            """,
        )
        assert out == "q-reopen"
        assert len([r for r in runs(cenv) if r["item"] == "q-reopen"]) == 2

    def test_a_countdown_longer_than_the_consumer_timeout_goes_in_hops(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer
    ) -> None:
        # consumer_timeout=2: a 2.5 s countdown is sent on in hops of at most 1 s (the
        # last one a fraction of a second, made a whole one).
        worker = Worker(_env(cenv, rabbit, CSL_CONSUMER_TIMEOUT="2")).start()
        try:
            out = produce(
                worker,
                """
                import time
                sent = time.time()
                out = [m.work.apply_async(("q-hops", 0), countdown=2.5).get(timeout=30), sent]
                """,
            )
            assert out[0] == "q-hops"
            ran = [r for r in runs(cenv) if r["item"] == "q-hops"]
            assert len(ran) == 1
            assert ran[0]["start"] >= out[1] + 2.5
            assert "more for its eta: sent 1.0s on" in worker.output()
            settled(cenv, rabbit)
        finally:
            worker.stop()


class TestWhatCeleryRefuses:
    @pytest.mark.parametrize(
        ("options", "error"),
        [
            ({"countdown": float("inf")}, OverflowError),
            ({"countdown": 1e12}, OverflowError),
            ({"countdown": 0.5}, ValueError),  # below the delay exchanges' second
            ({"countdown": float("nan")}, ValueError),
            ({"expires": float("inf")}, OverflowError),
        ],
        ids=["inf", "1e12", "half-a-second", "nan", "expires-inf"],
    )
    def test_is_refused_the_same_way_with_nothing_left(
        self,
        cenv: CeleryEnv,
        rabbit: RabbitMQServer,
        qworker: Worker,
        options: dict[str, float],
        error: type[Exception],
    ) -> None:
        out = produce(
            qworker,
            f"""
            inf, nan = float("inf"), float("nan")
            out = []
            for task in (m.plain, m.work, m.delayed, m.capped_delayed):
                try:
                    task.apply_async(("q-refused",), **{options!r})
                    out.append("published")
                except Exception as error:
                    out.append(type(error).__name__)
            """,
        )
        assert out == [error.__name__] * 4  # plain Celery's, then each of ours
        assert queued(rabbit, qworker.queue) == 0
        assert cenv.lock_client().keys("*") == []  # no hold, place or slot

    def test_an_eta_within_a_second_is_refused_as_plain_celery_refuses_it(
        self, cenv: CeleryEnv, qworker: Worker
    ) -> None:
        out = produce(
            qworker,
            """
            from datetime import datetime, timedelta, timezone
            out = []
            for task in (m.plain, m.work):
                eta = datetime.now(timezone.utc) + timedelta(seconds=0.5)
                try:
                    task.apply_async(("q-eta",), eta=eta)
                    out.append("published")
                except Exception as error:
                    out.append(type(error).__name__)
            """,
        )
        assert out == ["ValueError", "ValueError"]
        assert cenv.lock_client().keys("*") == []


class TestDeliveryLimits:
    def test_requeues_never_count_against_a_quorum_queues_delivery_limit(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer
    ) -> None:
        # x-delivery-limit=1 (RabbitMQ 4 sets 20): a copy requeued several times while its
        # key is held is a new message each time, delivered once: it is never dropped.
        worker = Worker(_env(cenv, rabbit, CSL_DELIVERY_LIMIT="1")).start()
        try:
            out = produce(
                worker,
                """
                import time
                first = m.work.apply_async(("q-limit", 3.5))
                time.sleep(0.3)
                copy = m.app.send_task(m.work.name, ("q-limit", 0))
                out = [first.get(timeout=30), copy.get(timeout=30)]
                """,
            )
            assert out == ["q-limit", "q-limit"]
            assert worker.output().count("requeued in") >= 2
            assert len([r for r in runs(cenv) if r["item"] == "q-limit"]) == 2
            settled(cenv, rabbit)
        finally:
            worker.stop()


class TestAFanoutExchange:
    def test_a_requeued_copy_runs_after_its_holder(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer
    ) -> None:
        # The other exchange type Celery delays natively on quorum queues.
        worker = Worker(_env(cenv, rabbit, CSL_EXCHANGE_TYPE="fanout")).start()
        try:
            out = produce(
                worker,
                """
                import time
                first = m.work.apply_async(("q-fanout", 1.0))
                time.sleep(0.3)
                copy = m.app.send_task(m.work.name, ("q-fanout", 0))
                out = [first.get(timeout=30), copy.get(timeout=30)]
                """,
            )
            assert out == ["q-fanout", "q-fanout"]
            ran = [r for r in runs(cenv) if r["item"] == "q-fanout"]
            assert len(ran) == 2
            assert ran[1]["start"] >= ran[0]["end"]
            assert "requeued in" in worker.output()
            assert "direct exchange" not in worker.output()
            settled(cenv, rabbit)
        finally:
            worker.stop()


class TestADirectExchange:
    def test_the_worker_says_at_start_that_countdowns_wait_in_it(
        self, cenv: CeleryEnv, rabbit: RabbitMQServer
    ) -> None:
        worker = Worker(_env(cenv, rabbit, CSL_EXCHANGE_TYPE="direct")).start()
        try:
            out = produce(
                worker,
                """
                first = m.work.apply_async(("q-direct", 1.0))
                import time
                time.sleep(0.3)
                copy = m.app.send_task(m.work.name, ("q-direct", 0))
                out = [first.get(timeout=30), copy.get(timeout=30)]
                """,
            )
            assert out == ["q-direct", "q-direct"]
            log = worker.output()
            assert f"the quorum queue {worker.queue!r} is bound to the direct exchange" in log
            assert "task_default_exchange_type='topic'" in log
        finally:
            worker.stop()
