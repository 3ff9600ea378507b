"""kombu's unacked bookkeeping on a riding channel, one command a step: a received message is
recorded as kombu records it and removed as kombu removes it once acked; a server that lost
its scripts, a broker user that may not run them, and a kombu that chains its bookkeeping
otherwise all get kombu's own transaction, and nothing is lost."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import redis
from celery import Celery

from celery_singleton_lock import broker, singleton_task
from celery_singleton_lock.broker.bookkeeping import (
    RECORD,
    RECORD_NOTED_KEYS,
    RECORD_SHA,
    Bookkeeping,
    Keys,
)
from celery_singleton_lock.broker.transit import NOTE_KEYS
from celery_singleton_lock.lease.redis.pipelining import Pipelining

from ..support.servers import RedisServer


def echo(x: object = None) -> object:
    return x


@pytest.fixture(name="server")
def fixture_server(shared: RedisServer) -> RedisServer:
    return shared  # the module's own (tests/integration/conftest.py)


def riding_app(url: str, name: str) -> Celery:
    app = Celery(name, set_as_current=False)
    app.conf.update(broker_url=url, result_backend=url, singleton_lock_url=url)
    singleton_task(app=app, name=f"{name}.job", shared=False)(echo)  # installs the ride
    return app


@pytest.fixture(name="app")
def fixture_app(server: RedisServer) -> Iterator[Celery]:
    server.client().flushall()
    app = riding_app(server.url, "bookkeeping")
    try:
        yield app
    finally:
        app.close()


def received(connection: Any, queue: str, body: str) -> Any:
    """``body`` published to ``queue`` and received again, unacked (kombu's ``basic_get``
    records it as its consumer does)."""
    channel = connection.default_channel
    channel.basic_publish(channel.prepare_message(body), exchange="", routing_key=queue)
    message = channel.basic_get(queue)
    assert message is not None
    return message


def recorded(client: redis.Redis, tag: str) -> tuple[Any, float | None]:
    value = client.hget("unacked", tag)
    return (None if value is None else json.loads(value)), client.zscore("unacked_index", tag)


def transactions(client: redis.Redis) -> int:
    """MULTIs the server ran since its statistics were reset."""
    return int(client.info("commandstats").get("cmdstat_multi", {}).get("calls", 0))


class TestRecord:
    def test_a_received_message_is_recorded_and_removed_in_a_command_a_step(
        self, app: Celery, server: RedisServer
    ) -> None:
        client = server.client()
        with app.connection_for_write() as ours, kombu.Connection(server.url) as theirs:
            client.config_resetstat()
            message = received(ours, "q-ours", "hello")
            ours.default_channel.basic_ack(message.delivery_tag)
            assert transactions(client) == 0
            assert client.info("commandstats")["cmdstat_evalsha"]["calls"] >= 1
            message = received(theirs, "q-kombu", "hello")
            theirs.default_channel.basic_ack(message.delivery_tag)
            assert transactions(client) == 2  # kombu's: one to record, one to remove

    def test_a_received_message_is_recorded_as_kombu_records_it(
        self, app: Celery, server: RedisServer
    ) -> None:
        client = server.client()
        with app.connection_for_write() as ours, kombu.Connection(server.url) as theirs:
            assert type(ours.default_channel).__module__ == "celery_singleton_lock.broker.transport"
            assert type(theirs.default_channel).__module__ == "kombu.transport.redis"
            mine = received(ours, "q-ours", "hello")
            kombus = received(theirs, "q-kombu", "hello")
            (value, score), (kombu_value, kombu_score) = (
                recorded(client, mine.delivery_tag),
                recorded(client, kombus.delivery_tag),
            )
            assert value is not None
            assert kombu_value is not None
            assert score is not None
            assert kombu_score is not None
            assert abs(score - kombu_score) < 5  # both the time of receipt
            # The same layout: [message, exchange, routing key], the message as it came.
            for field in ("body", "content-type", "content-encoding"):
                assert value[0][field] == kombu_value[0][field]
            assert value[0]["properties"]["delivery_tag"] == mine.delivery_tag
            assert value[1:] == ["", "q-ours"]  # the exchange and the routing key
            assert kombu_value[1:] == ["", "q-kombu"]
            ours.default_channel.basic_ack(mine.delivery_tag)
            theirs.default_channel.basic_ack(kombus.delivery_tag)
        assert recorded(client, mine.delivery_tag) == (None, None)
        assert client.hlen("unacked") == client.zcard("unacked_index") == 0

    def test_under_a_global_key_prefix_it_is_recorded_where_kombu_reads(
        self, server: RedisServer
    ) -> None:
        client = server.client()
        client.flushall()
        app = riding_app(server.url, "prefixed")
        app.conf.broker_transport_options = {"global_keyprefix": "pfx:"}
        try:
            with app.connection_for_write() as connection:
                client.config_resetstat()
                message = received(connection, "q-prefixed", "hello")
                assert client.hexists("pfx:unacked", message.delivery_tag)
                assert client.zscore("pfx:unacked_index", message.delivery_tag) is not None
                assert client.exists("unacked", "unacked_index") == 0
                connection.default_channel.basic_ack(message.delivery_tag)
            assert client.exists("pfx:unacked", "pfx:unacked_index") == 0
            assert transactions(client) == 0  # our commands, with kombu's prefix
        finally:
            app.close()

    def test_a_message_recorded_and_restored_is_delivered_again(
        self, app: Celery, server: RedisServer
    ) -> None:
        """What the script recorded is what kombu restores (a worker that stops with it
        unacked: ``restore_unacked``)."""
        with app.connection_for_write() as connection:
            message = received(connection, "q-restore", "again")
            connection.default_channel.qos.restore_unacked()
            again = connection.default_channel.basic_get("q-restore")
            assert again is not None
            assert again.body == message.body
            connection.default_channel.basic_ack(again.delivery_tag)
        assert server.client().hlen("unacked") == 0

    def test_a_message_unacked_past_its_visibility_timeout_is_delivered_again(
        self, server: RedisServer
    ) -> None:
        """kombu's other reader of the record: ``restore_visible`` finds it by the index's
        score (its time of receipt) and restores it from the hash."""
        server.client().flushall()
        app = riding_app(server.url, "visible")
        app.conf.broker_transport_options = {"visibility_timeout": 0}  # every one is late
        try:
            with app.connection_for_write() as connection:
                channel = connection.default_channel
                message = received(connection, "q-visible", "late")
                channel.qos.restore_visible(interval=1)
                again = channel.basic_get("q-visible")
                assert again is not None
                assert again.body == message.body
                channel.basic_ack(again.delivery_tag)
            assert server.client().hlen("unacked") == server.client().zcard("unacked_index") == 0
        finally:
            app.close()

    def test_a_server_that_lost_its_scripts_records_as_well(
        self, app: Celery, server: RedisServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        with app.connection_for_write() as connection:
            received(connection, "q-flushed", "warm")  # the script is cached on the server
            server.client().script_flush()
            server.client().config_resetstat()
            with caplog.at_level(logging.WARNING):
                message = received(connection, "q-flushed", "after the flush")
            assert transactions(server.client()) == 0  # the script's body, not kombu's
            value, score = recorded(server.client(), message.delivery_tag)
            assert value is not None
            assert score is not None
            assert value[0]["properties"]["delivery_tag"] == message.delivery_tag
            assert "refused" not in caplog.text
            connection.default_channel.basic_ack(message.delivery_tag)

    def test_a_broker_user_that_may_not_run_scripts_gets_kombus_transaction(
        self, server: RedisServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        admin = server.client()
        admin.flushall()
        admin.config_resetstat()
        admin.acl_setuser(
            "noscripts", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
            commands=["+@all", "-@scripting"],
        )  # fmt: skip
        url = server.url.replace("redis://", "redis://noscripts:pw@")
        app = riding_app(url, "noscripts")
        try:
            with app.connection_for_write() as connection, caplog.at_level(logging.WARNING):
                tags = [received(connection, "q-acl", f"m{n}").delivery_tag for n in range(3)]
                for tag in tags:
                    value, score = recorded(admin, tag)
                    assert value is not None
                    assert score is not None
                    connection.default_channel.basic_ack(tag)
            said = [
                r.getMessage() for r in caplog.records if "records a received" in r.getMessage()
            ]
            assert len(said) == 1, said  # once, then kombu's transaction without asking
            assert "kombu's own transaction records them from now on" in said[0]
            assert transactions(admin) >= 6  # each message recorded and removed by kombu
            assert admin.hlen("unacked") == 0
        finally:
            app.close()
            admin.acl_deluser("noscripts")


class Marker:
    """A riding call that writes ``riding:<tag>`` where it rides, and says what it read."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.replies: list[object] = []

    def add(self, pipe: Any, db: int) -> None:
        pipe.eval("return redis.call('SET', KEYS[1], '1')", 1, f"riding:{self.tag}")

    def refused(self, error: Exception) -> bool:
        return False

    def read(self, reply: object) -> None:
        self.replies.append(reply)


