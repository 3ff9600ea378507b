"""Plain tasks that follow a singleton call inside a canvas (a chain's next step, a chord's
body, an errback) and record what they were given on the checker, for the attach tests."""

from __future__ import annotations

import json
from typing import Any

from ..celery_app import app
from .records import checker


@app.task
def follow(value: Any, tag: object) -> list[Any]:
    """A chain's next step: records ``(tag, value)`` in ``follows``."""
    checker().rpush("follows", json.dumps([tag, value]))
    return [value, tag]


@app.task
def collect(results: list[Any]) -> list[Any]:
    """A chord's body: records the header's results in ``collected``."""
    checker().rpush("collected", json.dumps(results))
    return results


@app.task
def errback(task_id: str) -> None:
    """A ``link_error`` (Celery's old signature: the failed task's id): recorded in ``errbacks``."""
    checker().rpush("errbacks", task_id)
