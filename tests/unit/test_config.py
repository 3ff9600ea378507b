"""App settings: read from app.conf (plain and Django-namespaced), validated, cached."""

from __future__ import annotations

import subprocess
import sys
import types
from typing import Any

import pytest
from celery import Celery
from celery.backends.redis import RedisBackend as CeleryRedisBackend
from kombu.transport import pyamqp, resolve_transport
from kombu.transport import redis as kombu_redis

from celery_singleton_lock import ConfigurationError, broker, singleton_task
from celery_singleton_lock.broker import RedisTransport
from celery_singleton_lock.config.settings import SingletonConfig
from celery_singleton_lock.config.visibility import longest_countdown, visibility_timeout


def app_with(**settings: Any) -> Celery:
    app = Celery("cfg", set_as_current=False)
    app.conf.update(settings)
    return app


class TestDefaults:
    def test_defaults_and_url_from_the_redis_result_backend(self) -> None:
        config = SingletonConfig.from_app(
            app_with(result_backend="redis://r:6379/1", broker_url="redis://b:6379/0")
        )
        assert config.url == "redis://r:6379/1"
        assert config.url_source == "result_backend"
        assert config.ttl == 30
        assert config.queue_ttl == 3600
        assert config.prefix == "singleton_lock"
        assert config.on_redis_error == "fail_closed"

    def test_url_falls_back_to_a_redis_broker(self) -> None:
        config = SingletonConfig.from_app(
            app_with(result_backend="db+sqlite:///x.db", broker_url="rediss://b:6380/0;redis://c")
        )
        assert config.url == "rediss://b:6380/0"
        assert config.url_source == "broker_url"

    def test_no_redis_anywhere_is_an_error_at_first_use_that_says_what_to_set(self) -> None:
        config = SingletonConfig.from_app(app_with(broker_url="amqp://guest@localhost//"))
        with pytest.raises(ConfigurationError, match="set singleton_lock_url"):
            config.require_url()

    def test_explicit_values_win(self) -> None:
        config = SingletonConfig.from_app(
            app_with(
                result_backend="redis://r/1",
                singleton_lock_url="redis://locks:6379/3",
                singleton_lock_prefix="myapp",
                singleton_lock_ttl=60,
                singleton_lock_queue_ttl=120,
                singleton_lock_on_redis_error="fail_open",
            )
        )
        assert (config.url, config.prefix, config.ttl, config.queue_ttl) == (
            "redis://locks:6379/3",
            "myapp",
            60,
            120,
        )
        assert config.on_redis_error == "fail_open"

    def test_memory_backend_for_eager_tests(self) -> None:
        assert SingletonConfig.from_app(app_with(singleton_lock_url="memory://")).url == "memory://"

    def test_read_once_and_cached_on_the_app(self) -> None:
        app = app_with(singleton_lock_ttl=5)
        first = SingletonConfig.from_app(app)
        app.conf.singleton_lock_ttl = 9
        assert SingletonConfig.from_app(app) is first


class TestDjango:
    def test_celery_namespace_settings_are_read(self) -> None:
        settings = types.SimpleNamespace(
            CELERY_BROKER_URL="redis://b:6379/0",
            CELERY_SINGLETON_LOCK_TTL=45,
            CELERY_SINGLETON_LOCK_PREFIX="django",
        )
        app = Celery("dj", set_as_current=False)
        app.config_from_object(settings, namespace="CELERY")
        config = SingletonConfig.from_app(app)
        assert (config.ttl, config.prefix, config.url) == (45, "django", "redis://b:6379/0")

    def test_misspelt_namespaced_setting_is_refused(self) -> None:
        settings = types.SimpleNamespace(CELERY_SINGLETON_LOCK_TLL=45)
        app = Celery("dj", set_as_current=False)
        app.config_from_object(settings, namespace="CELERY")
        with pytest.raises(ConfigurationError) as caught:
            SingletonConfig.from_app(app)
        message = str(caught.value)
        assert "CELERY_SINGLETON_LOCK_TLL (did you mean CELERY_SINGLETON_LOCK_TTL?)" in message
        assert "singleton_lock_" not in message.replace("celery-singleton-lock", "")

    def test_bad_namespaced_value_is_named_as_written(self) -> None:
        settings = types.SimpleNamespace(CELERY_SINGLETON_LOCK_TTL=0)
        app = Celery("dj", set_as_current=False)
        app.config_from_object(settings, namespace="CELERY")
        with pytest.raises(ConfigurationError, match="CELERY_SINGLETON_LOCK_TTL must be positive"):
            SingletonConfig.from_app(app)


