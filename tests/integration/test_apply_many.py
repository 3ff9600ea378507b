"""``apply_many``: a batch's holds decided in one script call and its messages published in one
pipeline, against real Redis servers; its messages run once each by a real worker."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import EncodeError
from kombu.messaging import Producer

from celery_singleton_lock import LockStoreUnavailableError, singleton_task
from celery_singleton_lock.broker.transit import Transit
from celery_singleton_lock.tokens import TOKEN_HEADER

from ..conftest import CeleryEnv
from ..support.apps import lock_url
from ..support.runs import lock_keys, runs, wait_for
from ..support.servers import RedisServer, free_port
from ..support.workers import Worker

QUEUE = "apply-many"
BATCHES = hasattr(Producer, "batch")  # kombu >= 5.7: one pipeline for a batch's messages


@pytest.fixture(name="queue")
def fixture_queue(cenv: CeleryEnv) -> Iterator[redis.Redis]:
    broker = cenv.broker.client()
    broker.delete(QUEUE)
    yield broker
    broker.delete(QUEUE)


def queued(broker: redis.Redis) -> list[dict[str, Any]]:
    """The messages waiting in the test's queue, oldest first."""
    return [json.loads(raw) for raw in reversed(broker.lrange(QUEUE, 0, -1))]


def args_of(message: dict[str, Any]) -> Any:
    """A message's positional arguments (kombu's Redis body is base64 of Celery's)."""
    return json.loads(base64.b64decode(message["body"]))[0]


