"""What the broker ride (``celery_singleton_lock/broker/``) relies on in kombu and Celery,
pinned on the installed releases: the signature of every member it overrides or calls,
kombu's queue naming per priority, the commands and value shape of kombu's unacked
bookkeeping, Celery's result write, and the hooks that install it per app. A release
that changes one fails here, before anything is lost; ``broker/versions.py`` then keeps
its range below that release until the ride is adapted.

Where a contract is about what kombu's or Celery's own code does, that code is run on a
stand-in that records the commands it sends (no server: the shape is the contract).
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import celery
import celery.backends.asynchronous
import celery.result
import pytest
from celery import Celery
from celery.app import backends
from celery.app.amqp import AMQP
from celery.backends import redis as celery_redis
from kombu.connection import Connection, ConnectionPool
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import base as virtual
from packaging.version import Version

from celery_singleton_lock.broker import layout, versions
from celery_singleton_lock.broker.results import RedisBackend, SentinelBackend
from celery_singleton_lock.broker.transport import (
    TRANSPORT,
    Channel,
    RedisTransport,
    SentinelChannel,
)
from celery_singleton_lock.broker.unacked import QoS
from tests.support.servers import RedisServer

# Celery 5.4 passes a result's own expiry on to the write; 5.3 does not.
EXPIRES = ["expires"] if Version(celery.__version__) >= Version("5.4") else []


def parameters(member: object) -> list[str]:
    return list(inspect.signature(member).parameters)  # type: ignore[arg-type]


class Recorder:
    """A Redis client or pipeline that records the commands sent to it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, command: str) -> Any:
        def send(*args: Any, **kwargs: Any) -> Recorder:
            self.sent.append((command, args))
            return self

        return send

    def pipeline(self) -> Recorder:
        return self

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class TestOverriddenMembers:
    """Each member the ride overrides, with the parameters its override passes on."""

    @pytest.mark.parametrize(
        ("owner", "member", "expected"),
        [
            (kombu_redis.Channel, "_put", ["self", "queue", "message", "kwargs"]),
            (
                kombu_redis.Channel,
                "_put_fanout",
                ["self", "exchange", "message", "routing_key", "kwargs"],
            ),
            (kombu_redis.Channel, "_purge", ["self", "queue"]),
            (kombu_redis.Channel, "_q_for_pri", ["self", "queue", "pri"]),
            (kombu_redis.Channel, "_get_message_priority", ["self", "message", "reverse"]),
            (kombu_redis.Channel, "conn_or_acquire", ["self", "client"]),
            (kombu_redis.Channel, "_create_client", ["self", "asynchronous"]),
            (kombu_redis.QoS, "append", ["self", "message", "delivery_tag"]),
            (kombu_redis.QoS, "pipe_or_acquire", ["self", "pipe", "client"]),
            (kombu_redis.QoS, "restore_visible", ["self", "start", "num", "interval"]),
            (celery_redis.RedisBackend, "set", ["self", "key", "value", *EXPIRES, "retry_policy"]),
            (celery_redis.RedisBackend, "_set", ["self", "key", "value", *EXPIRES]),
            (celery_redis.RedisBackend, "get_key_for_task", ["self", "task_id", "key"]),
            (
                celery_redis.RedisBackend,
                "_store_result",
                ["self", "task_id", "result", "state", "traceback", "request", "kwargs"],
            ),
            (
                celery_redis.RedisBackend,
                "_get_result_meta",
                ["self", "result", "state", "traceback", "request", "format_date", "encode"],
            ),
            (celery_redis.RedisBackend, "_set_with_state", ["self", "key", "value", "state"]),
            (celery_redis.RedisBackend, "_get_task_meta_for", ["self", "task_id"]),
            (celery_redis.RedisBackend, "on_task_call", ["self", "producer", "task_id"]),
            (Connection, "get_transport_cls", ["self"]),
            (Connection, "info", ["self"]),
            (Connection, "Pool", ["self", "limit", "kwargs"]),
            (ConnectionPool, "new", ["self"]),
            (backends, "by_name", ["backend", "loader", "extension_namespace"]),
        ],
    )
    def test_the_signature_is_the_one_the_ride_was_written_for(
        self, owner: object, member: str, expected: list[str]
    ) -> None:
        assert parameters(getattr(owner, member)) == expected

    def test_the_classes_are_kombu_s_and_celery_s_with_ours_in_their_place(self) -> None:
        assert issubclass(Channel, kombu_redis.Channel)
        assert issubclass(SentinelChannel, kombu_redis.SentinelChannel)
        assert issubclass(RedisTransport, kombu_redis.Transport)
        assert issubclass(QoS, kombu_redis.QoS)
        assert Channel.QoS is QoS  # kombu builds a channel's qos from this attribute
        assert issubclass(RedisBackend, celery_redis.RedisBackend)
        assert issubclass(SentinelBackend, celery_redis.SentinelBackend)

    def test_a_channel_s_client_is_built_on_its_pool(self, redis_server: RedisServer) -> None:
        """``Channel.conn_or_acquire`` keeps one client while the channel's pool is the
        one it was built on, and builds kombu's own again for a new pool."""
        connection = Connection(redis_server.url, transport=TRANSPORT)
        try:
            channel = connection.default_channel
            assert isinstance(channel, Channel)
            with channel.conn_or_acquire() as first, channel.conn_or_acquire() as again:
                assert first is again
                assert isinstance(first, channel.Client)
                assert first.connection_pool is channel.pool
            given = object()
            with channel.conn_or_acquire(given) as client:  # type: ignore[arg-type]
                assert client is given
            channel._pool = None
            with channel.conn_or_acquire() as fresh:
                assert fresh is not first
                assert fresh.connection_pool is channel.pool
        finally:
            connection.release()

    def test_an_app_s_connections_come_from_its_amqp_connection_class(self) -> None:
        assert AMQP.Connection is Connection
        app = Celery("contract", set_as_current=False, broker="redis://127.0.0.1:1/0")
        marker = type("Marked", (Connection,), {})
        app.amqp.Connection = marker
        with app.connection_for_write() as connection:
            assert type(connection) is marker

    def test_pools_and_clones_keep_the_transport_a_connection_names(self) -> None:
        connection = Connection("redis://127.0.0.1:1/0", transport=TRANSPORT)
        assert connection.clone().get_transport_cls() is RedisTransport
        pooled = connection.Pool(limit=1).acquire()
        try:
            assert pooled.get_transport_cls() is RedisTransport
        finally:
            pooled.release()

    def test_the_loader_s_backend_aliases_override_celery_s(self) -> None:
        loader = SimpleNamespace(
            override_backends={"redis": "celery_singleton_lock.broker:RedisBackend"}
        )
        found = backends.by_name("redis", loader)
        assert found is RedisBackend


