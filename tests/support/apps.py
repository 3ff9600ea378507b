"""Celery apps a test configures: a bare one of given settings, the test app's lock store moved."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..conftest import CeleryEnv


def app_with(**conf: Any) -> Any:
    from celery import Celery

    app = Celery("topology-test", set_as_current=False)
    app.conf.update(conf)
    return app


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
