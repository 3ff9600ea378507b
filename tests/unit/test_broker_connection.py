"""What an app's riding connection says of itself (``RidingConnection.info``): its
transport named by path, so a worker's ``stats`` reply encodes as JSON, while the
connection, its clones and its pool keep the app's own transport class. No server."""

from __future__ import annotations

import pickle

import pytest
from celery import Celery
from kombu.connection import Connection
from kombu.transport import get_transport_cls
from kombu.utils.json import dumps, loads

from celery_singleton_lock import broker
from celery_singleton_lock.broker import RedisTransport, SentinelTransport
from celery_singleton_lock.broker.connection import transport_name

URLS = {
    "redis": ("redis://127.0.0.1:1/0", RedisTransport),
    "sentinel": ("sentinel://127.0.0.1:1", SentinelTransport),
}


def riding_app(url: str) -> Celery:
    app = Celery("connection", set_as_current=False)
    app.conf.broker_url = url
    assert broker.install(app)
    return app


def path_of(transport: type) -> str:
    return f"{transport.__module__}:{transport.__qualname__}"


class TestTransportName:
    def test_a_class_is_named_by_its_path_which_kombu_resolves(self) -> None:
        named = transport_name(RedisTransport)
        assert named == "celery_singleton_lock.broker.transport:RedisTransport"
        assert get_transport_cls(named) is RedisTransport

    @pytest.mark.parametrize("given", ["redis", broker.TRANSPORT, None])
    def test_anything_else_is_kept(self, given: object) -> None:
        assert transport_name(given) is given

    def test_an_app_s_own_transport_is_named_as_the_class_it_is_made_from(self) -> None:
        with riding_app(URLS["redis"][0]).connection_for_write() as connection:
            own = connection.get_transport_cls()
        assert own is not RedisTransport
        assert issubclass(own, RedisTransport)
        assert transport_name(own) == path_of(RedisTransport)


@pytest.mark.parametrize("scheme", sorted(URLS))
class TestInfo:
    def test_it_encodes_as_json_with_the_transport_named(self, scheme: str) -> None:
        url, transport = URLS[scheme]
        with riding_app(url).connection_for_write() as connection:
            info = connection.info()
            assert loads(dumps(info))["transport"] == path_of(transport)
            assert connection.as_uri().startswith(f"{path_of(transport)}://")

    def test_the_connection_its_clones_and_its_pool_keep_the_app_s_own_class(
        self, scheme: str
    ) -> None:
        url, transport = URLS[scheme]
        app = riding_app(url)
        with app.connection_for_write() as connection:
            own = connection.get_transport_cls()
            assert issubclass(own, transport)
            assert own.ride is broker.ride_of_app(app) is not None
            connection.info()
            assert connection.get_transport_cls() is own
            assert connection.clone().get_transport_cls() is own
            pooled = connection.Pool(limit=1).acquire()
            try:
                assert pooled.get_transport_cls() is own
            finally:
                pooled.release()

    def test_a_connection_made_from_it_rides_for_the_same_app(self, scheme: str) -> None:
        app = riding_app(URLS[scheme][0])
        with app.connection_for_write() as connection:
            own = connection.get_transport_cls()
            again = app.amqp.Connection(**connection.info())
        assert again.get_transport_cls() is own

    def test_a_pickled_copy_is_kombu_s_connection_riding_nothing(self, scheme: str) -> None:
        url, transport = URLS[scheme]
        with riding_app(url).connection_for_write() as connection:
            copy = pickle.loads(pickle.dumps(connection))
        assert type(copy) is Connection
        assert copy.get_transport_cls() is transport
        assert transport.ride is None