class TestQueueNaming:
    """kombu's Redis queue names per priority: the lists a push (and a purge, and the
    transit sweep) writes must be the lists kombu's BRPOP reads."""

    def test_kombu_s_steps_and_separator(self) -> None:
        assert kombu_redis.Channel.priority_steps == [0, 3, 6, 9]
        assert kombu_redis.Channel.sep == "\x06\x16"
        assert kombu_redis.Channel.unacked_key == "unacked"
        assert kombu_redis.Channel.keyprefix_queue == "_kombu.binding.%s"

    @pytest.mark.parametrize(
        ("priority", "name"),
        [
            (0, "q"),
            (2, "q"),
            (3, "q\x06\x163"),
            (5, "q\x06\x163"),
            (6, "q\x06\x166"),
            (9, "q\x06\x169"),
        ],
    )
    def test_each_priority_names_its_list(self, priority: int, name: str) -> None:
        channel = SimpleNamespace(priority_steps=[0, 3, 6, 9], sep="\x06\x16")
        channel.priority = lambda n: kombu_redis.Channel.priority(channel, n)
        assert kombu_redis.Channel._q_for_pri(channel, "q", priority) == name

    def test_the_liveness_check_reads_the_lists_kombu_pops(self) -> None:
        channel = SimpleNamespace(
            priority_steps=[0, 3, 6, 9], sep="\x06\x16", global_keyprefix="pre:"
        )
        channel.priority = lambda n: kombu_redis.Channel.priority(channel, n)
        kombus = [
            "pre:" + kombu_redis.Channel._q_for_pri(channel, "q", step)
            for step in channel.priority_steps
        ]
        assert layout.queue_lists(channel, "q") == kombus

    def test_a_message_s_priority_is_read_from_its_properties(self) -> None:
        channel = SimpleNamespace(max_priority=9, min_priority=0, default_priority=0)
        message = {"properties": {"priority": 6}}
        assert virtual.Channel._get_message_priority(channel, message) == 6
        assert virtual.Channel._get_message_priority(channel, {"properties": {}}) == 0


