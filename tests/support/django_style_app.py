"""An app configured as under Django: ``CELERY_``-prefixed settings, ``namespace="CELERY"``.

``CSL_TYPO=1`` misspells one of our settings, as a user would in ``settings.py``.
"""

from __future__ import annotations

import os
import types

from celery import Celery

from celery_singleton_lock import singleton_task

settings = types.SimpleNamespace(
    CELERY_BROKER_URL=os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0"),
    CELERY_RESULT_BACKEND=os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0"),
    CELERY_TASK_DEFAULT_QUEUE=os.environ.get("CSL_QUEUE", "celery"),
    CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP=True,
    CELERY_SINGLETON_LOCK_URL=os.environ.get("CSL_LOCK_URL", "redis://127.0.0.1:6379/0"),
    CELERY_SINGLETON_LOCK_PREFIX="dj",
)
if os.environ.get("CSL_TYPO") == "1":
    settings.CELERY_SINGLETON_LOCK_TLL = 5
else:
    settings.CELERY_SINGLETON_LOCK_TTL = 5

app = Celery("tests.support.django_style_app")
app.config_from_object(settings, namespace="CELERY")


# shared=False: the tests reload this module, and a shared task would be offered to
# every app finalized after that twice, under one name (DuplicateTaskNameWarning).
@singleton_task(app=app, name="tests.support.django_style_app.job", shared=False)
def job(x: int) -> int:
    return x