class TestBadValues:
    @pytest.mark.parametrize(
        ("settings", "message"),
        [
            ({"singleton_lock_ttl": 0}, "singleton_lock_ttl must be positive"),
            ({"singleton_lock_ttl": "30"}, "singleton_lock_ttl must be a number"),
            ({"singleton_lock_queue_ttl": -1}, "singleton_lock_queue_ttl must be positive"),
            ({"singleton_lock_on_redis_error": "ignore"}, "fail_closed"),
            ({"singleton_lock_prefix": "a{b"}, "singleton_lock_prefix"),
            ({"singleton_lock_url": "amqp://x"}, "singleton_lock_url must be a redis://"),
            ({"singleton_lock_tll": 5}, "did you mean singleton_lock_ttl"),
            ({"singleton_lock_ride_broker": "no"}, "singleton_lock_ride_broker='no': use True"),
        ],
    )
    def test_bad_setting_is_refused_naming_it(self, settings: dict[str, Any], message: str) -> None:
        with pytest.raises(ConfigurationError, match=message):
            SingletonConfig.from_app(app_with(**settings))

    def test_celery_singletons_own_setting_is_not_mistaken_for_a_typo(self) -> None:
        config = SingletonConfig.from_app(
            app_with(broker_url="redis://b/0", singleton_lock_expiry=60)
        )
        assert config.ttl == 30

    def test_password_in_url_never_reaches_the_error(self) -> None:
        with pytest.raises(ConfigurationError) as caught:
            SingletonConfig.from_app(app_with(singleton_lock_url="amqp://user:hunter2@x//"))
        assert "hunter2" not in str(caught.value)


class TestConnectionOptions:
    def test_a_lock_store_on_the_brokers_server_reuses_its_tls_and_connection_options(
        self,
    ) -> None:
        tls = {"ssl_cert_reqs": "required", "ssl_ca_certs": "/etc/ca.pem"}
        config = SingletonConfig.from_app(
            app_with(
                broker_url="rediss://:pw@r.internal:6380/0",
                broker_use_ssl=tls,
                broker_transport_options={"socket_keepalive": True, "visibility_timeout": 99},
                singleton_lock_url="rediss://:pw@r.internal:6380/3",
            )
        )
        assert config.transport_options == {**tls, "socket_keepalive": True}

    def test_the_users_transport_options_win(self) -> None:
        config = SingletonConfig.from_app(
            app_with(
                result_backend="redis://b:6379/0",
                result_backend_transport_options={"socket_connect_timeout": 3},
                singleton_lock_transport_options={"socket_connect_timeout": 1, "protocol": 3},
            )
        )
        assert config.url_source == "result_backend"
        assert config.transport_options == {"socket_connect_timeout": 1, "protocol": 3}

    def test_another_server_gets_none_of_the_brokers_options(self) -> None:
        config = SingletonConfig.from_app(
            app_with(
                broker_url="rediss://r:6380/0",
                broker_use_ssl={"ssl_ca_certs": "/x"},
                singleton_lock_url="redis://other:6379/0",
            )
        )
        assert config.transport_options == {}

    def test_bad_replicas_and_transport_options_are_refused_naming_the_setting(self) -> None:
        with pytest.raises(ConfigurationError, match="singleton_lock_replicas"):
            SingletonConfig.from_app(app_with(singleton_lock_replicas=-1))
        with pytest.raises(ConfigurationError, match="singleton_lock_transport_options"):
            SingletonConfig.from_app(app_with(singleton_lock_transport_options="socket_timeout=1"))
        with pytest.raises(ConfigurationError, match="singleton_lock_client"):
            SingletonConfig.from_app(app_with(singleton_lock_client="no.such.module.factory"))

    def test_the_transit_timeout_is_seconds_and_zero_turns_it_off(self) -> None:
        assert SingletonConfig.from_app(app_with()).transit_timeout == 10.0
        off = app_with(singleton_lock_transit_timeout=0)
        assert SingletonConfig.from_app(off).transit_timeout == 0.0
        for bad in (-1, "10", True):
            with pytest.raises(ConfigurationError, match="singleton_lock_transit_timeout"):
                SingletonConfig.from_app(app_with(singleton_lock_transit_timeout=bad))

    def test_the_attach_sweep_is_seconds_above_zero(self) -> None:
        assert SingletonConfig.from_app(app_with()).attach_sweep == 0.5
        assert SingletonConfig.from_app(app_with(singleton_lock_attach_sweep=30)).attach_sweep == 30
        for bad in (0, -1, "10", True):
            with pytest.raises(ConfigurationError, match="singleton_lock_attach_sweep"):
                SingletonConfig.from_app(app_with(singleton_lock_attach_sweep=bad))