class RecordedQoS(kombu_redis.QoS):
    """kombu's own QoS (its append, ack and reject) on a pipeline that records."""

    def __init__(self, recorder: Recorder) -> None:
        self._dirty: set[str] = set()
        self._delivered: dict[str, object] = {}
        self._quick_append = self._delivered.__setitem__
        self._quick_ack = self._delivered.pop
        self.unacked_key, self.unacked_index_key = "unacked", "unacked_index"
        self.recorder = recorder

    @contextmanager
    def pipe_or_acquire(self, pipe: object = None, client: object = None) -> Iterator[Recorder]:
        yield self.recorder


class TestUnackedBookkeeping:
    def test_append_records_the_tag_in_one_pipeline_with_the_raw_message(self) -> None:
        recorded = Recorder()
        qos = RecordedQoS(recorded)
        message = SimpleNamespace(
            delivery_info={"exchange": "ex", "routing_key": "rk"}, _raw={"body": "b"}
        )
        qos.append(message, "tag-1")
        commands = [command for command, _ in recorded.sent]
        assert commands == ["zadd", "hset", "execute"]  # our riders go before these
        (index, scores), (unacked, tag, value) = recorded.sent[0][1], recorded.sent[1][1]
        assert (index, list(scores), unacked, tag) == (
            "unacked_index",
            ["tag-1"],
            "unacked",
            "tag-1",
        )
        # The value the transit sweep and the liveness check read: [message, exchange, key].
        assert json.loads(value) == [{"body": "b"}, "ex", "rk"]
        # The shape ``broker.bookkeeping`` writes as one script: one tag, scored by time.
        assert isinstance(scores["tag-1"], float)
        assert recorded.sent[0][1] == (index, scores)
        assert len(recorded.sent[1][1]) == 3

    @pytest.mark.parametrize("step", ["ack", "reject"])
    def test_an_acked_or_rejected_message_is_removed_as_zrem_then_hdel(self, step: str) -> None:
        # ``broker.bookkeeping`` writes exactly this shape as an HDEL and a ZREM.
        recorded = Recorder()
        qos = RecordedQoS(recorded)
        qos.append(
            SimpleNamespace(delivery_info={"exchange": "", "routing_key": ""}, _raw={}), "tag-1"
        )
        recorded.sent.clear()
        getattr(qos, step)("tag-1")
        assert recorded.sent == [
            ("zrem", ("unacked_index", "tag-1")),
            ("hdel", ("unacked", "tag-1")),
            ("execute", ()),
        ]


def code_of_text(text: str) -> str:
    """Python source as its code alone: no docstring, comments or layout."""
    tree = ast.parse(textwrap.dedent(text))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.FunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:]
    return ast.unparse(tree)


def code_of(function: object) -> str:
    return code_of_text(inspect.getsource(function))  # type: ignore[arg-type]


