"""The example project's tests: its own app, an eager run, and Celery's in-process worker.

The fixtures ``singleton_locks`` and ``singleton_lock_url`` come from
celery-singleton-lock's pytest plugin (installed with the package). Here the app they
use is the project's; the lock store is ``memory://`` unless pytest is given
``--singleton-lock-url redis://...``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def _effects_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's database, in a temporary directory (read by settings at import)."""
    path = tmp_path_factory.mktemp("effects") / "effects.sqlite3"
    os.environ["DEMO_DB"] = str(path)
    from example_project import settings, store

    settings.EFFECTS_DB = str(path)
    store.create(requests=20, coupons=3)
    return path


@pytest.fixture(scope="session")
def project_app() -> Any:
    """The project's app with test settings: in-memory broker and results, so Celery's
    in-process worker needs no server (the lock store is the plugin's to set)."""
    import example_project.tasks  # noqa: F401  (registers the tasks on the app)
    from example_project.celeryapp import app

    app.conf.update(broker_url="memory://", result_backend="cache+memory://")
    return app


@pytest.fixture
def singleton_app(request: pytest.FixtureRequest, project_app: Any) -> Any:
    """The plugin's fixtures act on the project's app, or on Celery's test app
    (``celery_app``) in a test that uses Celery's own fixtures."""
    if "celery_app" in request.fixturenames:
        return request.getfixturevalue("celery_app")
    return project_app


@pytest.fixture(scope="session")
def celery_config() -> dict[str, Any]:
    """Celery's own test app (``celery_app`` / ``celery_worker``): in-memory broker,
    results and locks."""
    return {
        "broker_url": "memory://",
        "result_backend": "cache+memory://",
        "singleton_lock_url": "memory://",
    }


# Celery's own in-process worker fixture (pytest-celery, when installed, shadows the
# name with a Docker-based one).
from celery.contrib.pytest import celery_worker  # noqa: E402, F401
