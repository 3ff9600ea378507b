"""Celery apps a test configures: a bare one of given settings, an eager one, the test
app's lock store moved."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..conftest import CeleryEnv


def app_with(main: str = "topology-test", **conf: Any) -> Any:
    from celery import Celery

    app = Celery(main, set_as_current=False)
    app.conf.update(conf)
    return app


def eager_app(url: str, name: str) -> Any:
    """An app whose calls run eagerly, with its locks at ``url`` (``memory://`` or a
    server's), under a prefix of their own."""
    return app_with(
        main=name, task_always_eager=True, singleton_lock_url=url, singleton_lock_prefix="eager"
    )


@contextlib.contextmanager
def lock_url(cenv: CeleryEnv, url: str) -> Iterator[CeleryEnv]:
    """The Celery test app with its lock store at ``url`` (then put back)."""
    app = cenv.app_module.app
    saved = app.conf.singleton_lock_url

    def forget() -> None:
        for attribute in ("_singleton_lock_config", "_singleton_lock_backend"):
            with contextlib.suppress(AttributeError):
                delattr(app, attribute)

    forget()
    app.conf.singleton_lock_url = url
    try:
        yield cenv
    finally:
        app.conf.singleton_lock_url = saved
        forget()