class TestResultWrite:
    @pytest.mark.parametrize(
        ("expires", "commands"),
        [(60, ["setex", "publish", "execute"]), (None, ["set", "publish", "execute"])],
    )
    def test_celery_stores_a_result_as_set_then_publish_in_one_pipeline(
        self, expires: int | None, commands: list[str]
    ) -> None:
        client = Recorder()
        backend = SimpleNamespace(client=client, expires=None)
        backend.expires = expires  # 5.3 reads the backend's; 5.4 takes it as an argument
        celery_redis.RedisBackend._set(
            backend, "celery-task-meta-1", "v", *[expires][: len(EXPIRES)]
        )
        assert [command for command, _ in client.sent] == commands

    def test_celery_reads_a_stored_result_first_and_leaves_a_success(self) -> None:
        # ``broker.results.RedisBackend._store_result`` is this, with the read in the
        # write's own step (broker/lua/store_result.lua): any change here, checked again.
        assert code_of(celery_redis.RedisBackend._store_result) == code_of_text(
            """
            def _store_result(self, task_id, result, state,
                              traceback=None, request=None, **kwargs):
                meta = self._get_result_meta(result=result, state=state,
                                             traceback=traceback, request=request)
                meta['task_id'] = bytes_to_str(task_id)
                current_meta = self._get_task_meta_for(task_id)
                if current_meta['status'] == states.SUCCESS:
                    return result
                try:
                    self._set_with_state(self.get_key_for_task(task_id), self.encode(meta), state)
                except BackendStoreError as ex:
                    raise BackendStoreError(str(ex), state=state, task_id=task_id) from ex
                return result
            """
        )
        # What our fallback reads with, and what the script mirrors: a missing value is
        # PENDING, any other is decoded whole.
        assert code_of(celery_redis.RedisBackend._get_task_meta_for) == code_of_text(
            """
            def _get_task_meta_for(self, task_id):
                meta = self.get(self.get_key_for_task(task_id))
                if not meta:
                    return {'status': states.PENDING, 'result': None}
                return self.decode_result(meta)
            """
        )

    def test_set_hands_the_write_to_ensure(self) -> None:
        source = inspect.getsource(celery_redis.RedisBackend.set)
        assert f"self.ensure(self._set, (key, value{', expires' if EXPIRES else ''})" in source


class TestResultWaits:
    """``RedisBackend.on_task_call`` subscribes to nothing: every way to wait for a result
    must subscribe first and then read what is stored, or a result written in between
    would be missed."""

    def test_get_and_then_subscribe_before_they_wait(self) -> None:
        get = inspect.getsource(celery.result.AsyncResult.get)
        assert get.index("self.backend.add_pending_result(self)") < get.index("wait_for_pending(")
        assert "self.backend.add_pending_result(self" in inspect.getsource(
            celery.result.AsyncResult.then
        )

    def test_a_wait_reads_the_stored_result_before_draining(self) -> None:
        wait = inspect.getsource(celery.backends.asynchronous.BaseResultConsumer._wait_for_pending)
        assert wait.index("self.on_wait_for_pending(result") < wait.index("drain_events_until(")
        read = inspect.getsource(celery_redis.ResultConsumer.on_wait_for_pending)
        assert "result._iter_meta(" in read

    def test_celery_subscribes_as_it_sends_and_ours_does_not(self) -> None:
        assert "self.backend.on_task_call(P, task_id)" in inspect.getsource(Celery.send_task)
        assert RedisBackend.on_task_call(SimpleNamespace(), None, "an-id") == {}


class TestTestedReleases:
    def test_the_installed_releases_are_inside_the_range(self) -> None:
        assert versions.outside() is None

    def test_a_release_outside_says_which_and_what_to_do(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(versions, "installed", lambda package: "5.99.0")
        reason = versions.outside()
        assert reason is not None
        assert "kombu 5.99.0 is outside" in reason
        assert "kombu >= 5.3, < 5.8" in reason
        assert "Install a tested release" in reason

    @pytest.mark.parametrize(
        ("release", "inside"),
        [("5.3.0", True), ("5.7.9", True), ("5.7.0rc1", True), ("5.8.0rc1", False),
         ("5.8.0", False), ("5.2.9", False), ("6.0.0", False), ("", False)],
    )  # fmt: skip
    def test_the_range_counts_by_minor_release(
        self, monkeypatch: pytest.MonkeyPatch, release: str, inside: bool
    ) -> None:
        monkeypatch.setattr(versions, "installed", lambda package: release)
        assert (versions.outside() is None) is inside
