"""Passwords, ACL users and TLS work, and no password reaches a log line, repr or error."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import (
    Contended,
    Lease,
    LockNotAcquiredError,
    LockStoreConfigurationError,
    LockStoreUnavailableError,
    RedisLock,
    Redlock,
    ReleaseResult,
    singleton_task,
)
from celery_singleton_lock.config.settings import SingletonConfig
from celery_singleton_lock.lease import HOLD
from celery_singleton_lock.lease.redis.clients import describe as redacted_url

from ..support.runs import wait_for
from ..support.servers import RedisServer, tls_args

SECRET = "s3cr3t-Pa55word"
# What docs/lease.md tells an ACL user to allow: the calls the lock makes and the commands
# its scripts run.
NARROW_COMMANDS = (
    "+eval", "+evalsha", "+script|load", "+set", "+get", "+pttl", "+blpop",
    "+del", "+exists", "+pexpire", "+rpush", "+time",
)  # fmt: skip


def exercise(lock: RedisLock) -> None:
    """Every code path that logs: acquire, contend, extend, lose, release twice."""
    lost = threading.Event()
    lease = lock.acquire("job", ttl=1.0, blocking=False, renew=True, on_lost=lambda _: lost.set())
    with pytest.raises(LockNotAcquiredError) as caught:
        lock.acquire("job", ttl=1, blocking=False)
    assert SECRET not in str(caught.value)
    lock.extend(lease)
    lock.client.set(lease.key, "thief", px=5000)
    assert lost.wait(2)
    assert lock.release(lease) is ReleaseResult.NOT_OWNER


@pytest.fixture(name="password_server", scope="module")
def fixture_password_server() -> Iterator[RedisServer]:
    server = RedisServer(password=SECRET).start()
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "locker", "on", f">{SECRET}", "~*", "+@all")
    admin.close()
    try:
        yield server
    finally:
        server.cleanup()


class TestAuth:
    def test_password_url_works_and_is_never_shown(
        self, password_server: RedisServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="celery_singleton_lock")
        lock = RedisLock.from_url(password_server.url, prefix="auth")
        exercise(lock)
        assert SECRET not in repr(lock)
        assert "***@" in repr(lock)
        assert caplog.records, "expected log lines to inspect"
        assert all(SECRET not in r.getMessage() for r in caplog.records)

    def test_acl_user_url_works_and_is_never_shown(
        self, password_server: RedisServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="celery_singleton_lock")
        url = f"redis://locker:{SECRET}@127.0.0.1:{password_server.port}/0"
        lock = RedisLock.from_url(url, prefix="acl")
        assert lock.client.acl_whoami() in (b"locker", "locker")
        exercise(lock)
        assert (
            repr(lock)
            == f"RedisLock(redis://locker:***@127.0.0.1:{password_server.port}/0, prefix='acl')"
        )
        assert all(SECRET not in r.getMessage() for r in caplog.records)

    def test_an_acl_user_with_only_the_documented_commands_and_keys(
        self, password_server: RedisServer
    ) -> None:
        admin = password_server.client()
        admin.execute_command(
            "ACL", "SETUSER", "narrow", "on", f">{SECRET}", "~narrow:*", *NARROW_COMMANDS
        )
        admin.close()
        url = f"redis://narrow:{SECRET}@127.0.0.1:{password_server.port}/0"
        lock = RedisLock.from_url(url, prefix="narrow")
        exercise(lock)
        hold = lock.try_acquire("queued", 10, take=HOLD)  # SET NX GET, not a script
        assert isinstance(hold, Lease)
        assert isinstance(lock.try_acquire("queued", 10, take=HOLD), Contended)
        lock.release_nowait(hold)
        with lock.hold("held", ttl=5) as lease:
            assert lock.holder("held") == lease.token
            waiter = threading.Thread(target=lambda: lock.acquire("held", 5, timeout=5))
            waiter.start()
        waiter.join(5)
        assert not waiter.is_alive()
        with pytest.raises(redis.exceptions.NoPermissionError):
            lock.client.set("elsewhere", 1)  # the user is confined to the prefix

    def test_an_acl_user_missing_a_command_is_a_configuration_error_naming_acl(
        self, password_server: RedisServer
    ) -> None:
        admin = password_server.client()
        missing = tuple(c for c in NARROW_COMMANDS if c not in ("+evalsha", "+eval"))
        admin.execute_command("ACL", "SETUSER", "scriptless", "on", f">{SECRET}", "~*", *missing)
        lock = RedisLock.from_url(
            f"redis://scriptless:{SECRET}@127.0.0.1:{password_server.port}/0", prefix="acl"
        )
        with pytest.raises(LockStoreConfigurationError, match="ACL user lacks") as caught:
            lock.try_acquire("job", ttl=1)  # a fenced acquire: a script
        assert SECRET not in str(caught.value)

    def test_wrong_password_is_a_configuration_error_that_says_so(
        self, password_server: RedisServer
    ) -> None:
        lock = RedisLock.from_url(f"redis://:wrong@127.0.0.1:{password_server.port}/0")
        with pytest.raises(LockStoreConfigurationError, match="credentials") as caught:
            lock.try_acquire("job", ttl=1)
        assert "wrong" not in str(caught.value)
        assert caught.value.name == "job"
        assert caught.value.key == lock.keys("job").lock

    def test_a_database_past_the_server_s_last_says_how_many_it_has(
        self, password_server: RedisServer
    ) -> None:
        url = password_server.url.removesuffix("/0") + "/999"
        with pytest.raises(
            LockStoreConfigurationError, match="has 16 databases, 0 to 15"
        ) as caught:
            RedisLock.from_url(url).try_acquire("job", ttl=1)
        assert "cluster" not in str(caught.value), "no Cluster to blame on a standalone server"
        assert password_server.password not in str(caught.value)


def test_the_settings_object_never_shows_a_password() -> None:
    """Error reporters print frame locals: the settings' repr hides every password."""
    app = Celery("repr", set_as_current=False, broker=f"redis://:{SECRET}@127.0.0.1:6380/0")
    app.conf.update(
        singleton_lock_url=f"sentinel://:{SECRET}@127.0.0.1:26379;sentinel://:{SECRET}@h:26380",
        singleton_lock_transport_options={
            "master_name": "mymaster",
            "sentinel_kwargs": {"password": SECRET},
            "password": SECRET,
        },
    )
    shown = repr(SingletonConfig.from_app(app))
    assert SECRET not in shown
    assert "sentinel://:***@127.0.0.1:26379" in shown
    assert "broker_url='redis://:***@127.0.0.1:6380/0'" in shown
    assert "'master_name': 'mymaster'" in shown


