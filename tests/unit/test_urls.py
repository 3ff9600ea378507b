"""URLs as settings give them: a failover list read one way, one rule for the same server."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from celery_singleton_lock.broker.transport import may_ride
from celery_singleton_lock.config.settings import SingletonConfig, broker_write_url
from celery_singleton_lock.config.visibility import transport_of
from celery_singleton_lock.lease.redis.servers import server_named, server_of
from celery_singleton_lock.lease.redis.urls import failover_urls, first_url


class TestFailoverLists:
    @pytest.mark.parametrize(
        ("given", "first"),
        [
            ("redis://a:6379/0", "redis://a:6379/0"),
            ("redis://a/0;redis://b/0", "redis://a/0"),
            (" redis://a/0 ; redis://b/0", "redis://a/0"),
            (["redis://a/0", "redis://b/0"], "redis://a/0"),
            (("redis://a/0;redis://b/0", "redis://c/0"), "redis://a/0"),
            (";redis://b/0", ""),  # as kombu reads it: the part before the first ';'
            ("", ""),
            (None, ""),
            ([], ""),
        ],
    )
    def test_the_first_url_is_the_part_before_the_first_semicolon(
        self, given: object, first: str
    ) -> None:
        assert first_url(given) == first

    @pytest.mark.parametrize(
        ("given", "urls"),
        [
            ("sentinel://a:26379;sentinel://b:26379", ["sentinel://a:26379", "sentinel://b:26379"]),
            ("sentinel://a;; sentinel://b;", ["sentinel://a", "sentinel://b"]),
            (["redis://a", "redis://b;redis://c"], ["redis://a", "redis://b", "redis://c"]),
            (None, []),
        ],
    )
    def test_every_url_of_a_list_stripped_and_none_empty(
        self, given: object, urls: list[str]
    ) -> None:
        assert failover_urls(given) == urls

    @pytest.mark.parametrize(
        "broker",
        ["rediss://b:6380/0;redis://c/0", ["rediss://b:6380/0", "redis://c/0"]],
    )
    def test_each_setting_reads_the_first_the_same_way(self, broker: object) -> None:
        app = Celery("urls", set_as_current=False)
        app.conf.update(broker_url=broker, result_backend="db+sqlite:///x.db")
        assert SingletonConfig.from_app(app).url == "rediss://b:6380/0"
        assert broker_write_url(app.conf) == "rediss://b:6380/0"
        assert transport_of(app.conf) == "rediss"
        app.close()


class TestSameServer:
    """One rule (``Server.same_server``) whether the lock store is the broker's server,
    read off two URLs, a URL and a client, or two clients."""

    @pytest.mark.parametrize(
        ("one", "other", "same"),
        [
            ("redis://r:6379/0", "redis://r:6379/3", True),  # databases may differ
            ("redis://r/0", "redis://r:6379/1", True),  # redis-py's default port
            ("redis://", "redis://localhost:6379", True),  # and host
            ("rediss://:pw@r:6380/0", "rediss://u:other@r:6380/2", True),
            ("valkey://r:6379", "redis://r:6379", True),
            ("redis://r:6379;redis://s:6379", "redis://r:6379", True),  # the first of a list
            ("redis://r:6379", "redis://s:6379", False),
            ("redis://r:6379", "redis://r:6380", False),
            ("redis://localhost:6379", "redis://127.0.0.1:6379", False),  # names, not lookups
            ("unix:///tmp/r.sock?db=1", "redis+socket:///tmp/r.sock", True),
            ("unix:///tmp/r.sock", "unix:///tmp/s.sock", False),
            ("unix:///tmp/r.sock", "redis://", False),
            ("sentinel://a:26379;sentinel://b:26379", "sentinel://b:26379;sentinel://a", True),
            # one group: a sentinel in common (a lock URL naming one of the broker's)
            ("sentinel://a:26379;sentinel://b:26379", "sentinel://a:26379/1", True),
            ("sentinel://a:26379;sentinel://b:26379", "sentinel://c:26379", False),
            ("sentinel://a:26379", "redis://a:26379", False),
            ("redis+cluster://r:7000", "redis://r:7000", False),  # a cluster is no one server
            ("redis://r:port/0", "redis://r:port/0", False),  # unreadable: never the same
            ("amqp://r:5672//", "redis://r:5672", False),
        ],
    )
    def test_two_urls(self, one: str, other: str, same: bool) -> None:
        here, there = server_named(one), server_named(other)
        assert (here is not None and here.same_server(there)) is same
        assert (there is not None and there.same_server(here)) is same

    @pytest.mark.parametrize(
        ("url", "rides"),
        [
            ("redis://r:6379/0", True),
            ("redis://r/2;redis://s/0", True),
            ("rediss://r:6379/0", True),
            ("redis://s:6379/0", False),
            ("redis+socket:///tmp/r.sock", False),
            ("sentinel://s:26379", True),  # its master is found by asking: the channel compares
            ("redis://r:port/0", True),  # unreadable here: the channel compares
            ("amqp://r:6379//", False),
        ],
    )
    def test_a_broker_url_and_the_lock_stores_client(self, url: str, rides: bool) -> None:
        client = redis.Redis(host="r", port=6379, db=1)
        server = server_of(client)
        assert server is not None
        assert may_ride(url, server) is rides
        client.close()

    def test_two_clients(self) -> None:
        one, other = redis.Redis(host="r", db=0), redis.Redis(host="r", port=6379, db=5)
        socket = redis.Redis(unix_socket_path="/tmp/r.sock")
        here, there, elsewhere = server_of(one), server_of(other), server_of(socket)
        assert here is not None
        assert here.same_server(there)
        assert here.same_server(server_named("redis://r:6379/9"))
        assert not here.same_server(elsewhere)
        assert elsewhere is not None
        assert elsewhere.same_server(server_named("unix:///tmp/r.sock"))
        for client in (one, other, socket):
            client.close()

    @pytest.mark.parametrize(
        ("lock", "shared"),
        [
            ("rediss://:pw@r.internal:6380/3", True),
            ("rediss://r.internal:6380;rediss://s.internal:6380", True),
            ("rediss://s.internal:6380/3", False),
            ("unix:///tmp/r.sock", False),
        ],
    )
    def test_the_lock_store_shares_the_brokers_options_on_its_server(
        self, lock: str, shared: bool
    ) -> None:
        app = Celery("urls", set_as_current=False)
        app.conf.update(
            broker_url="rediss://:pw@r.internal:6380/0",
            broker_use_ssl={"ssl_ca_certs": "/etc/ca.pem"},
            singleton_lock_url=lock,
        )
        options = SingletonConfig.from_app(app).transport_options
        assert options == ({"ssl_ca_certs": "/etc/ca.pem"} if shared else {})
        app.close()