class Paused:
    """A received message kombu reads inside ``append`` once its riding calls are set: its
    ``delivery_info`` waits there until the test lets it go."""

    def __init__(self, headers: dict[str, object]) -> None:
        self.headers, self.properties = headers, {}
        self._raw = {"body": "paused", "headers": headers, "properties": {}}
        self.inside, self.go = threading.Event(), threading.Event()

    @property
    def delivery_info(self) -> dict[str, str]:
        self.inside.set()
        assert self.go.wait(10)
        return {"exchange": "", "routing_key": "q-race"}


class TestThreads:
    def test_an_ack_on_another_thread_mid_record_leaves_the_records_riding_calls_to_it(
        self, app: Celery, server: RedisServer
    ) -> None:
        """A thread pool acks on its own threads while the consumer's thread records the
        next message: the riding calls go with the message they came with, never with the ack."""
        client = server.client()
        marker = Marker("tag-a")
        broker.on_receipt(
            app, lambda message, server, tag: [marker] if "mark" in message[0] else []
        )
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            other = received(connection, "q-race", "acked meanwhile")
            client.config_resetstat()
            paused = Paused({"mark": "1"})
            appending = threading.Thread(target=channel.qos.append, args=(paused, "tag-a"))
            appending.start()
            try:
                assert paused.inside.wait(10)
                channel.basic_ack(other.delivery_tag)  # this thread: the pool's
            finally:
                paused.go.set()
                appending.join(10)
            assert not appending.is_alive()
            assert client.get("riding:tag-a") == b"1"
            assert marker.replies == [b"OK"]
            # The riding calls went with the record's script, and the ack was two commands:
            # riding calls handed to the ack would have sent it through kombu's transaction.
            assert transactions(client) == 0
            assert client.hexists("unacked", "tag-a")
            assert not client.hexists("unacked", other.delivery_tag)
            channel.qos.ack("tag-a")
        assert client.hlen("unacked") == client.zcard("unacked_index") == 0

    def test_a_channels_record_script_is_cached_before_its_first_message(
        self, app: Celery, server: RedisServer
    ) -> None:
        """A take that rides the record is cached already: a NOSCRIPT for the record
        alone would send it on a round trip of its own after the take's. A producer's
        noted push, which records nothing, does not load it."""
        server.client().script_flush()
        with app.connection_for_write() as connection:
            assert connection.default_channel.pipelining() is not None
            assert server.client().script_exists(RECORD_SHA) == [False]
            assert connection.default_channel.pipelining(records=True) is not None
            assert server.client().script_exists(RECORD_SHA) == [True]