class TestRefusedMidDispatch:
    """A dispatch the store refuses part of publishes nothing and leaves no hold behind."""

    def dispatch(
        self,
        user: str,
        denied: tuple[str, ...],
        password_server: RedisServer,
        broker: RedisServer,
        items: list[int],
    ) -> tuple[Any, list[BaseException]]:
        admin = password_server.client()
        admin.flushall()
        allowed = tuple(c for c in NARROW_COMMANDS if c not in denied)
        admin.execute_command("ACL", "SETUSER", user, "reset", "on", f">{SECRET}", "~*", *allowed)
        app = Celery(f"refused-{user}", set_as_current=False)
        app.conf.update(
            broker_url=broker.url,
            singleton_lock_url=f"redis://{user}:{SECRET}@127.0.0.1:{password_server.port}/0",
        )

        @singleton_task(app=app, name=f"refused.{user}")
        def job(item: int) -> int:
            return item

        errors: list[BaseException] = []
        for item in items:
            try:
                job.apply_async((item,), queue=f"q-{user}")
            except LockStoreConfigurationError as error:
                errors.append(error)
        app.close()
        return admin, errors

    def test_a_user_without_scripts_is_refused_before_anything_is_written(
        self, password_server: RedisServer, redis_server: RedisServer
    ) -> None:
        broker = redis_server
        broker.client().flushall()
        admin, errors = self.dispatch(
            "nosha", ("+evalsha", "+eval", "+pttl"), password_server, broker, [1]
        )
        assert len(errors) == 1
        assert "ACL user lacks" in str(errors[0])
        assert SECRET not in str(errors[0])
        assert admin.keys("*") == []
        assert broker.client().llen("q-nosha") == 0

    @pytest.mark.usefixtures("redis7")  # SET NX GET; older servers take the script
    def test_a_hold_written_before_a_refused_pttl_is_given_back(
        self, password_server: RedisServer, redis_server: RedisServer
    ) -> None:
        broker = redis_server
        broker.client().flushall()
        admin, errors = self.dispatch("nopttl", ("+pttl",), password_server, broker, [1, 2, 3])
        # The first hold goes through the script (no PTTL when granted), the next ones
        # through SET NX GET + PTTL, which the server refuses after the SET.
        assert len(errors) == 2
        assert all("ACL user lacks" in str(e) for e in errors)
        keys = sorted(k.decode() for k in admin.keys("*") if not k.endswith(b":fence"))
        assert len(keys) == 1, keys  # the one published message's hold, no other
        assert broker.client().llen("q-nopttl") == 1