class TestReceivers:
    def test_importing_the_package_connects_nothing_defining_a_task_does(self) -> None:
        """A web process that imports the package but defines no singleton task gets no
        worker signal receivers; the first singleton task connects them, once."""
        code = (
            "import celery.signals as s, celery_singleton_lock as csl\n"
            "def ours():\n"
            "    return sum('celery_singleton_lock' in str(key)\n"
            "               for sig in (s.worker_init, s.worker_ready, s.task_revoked,\n"
            "                           s.worker_shutdown) for key, _ in sig.receivers)\n"
            "before = ours()\n"
            "from celery import Celery\n"
            "app = Celery('r', set_as_current=False)\n"
            "@csl.singleton_task(app=app)\n"
            "def one(x): ...\n"
            "@csl.singleton_task(app=app)\n"
            "def two(x): ...\n"
            "print(before, ours())\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert out.stdout.split() == ["0", "4"]


class TestRidingTheBroker:
    """``broker.install(app)`` makes that app, and no other, resolve its Redis and
    Sentinel broker URLs to the riding transports (``app.amqp.Connection``)."""

    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            ("redis://127.0.0.1:1/0", "celery_singleton_lock.broker.transport.RedisTransport"),
            ("rediss://127.0.0.1:1/0", "celery_singleton_lock.broker.transport.RedisTransport"),
            ("redis+socket:///tmp/r.sock", "celery_singleton_lock.broker.transport.RedisTransport"),
            ("memory://", "kombu.transport.memory.Transport"),
            ("amqp://127.0.0.1:1//", "kombu.transport.pyamqp.Transport"),
            (
                "sentinel://127.0.0.1:1/0",
                "celery_singleton_lock.broker.transport.SentinelTransport",
            ),
        ],
    )
    def test_an_app_that_rides_resolves_the_redis_schemes_to_it(
        self, url: str, expected: str
    ) -> None:
        app = app_with(broker_url=url)
        assert broker.install(app)
        with app.connection_for_write() as connection:
            found = connection.get_transport_cls()
        assert f"{found.__module__}.{found.__qualname__}" == expected

    def test_no_other_app_is_touched(self) -> None:
        riding, other = (
            app_with(broker_url="redis://127.0.0.1:1/0"),
            app_with(broker_url="redis://127.0.0.1:1/0"),
        )
        broker.install(riding)
        with other.connection_for_write() as connection:
            assert connection.get_transport_cls() is kombu_redis.Transport
        assert resolve_transport("redis") is kombu_redis.Transport  # kombu's table as it was

    def test_each_app_that_rides_has_a_ride_of_its_own(self) -> None:
        # What the worker tells one app's ride (what a received message rides, a
        # self-check that turned it off) reaches that app's channels and no other's.
        one, two = (app_with(broker_url="redis://127.0.0.1:1/0") for _ in range(2))
        broker.install(one), broker.install(two)
        broker.turn_off(one, "kombu differs")
        assert broker.turned_off(one) == "kombu differs"
        assert broker.turned_off(two) is None
        transports = []
        for app in (one, two):
            with app.connection_for_write() as connection:
                transports.append(connection.get_transport_cls())
        assert transports[0] is not transports[1]
        assert [transport.ride for transport in transports] == [
            broker.ride_of_app(one),
            broker.ride_of_app(two),
        ]
        broker.install(one)  # a second task bound: the ride is kept, with what it was told
        assert broker.turned_off(one) == "kombu differs"

    def test_a_riding_transport_the_app_names_becomes_the_app_s_own(self) -> None:
        app = app_with(broker_url="redis://127.0.0.1:1/0", broker_transport=broker.TRANSPORT)
        broker.install(app)
        with app.connection_for_write() as connection:
            found = connection.get_transport_cls()
        assert issubclass(found, RedisTransport)
        assert found.ride is broker.ride_of_app(app) is not None

    def test_uninstall_gives_the_app_kombu_s_and_celery_s_classes_back(self) -> None:
        app = app_with(broker_url="redis://127.0.0.1:1/0", result_backend="redis://127.0.0.1:1/1")
        broker.install(app)
        assert broker.installed(app)
        broker.uninstall(app)
        assert not broker.installed(app)
        with app.connection_for_write() as connection:
            assert connection.get_transport_cls() is kombu_redis.Transport
        assert type(app.backend) is CeleryRedisBackend

    def test_ride_broker_false_installs_nothing(self) -> None:
        app = app_with(
            broker_url="redis://127.0.0.1:1/0",
            result_backend="redis://127.0.0.1:1/1",
            singleton_lock_ride_broker=False,
        )

        @singleton_task(app=app)
        def work(x: int) -> int:
            return x

        assert work.name in app.tasks  # bound
        assert not broker.installed(app)
        assert type(app.backend) is CeleryRedisBackend

    def test_pooled_and_failed_over_connections_ride_too(self) -> None:
        app = app_with(broker_url="redis+socket:///tmp/r.sock")
        broker.install(app)
        with app.connection_for_write() as connection:
            # kombu reads a socket URL's transport again for each pooled connection.
            ours = connection.get_transport_cls()
            assert issubclass(ours, RedisTransport)
            assert ours.ride is broker.ride_of_app(app)
            pooled = connection.Pool(limit=1).acquire()
            try:
                assert pooled.get_transport_cls() is ours
            finally:
                pooled.release()
            connection.switch("amqp://127.0.0.1:1//")  # the next broker URL, on failover
            assert connection.get_transport_cls() is pyamqp.Transport
            connection.switch("redis://127.0.0.1:2/0")
            assert connection.get_transport_cls() is ours

    def test_a_transport_the_app_names_is_kept(self) -> None:
        app = app_with(
            broker_url="redis://127.0.0.1:1/0", broker_transport="kombu.transport.redis:Transport"
        )
        broker.install(app)
        with app.connection_for_write() as connection:
            assert connection.get_transport_cls() is kombu_redis.Transport

    def test_a_broker_url_changed_after_configuration_is_honoured(self) -> None:
        app = app_with(broker_url="redis://127.0.0.1:1/0")
        broker.install(app)
        app.conf.broker_url = "memory://"  # as a project's test settings do
        with app.connection_for_write() as connection:
            assert connection.get_transport_cls().__module__ == "kombu.transport.memory"


