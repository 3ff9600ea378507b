"""pytest fixtures for testing your singleton tasks, registered by the ``pytest11`` entry point.

Nothing happens unless a test asks for a fixture. They wrap the helpers of
``celery_singleton_lock.contrib.testing`` (docs/testing.md lists both).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import pytest

from ..config.stores import LockStores
from ..exceptions import ConfigurationError
from . import testing
from .locks import LockRow

if TYPE_CHECKING:
    from celery import Celery

    from ..lease import ManualClock
    from ..task import SingletonTask
    from .testing import HeldCall


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--singleton-lock-url",
        default=None,
        help="lock store for the singleton_locks fixture (default memory://)",
    )


class SingletonLocks:
    """The testing helpers, bound to one app."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def hold(
        self, task: SingletonTask, *args: object, **kwargs: object
    ) -> AbstractContextManager[HeldCall]:
        return testing.hold(task, *args, **kwargs)

    def held(self) -> list[LockRow]:
        return testing.held_locks(self.app)

    def clear(self) -> int:
        return testing.clear_locks(self.app)

    def assert_refused(self, task: SingletonTask, *args: object, **kwargs: object) -> None:
        testing.assert_refused(task, *args, **kwargs)

    def assert_locked(self, task: SingletonTask, *args: object, **kwargs: object) -> None:
        testing.assert_locked(task, *args, **kwargs)


@pytest.fixture
def singleton_lock_url(request: pytest.FixtureRequest) -> str:
    """The lock store for the tests, ``memory://`` unless you pass
    ``--singleton-lock-url redis://...`` (or override the fixture)."""
    url: str | None = request.config.getoption("--singleton-lock-url")
    return url or "memory://"


@pytest.fixture
def singleton_app(request: pytest.FixtureRequest) -> Celery:
    """The app whose locks the tests use: Celery's ``celery_app`` fixture when the test
    uses it, else the current app. Override it to return your project's."""
    if "celery_app" in request.fixturenames:
        return request.getfixturevalue("celery_app")
    from celery import current_app  # noqa: PLC0415  (the app as the test left it)

    return current_app._get_current_object()


@pytest.fixture
def singleton_locks(singleton_app: Celery, singleton_lock_url: str) -> Iterator[SingletonLocks]:
    """Points ``singleton_app`` at ``singleton_lock_url``'s store, clears it before and after
    the test, and gives the helpers of ``celery_singleton_lock.contrib.testing`` bound to
    the app."""
    app = singleton_app
    saved = app.conf.get("singleton_lock_url")
    LockStores.forget(app)
    app.conf.singleton_lock_url = singleton_lock_url
    locks = SingletonLocks(app)
    locks.clear()
    try:
        yield locks
    finally:
        locks.clear()
        app.conf.singleton_lock_url = saved
        LockStores.forget(app)


@pytest.fixture
def singleton_clock(singleton_locks: SingletonLocks) -> Iterator[ManualClock]:
    """With ``singleton_locks`` on ``memory://``, its time moved by hand:
    ``singleton_clock.advance(60)`` (``testing.manual_clock``); skips the test on Redis."""
    # A suite run with --singleton-lock-url redis://... skips the tests that move time.
    try:
        context = testing.manual_clock(singleton_locks.app)
        clock = context.__enter__()
    except ConfigurationError as error:
        pytest.skip(str(error))
    try:
        yield clock
    finally:
        context.__exit__(None, None, None)