class TestTLS:
    def test_rediss_url_with_a_private_ca(self, tmp_path: Path) -> None:
        tls, ca_file = tls_args(tmp_path)
        server = RedisServer(*tls, password=SECRET)
        try:
            server.start()
        except RuntimeError as error:
            server.cleanup()
            if "tls" in str(error).lower() and "directive" in str(error).lower():
                pytest.skip("this redis-server was built without TLS support")
            raise
        try:
            assert server.url.startswith("rediss://")
            lock = RedisLock.from_url(server.url, prefix="tls", ssl_ca_certs=str(ca_file))
            lease = lock.acquire("job", ttl=5, blocking=False)
            assert lock.release(lease) is ReleaseResult.RELEASED
            assert redacted_url(lock.client).startswith("rediss://***@127.0.0.1")
            plain = RedisLock.from_url(f"redis://:{SECRET}@127.0.0.1:{server.port}/0")
            with pytest.raises(LockStoreUnavailableError):
                plain.try_acquire("job", ttl=1)
        finally:
            server.cleanup()


def test_redacted_url_for_unix_sockets() -> None:
    client = redis.Redis(unix_socket_path="/tmp/x.sock", password=SECRET)
    assert redacted_url(client) == "unix://***@/tmp/x.sock?db=0"


def answers(lock: Redlock) -> bool:
    """Whether a majority of ``lock``'s masters answer a read (connections made)."""
    try:
        lock.holder("warm-up")
    except LockStoreUnavailableError:
        return False
    return True


def test_redlock_over_tls_with_a_password_never_shows_it(tmp_path: Path) -> None:
    """``redlocks://:password@h1,h2,h3``: every master over TLS with the same credentials;
    a wrong password on the masters is a configuration error that names no secret."""
    tls, ca_file = tls_args(tmp_path)
    servers = [RedisServer(*tls, password=SECRET) for _ in range(3)]
    try:
        try:
            for server in servers:
                server.start()
        except RuntimeError as error:
            if "tls" in str(error).lower() and "directive" in str(error).lower():
                pytest.skip("this redis-server was built without TLS support")
            raise
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
        lock = Redlock.from_url(f"redlocks://:{SECRET}@{hosts}/0", ssl_ca_certs=str(ca_file))
        # Connected first: three TLS handshakes can take longer on a loaded machine than
        # a try waits for answers (a quarter of its ttl), which would be an outage here.
        # A majority answering leaves one master's handshake, and a try's own connections
        # (its worker threads') may need more: the ttl gives the try 5 s for them.
        wait_for(lambda: answers(lock), 30, "the masters answering over TLS")
        lease = lock.acquire("job", ttl=20, blocking=False)
        assert lock.release(lease) is ReleaseResult.RELEASED
        assert SECRET not in repr(lock)
        wrong = Redlock.from_url(f"redlocks://:nope@{hosts}/0", ssl_ca_certs=str(ca_file))
        with pytest.raises(LockStoreConfigurationError) as refused:
            # As above: too few answers would be an outage, not the refusal.
            wrong.try_acquire("job", ttl=20)
        assert SECRET not in str(refused.value)
        assert "nope" not in str(refused.value)
    finally:
        for server in servers:
            server.cleanup()