class TestVisibilityTimeout:
    """How long a message may wait unacked in a worker: the hops of a long deferral."""

    @pytest.mark.parametrize(
        ("settings", "expected"),
        [
            ({"broker_url": "redis://b:6379/0"}, 3600.0),  # kombu's default
            ({"broker_url": "rediss://b:6380/0", "visibility_timeout": 600}, 600.0),
            (
                {"broker_url": "sentinel://s:26379;sentinel://t:26379", "visibility_timeout": "90"},
                90.0,
            ),
            ({"broker_url": "REDIS+socket:///tmp/redis.sock"}, 3600.0),
            ({"broker_url": ["redis://a/0", "redis://b/0"], "visibility_timeout": 120}, 120.0),
            ({"broker_url": "sqs://"}, 1800.0),
            ({"broker_url": "redis://b:6379/0", "visibility_timeout": "soon"}, 3600.0),
            ({"broker_url": "redis://b:6379/0", "visibility_timeout": 0}, None),  # no hop helps
            # Workers read from broker_read_url; broker_transport names the transport.
            ({"broker_url": "amqp://w//", "broker_read_url": "redis://r/0"}, 3600.0),
            ({"broker_url": "sqs://", "broker_transport": "redis"}, 3600.0),
            # RabbitMQ's consumer_timeout, its server's default: kombu has no option for it
            ({"broker_url": "amqp://guest@r:5672//", "visibility_timeout": 60}, 1800.0),
            ({"broker_url": "pyamqp://guest@r:5672//"}, 1800.0),
            ({}, 1800.0),  # no broker_url: Celery's default, amqp
            ({"broker_url": "memory://"}, None),
            ({"broker_url": "filesystem://"}, None),
        ],
    )
    def test_the_brokers_timeout(self, settings: dict[str, Any], expected: Any) -> None:
        given = dict(settings)
        options = (
            {"visibility_timeout": given.pop("visibility_timeout")}
            if "visibility_timeout" in given
            else {}
        )
        conf = app_with(**given, broker_transport_options=options).conf
        assert visibility_timeout(conf) == expected

    def test_rabbitmqs_is_the_consumer_timeout_the_app_says_its_server_has(self) -> None:
        rabbit = app_with(broker_url="amqp://r//", singleton_lock_consumer_timeout=600)
        seconds = SingletonConfig.from_app(rabbit).consumer_timeout
        assert seconds == 600.0
        assert visibility_timeout(rabbit.conf, seconds) == 600.0
        assert longest_countdown(rabbit.conf, seconds) == 300.0
        # 0: the server has none (consumer_timeout = false): a wait needs no hop.
        assert longest_countdown(rabbit.conf, 0.0) is None
        # A Redis broker's own visibility_timeout is what counts there.
        assert longest_countdown(app_with(broker_url="redis://b/0").conf, 600.0) == 1800.0

    @pytest.mark.parametrize(
        ("bad", "said"),
        [
            (-1, "use your RabbitMQ server's consumer_timeout"),
            ("soon", "a number of seconds"),
            (1_800_000, "in milliseconds: divide by 1000"),  # rabbitmq.conf's, copied
        ],
    )
    def test_a_bad_consumer_timeout_says_what_to_write(self, bad: object, said: str) -> None:
        with pytest.raises(ConfigurationError, match=f"singleton_lock_consumer_timeout.*{said}"):
            SingletonConfig.from_app(app_with(singleton_lock_consumer_timeout=bad))

    def test_a_hop_is_at_most_half_of_it(self) -> None:
        conf = app_with(
            broker_url="redis://b/0", broker_transport_options={"visibility_timeout": 60}
        ).conf
        assert longest_countdown(conf) == 30.0
        assert longest_countdown(app_with(broker_url="amqp://r//").conf) == 900.0
        assert longest_countdown(app_with(broker_url="memory://").conf) is None