def calls(raw: redis.Redis, command: str) -> int:
    return int(raw.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def holder(cenv: CeleryEnv, item: str) -> str | None:
    """The task id holding ``work``'s key of ``item`` (None: free)."""
    work = cenv.app_module.work
    name = work.singleton_options().key.derive((item,), {})
    token = cenv.lock_client().get(f"t:{{{name}}}")
    return None if token is None else token.decode().rsplit("|", 1)[-1]


class PipelineCount:
    """The non-transactional pipelines redis-py sends meanwhile: the commands of each."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[list[str]] = []
        execute = redis.client.Pipeline.execute
        count = self

        def counted(self: redis.client.Pipeline, *args: Any, **kwargs: Any) -> Any:
            count.sent.append([str(command[0][0]).upper() for command in self.command_stack])
            return execute(self, *args, **kwargs)

        monkeypatch.setattr(redis.client.Pipeline, "execute", counted)

    def pushing(self) -> list[list[str]]:
        """The pipelines that pushed messages: kombu's LPUSH, or the noted push's script."""
        return [c for c in self.sent if "LPUSH" in c or "EVALSHA" in c]


class TestABatch:
    def test_results_in_order_one_message_per_key(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        results = work.apply_many([(f"k{i % 10}",) for i in range(100)], queue=QUEUE)
        firsts = [result.id for result in results[:10]]
        assert len(set(firsts)) == 10
        assert [result.id for result in results] == firsts * 10
        messages = queued(queue)
        assert [m["headers"]["id"] for m in messages] == firsts
        assert [args_of(m) for m in messages] == [[f"k{i}"] for i in range(10)]
        assert [holder(cenv, f"k{i}") for i in range(10)] == firsts

    def test_a_held_key_answers_with_its_holder(self, cenv: CeleryEnv, queue: redis.Redis) -> None:
        work = cenv.app_module.work
        held = work.apply_async(("h1",), queue=QUEUE)
        results = work.apply_many([("h1",), ("h2",), ("h1",), ("h2",)], queue=QUEUE)
        assert results[0].id == results[2].id == held.id
        assert results[1].id == results[3].id != held.id
        assert [m["headers"]["id"] for m in queued(queue)] == [held.id, results[1].id]

    @pytest.mark.skipif(not BATCHES, reason="kombu < 5.7 publishes one message after the other")
    def test_the_messages_go_out_in_one_pipeline(
        self, cenv: CeleryEnv, queue: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        work = cenv.app_module.work
        work.apply_many([("warm",)], queue=QUEUE)  # the producer's connection, made once
        pipelines = PipelineCount(monkeypatch)
        work.apply_many([(f"p{i % 20}",) for i in range(60)], queue=QUEUE)
        [pushed] = pipelines.pushing()
        assert pushed.count("LPUSH") + pushed.count("EVALSHA") == 20
        assert len(queued(queue)) == 21

    @pytest.mark.skipif(not BATCHES, reason="kombu < 5.7 publishes one message after the other")
    def test_the_messages_are_noted_in_transit_until_received(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        app = cenv.app_module.app
        if not app.conf.singleton_lock_ride_broker or app.conf.get("broker_transport"):
            pytest.skip("messages are noted in transit by the library's own transport only")
        notes = Transit(queue, "t")
        before = notes.noted()
        work = cenv.app_module.work
        work.apply_many([(f"n{i % 4}",) for i in range(12)], queue=QUEUE)
        assert notes.noted() == before + 4  # swept and pushed again if lost before received
        assert len(queued(queue)) == 4


class TestRoundTrips:
    def test_a_batch_s_holds_are_one_script_call_on_the_lock_server(
        self, cenv: CeleryEnv, queue: redis.Redis, raw: redis.Redis, redis_server: RedisServer
    ) -> None:
        work = cenv.app_module.work
        with lock_url(cenv, redis_server.url):
            work.apply_many([("warm",)], queue=QUEUE)  # the script loaded, the pool filled
            raw.config_resetstat()
            results = work.apply_many([(f"r{i % 50}",) for i in range(500)], queue=QUEUE)
            assert calls(raw, "evalsha") == 1
            assert calls(raw, "eval") == 0
            assert calls(raw, "set") == 50  # inside the one script: a hold per distinct key
            raw.config_resetstat()
            again = work.apply_many([(f"r{i % 50}",) for i in range(500)], queue=QUEUE)
            assert calls(raw, "evalsha") == 1  # every one refused, in the one script
            assert [r.id for r in again] == [r.id for r in results]
        assert len(queued(queue)) == 51


class TestFailures:
    def test_a_message_that_fails_to_publish_gives_back_the_holds_of_unsent_messages(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        items = [work.s(f"f{i}") for i in range(4)]
        items[2] = work.s("f2", object())  # held (its key is the item), then not encodable
        with pytest.raises(EncodeError):
            work.apply_many(items, queue=QUEUE)
        sent = {m["headers"]["id"] for m in queued(queue)}
        if BATCHES:
            assert sent == set()  # nothing leaves a pipeline before every message is built
        for i in range(4):
            owner = holder(cenv, f"f{i}")
            assert owner is None or owner in sent  # no hold without its message
        results = work.apply_many([(f"f{i}",) for i in range(4)], queue=QUEUE)
        assert len(queued(queue)) == 4
        assert all(holder(cenv, f"f{i}") == results[i].id for i in range(4))

    def test_one_publish_after_the_other_gives_back_only_the_unsent(
        self, cenv: CeleryEnv, queue: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Where kombu cannot batch (an older kombu, another transport) the messages go one
        after the other: those sent keep their holds, the others give theirs back."""
        monkeypatch.setattr(Producer, "supports_batch_publish", False, raising=False)
        work = cenv.app_module.work
        items = [work.s(f"g{i}") for i in range(4)]
        items[2] = work.s("g2", object())
        with pytest.raises(EncodeError):
            work.apply_many(items, queue=QUEUE)
        messages = queued(queue)
        assert len(messages) == 2
        assert [holder(cenv, f"g{i}") for i in range(2)] == [m["headers"]["id"] for m in messages]
        assert holder(cenv, "g2") is None
        assert holder(cenv, "g3") is None


@pytest.fixture(name="dead_lock_app")
def fixture_dead_lock_app(cenv: CeleryEnv) -> Celery:
    """An app whose lock store is at a port nobody listens on."""
    app = Celery("many-dead", set_as_current=False)
    app.conf.update(
        broker_url=cenv.broker.url,
        result_backend=cenv.broker.url,
        singleton_lock_url=f"redis://127.0.0.1:{free_port()}/0",
    )
    return app


class TestAnOutage:
    def test_fail_closed_raises_and_sends_nothing(
        self, dead_lock_app: Celery, queue: redis.Redis
    ) -> None:
        @singleton_task(app=dead_lock_app, name="many.closed")
        def job(x: int) -> int:
            return x

        with pytest.raises(LockStoreUnavailableError, match="nothing was published"):
            job.apply_many([(1,), (2,)], queue=QUEUE)
        assert queued(queue) == []

    def test_fail_open_sends_one_message_per_key_without_a_hold(
        self, dead_lock_app: Celery, queue: redis.Redis, caplog: pytest.LogCaptureFixture
    ) -> None:
        dead_lock_app.conf.singleton_lock_on_redis_error = "fail_open"

        @singleton_task(app=dead_lock_app, name="many.open")
        def job(x: int) -> int:
            return x

        with caplog.at_level(logging.WARNING, logger="celery_singleton_lock"):
            results = job.apply_many([(1,), (2,), (1,)], queue=QUEUE)
        assert results[2].id == results[0].id != results[1].id
        messages = queued(queue)
        assert [m["headers"]["id"] for m in messages] == [results[0].id, results[1].id]
        assert all(TOKEN_HEADER not in m["headers"] for m in messages)
        assert "without the duplicate check (fail_open)" in caplog.text


class TestOnAWorker:
    def test_the_messages_reach_a_worker_and_run_once_each(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work = cenv.app_module.work
        items = [(f"w{i % 5}",) for i in range(40)]
        results = work.apply_many(items, queue=worker.queue)
        assert [result.get(timeout=20) for result in results] == [item[0] for item in items]
        wait_for(lambda: not lock_keys(cenv), 5, "every key released")
        assert sorted(run["item"] for run in runs(cenv)) == [f"w{i}" for i in range(5)]