class TestShapes:
    """What kombu chains is sent as our own commands only in the shapes its tested
    releases chain; anything else goes to kombu's pipeline, every call replayed."""

    def bookkeeping(
        self,
        server: RedisServer,
        sent: list[str],
        *,
        fresh: bool = True,
        riding: tuple[Any, ...] = (),
    ) -> Bookkeeping:
        client = server.client()
        if fresh:
            client.flushall()

        def kombus(given: object) -> Any:
            sent.append(f"kombu with {given}" if given else "kombu")
            return client.pipeline()

        return Bookkeeping(
            Pipelining(client),
            Keys("unacked_index", "unacked", ""),
            riding,
            kombus,
            refused=lambda error: sent.append(f"refused {error}"),
            db=0,
        )

    def test_kombus_record_and_removal_are_our_commands(self, server: RedisServer) -> None:
        sent: list[str] = []
        self.bookkeeping(server, sent).zadd("unacked_index", {"t1": 12.5}).hset(
            "unacked", "t1", "[1]"
        ).execute()
        assert server.client().hget("unacked", "t1") == b"[1]"
        assert server.client().zscore("unacked_index", "t1") == 12.5
        self.bookkeeping(server, sent, fresh=False).zrem("unacked_index", "t1").hdel(
            "unacked", "t1"
        ).execute()
        assert sent == []
        assert server.client().exists("unacked", "unacked_index") == 0

    @pytest.mark.parametrize(
        "chain",
        [
            [("hset", ("unacked", "t1", "[1]")), ("zadd", ("unacked_index", {"t1": 1.0}))],
            [
                ("zadd", ("unacked_index", {"t1": 1.0})),
                ("hset", ("unacked", "t1", "[1]")),
                ("set", ("seen", "1")),
            ],
            [("zadd", ("unacked_index", {"t1": 1.0, "t2": 2.0})), ("hset", ("unacked", "t1", "x"))],
            [("zrem", ("unacked_index", "t1")), ("hdel", ("unacked", "t2"))],
        ],
        ids=["another order", "one more command", "two tags", "two tags removed"],
    )
    @pytest.mark.parametrize("chained", [True, False], ids=["chained", "call by call"])
    def test_any_other_shape_goes_to_kombus_pipeline_whole(
        self, server: RedisServer, chain: list[tuple[str, tuple[Any, ...]]], chained: bool
    ) -> None:
        sent: list[str] = []
        client = server.client()
        book = self.bookkeeping(server, sent)
        expected = client.pipeline()
        pipe: Any = book
        for name, args in chain:
            result = getattr(pipe, name)(*args)
            pipe = result if chained else pipe
            getattr(expected, name)(*args)
        pipe.execute()
        assert sent == ["kombu"]  # one pipeline of kombu's, every call on it
        written = {k: client.dump(k) for k in client.keys("*")}
        client.flushall()
        expected.execute()
        assert written == {k: client.dump(k) for k in client.keys("*")}

    def test_a_removal_with_riding_calls_goes_to_kombus_pipeline_with_them(
        self, server: RedisServer
    ) -> None:
        """Never so in kombu's releases (riding calls come with a record); were it so, the
        riding calls are sent, not dropped by the two plain commands."""
        sent: list[str] = []
        book = self.bookkeeping(server, sent, riding=("riding call",))
        book.zrem("unacked_index", "t1").hdel("unacked", "t1").execute()
        assert sent == ["kombu with ('riding call',)"]

    def test_an_error_other_than_a_refusal_is_kombus_to_raise_and_scripts_stay(
        self, server: RedisServer
    ) -> None:
        sent: list[str] = []
        book = self.bookkeeping(server, sent)
        client = server.client()
        client.config_set("maxmemory", 1)  # every write refused: out of memory
        try:
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                book.zadd("unacked_index", {"t1": 1.0}).hset("unacked", "t1", "[1]").execute()
        finally:
            client.config_set("maxmemory", 0)
        assert sent == ["kombu"]  # not refused: the next message is our script again


def test_the_script_takes_the_notes_keys_then_kombus_two() -> None:
    assert RECORD_NOTED_KEYS == NOTE_KEYS + 2
    assert f"if #KEYS == {RECORD_NOTED_KEYS} then" in RECORD  # what the script counts on
