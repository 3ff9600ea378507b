"""Bad input sweep: each a clear error naming the problem, nothing published, nothing stored."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import (
    ConfigurationError,
    DuplicateTaskError,
    KeyDerivationError,
    LockStoreConfigurationError,
    LockStoreUnavailableError,
    SingletonTask,
    singleton_task,
)

from ..conftest import CeleryEnv
from ..support.servers import RedisServer
from .conftest import Figures

QUEUE = "bad-input-q"


def job(order_id: int, amount: Decimal = Decimal(1)) -> None: ...


def app_with(cenv: CeleryEnv, **settings: Any) -> Celery:
    app = Celery("bad", set_as_current=False)
    app.conf.update({"broker_url": cenv.broker.url, "task_publish_retry": False, **settings})
    return app


def dispatch(cenv: CeleryEnv, *args: Any, **kwargs: Any) -> Callable[[], Any]:
    return lambda: cenv.app_module.work.apply_async(args, kwargs, queue=QUEUE)


def decorate(cenv: CeleryEnv, **options: Any) -> Callable[[], Any]:
    return lambda: singleton_task(app=app_with(cenv), name="bad.job", **options)(job)


def dispatch_with(cenv: CeleryEnv, **settings: Any) -> Callable[[], Any]:
    def action() -> Any:
        app = app_with(cenv, **settings)
        task = singleton_task(app=app, name="bad.configured")(job)
        return task.apply_async((1,), queue=QUEUE)

    return action


def base_form(cenv: CeleryEnv, singleton: dict[str, Any]) -> Callable[[], Any]:
    def action() -> Any:
        app = app_with(cenv)
        app.finalize()
        return app.task(base=SingletonTask, singleton=singleton, name="bad.base", shared=False)(job)

    return action


def planted_foreign_value(cenv: CeleryEnv) -> Callable[[], Any]:
    # Planted before the sweep starts: the one key that is expected to be there.
    key = "t:{" + cenv.app_module.work.singleton_options().key.derive(("corrupt",), {}) + "}"
    cenv.lock_client().set(key, b"\xff\xfe not ours", px=60_000)
    return lambda: cenv.app_module.work.apply_async(("corrupt",), queue=QUEUE)


@pytest.fixture(name="secured", scope="module")
def fixture_secured() -> Iterator[RedisServer]:
    server = RedisServer(password="right-password").start()
    try:
        yield server
    finally:
        server.cleanup()


def cases(cenv: CeleryEnv, secured: RedisServer) -> list[tuple[str, Callable[[], Any], type, str]]:
    wrong_password = f"redis://:wrong-password@127.0.0.1:{secured.port}/0"
    plain_as_tls = f"rediss://127.0.0.1:{cenv.lock.port}/0"
    return [
        ("set argument", dispatch(cenv, {1, 2}), KeyDerivationError, "item is a builtins.set"),
        ("object argument", dispatch(cenv, object()), KeyDerivationError, "builtins.object"),
        ("complex argument", dispatch(cenv, 1j), KeyDerivationError, "builtins.complex"),
        ("bytearray argument", dispatch(cenv, bytearray(b"x")), KeyDerivationError, "bytearray"),
        ("tuple dict key", dispatch(cenv, {(1, 2): 1}), KeyDerivationError, "dict key"),
        ("nested set", dispatch(cenv, [1, [{3}]]), KeyDerivationError, "item[1][0]"),
        ("too many arguments", dispatch(cenv, 1, 2, 3, 4), KeyDerivationError, "signature"),
        ("unknown keyword", dispatch(cenv, 1, colour="red"), KeyDerivationError, "signature"),
        ("on_contention typo", decorate(cenv, on_contention="retry"), ConfigurationError,
         "['fail', 'requeue', 'skip', 'wait']"),
        ("on_duplicate typo", decorate(cenv, on_duplicate="skip"), ConfigurationError,
         "['return', 'raise', 'replace', 'cancel']"),
        ("ttl zero", decorate(cenv, ttl=0), ConfigurationError, "ttl must be positive"),
        ("ttl negative", decorate(cenv, ttl=-5), ConfigurationError, "ttl must be positive"),
        ("ttl string", decorate(cenv, ttl="30"), ConfigurationError, "number of seconds"),
        ("ttl two days", decorate(cenv, ttl=172_800), ConfigurationError, "longer than a day"),
        ("queue_ttl nan", decorate(cenv, queue_ttl=float("nan")), ConfigurationError, "finite"),
        ("unknown key parameter", decorate(cenv, key=["order"]), ConfigurationError,
         "not parameters"),
        ("positional format field", decorate(cenv, key="order:{}"), ConfigurationError,
         "positional fields"),
        ("unknown format field", decorate(cenv, key="order:{id}"), ConfigurationError,
         "not parameters"),
        ("dedupe not a bool", decorate(cenv, dedupe="yes"), ConfigurationError, "True or False"),
        ("unknown base-class option", base_form(cenv, {"keys": ["order_id"]}),
         ConfigurationError, "unknown singleton option"),
        ("misspelt setting", dispatch_with(cenv, singleton_lock_tll=5), ConfigurationError,
         "did you mean singleton_lock_ttl"),
        ("bad error policy", dispatch_with(cenv, singleton_lock_on_redis_error="ignore"),
         ConfigurationError, "fail_closed"),
        ("prefix with braces", dispatch_with(cenv, singleton_lock_prefix="a{b}"),
         ConfigurationError, "singleton_lock_prefix"),
        ("wrong URL scheme", dispatch_with(cenv, singleton_lock_url="http://127.0.0.1/"),
         ConfigurationError, "singleton_lock_url must be a redis://"),
        ("no Redis configured", dispatch_with(cenv, broker_url="memory://", result_backend="rpc://"),
         ConfigurationError, "set singleton_lock_url"),
        ("wrong password", dispatch_with(cenv, singleton_lock_url=wrong_password),
         LockStoreConfigurationError, "fix the user/password"),
        ("TLS URL to a plain server", dispatch_with(cenv, singleton_lock_url=plain_as_tls),
         LockStoreUnavailableError, "unreachable"),
        ("corrupt lock value", planted_foreign_value(cenv), DuplicateTaskError, "holder unknown"),
        ("role mark in a format key's value",
         lambda: cenv.app_module.callback_request.apply_async(("7\x1fpending",), queue=QUEUE),
         KeyDerivationError, "\\x1f"),
        ("unencoded # in the password",
         dispatch_with(cenv, singleton_lock_url=f"redis://:right-password#1@127.0.0.1:{secured.port}/0"),
         ConfigurationError, "percent-encode the password"),
        ("unencoded / in the password",
         dispatch_with(cenv, singleton_lock_url=f"redis://u:right/password@127.0.0.1:{secured.port}/0"),
         ConfigurationError, "percent-encode the password"),
        ("password in the query of a bad URL",
         dispatch_with(cenv, singleton_lock_url="redis://127.0.0.1:port/0?password=right-password"),
         ConfigurationError, "password=***"),
        ("database path not a number",
         dispatch_with(cenv, singleton_lock_url=f"redis://127.0.0.1:{cenv.lock.port}/abc"),
         ConfigurationError, "'abc' is not a database number"),
        ("unknown transport option",
         dispatch_with(cenv, singleton_lock_transport_options={"colour": 1}),
         ConfigurationError, "not one redis-py takes"),
        ("cluster URL to a standalone server",
         dispatch_with(cenv, singleton_lock_url=f"redis+cluster://127.0.0.1:{cenv.lock.port}"),
         ConfigurationError, "not in cluster mode"),
        ("key callable with the wrong signature", decorate(cenv, key=lambda order: f"o{order}"),
         ConfigurationError, "cannot take the task's arguments by name"),
        ("attribute access in a format key", decorate(cenv, key="order:{order_id.real}"),
         ConfigurationError, "Use a callable"),
        ("braceless key naming a parameter", decorate(cenv, key="order_id"),
         ConfigurationError, "did you mean key=['order_id']"),
        ("singleton not a dict", base_form(cenv, ["key"]),  # type: ignore[arg-type]
         ConfigurationError, "must be a dict of options"),
        ("celery-once option", decorate(cenv, once={"graceful": True}),
         ConfigurationError, "on_duplicate='return' for graceful=True"),
        ("dedupe=0 per call",
         lambda: cenv.app_module.work.apply_async(("x",), queue=QUEUE, dedupe=0),
         ConfigurationError, "dedupe is True (the default) or False"),
    ]  # fmt: skip


class TestBadInputSweep:
    def test_every_bad_input_is_refused_clearly_and_leaves_nothing(
        self, cenv: CeleryEnv, secured: RedisServer, figures: Figures
    ) -> None:
        broker = cenv.broker.client()
        broker.delete(QUEUE)
        table = cases(cenv, secured)
        refused = 0
        for name, action, error, fragment in table:
            keys_before = set(cenv.lock_client().scan_iter("*"))
            with pytest.raises(error) as caught:
                action()
            message = str(caught.value)
            assert fragment in message, f"{name}: {message}"
            assert "wrong-password" not in message, name
            assert "right-password" not in message, name
            assert broker.llen(QUEUE) == 0, f"{name}: a message was published"
            assert set(cenv.lock_client().scan_iter("*")) == keys_before, f"{name}: keys left"
            refused += 1
        figures.record("bad_input", cases=len(table), refused_clearly=refused)
        assert len(table) >= 20
