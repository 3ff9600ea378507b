"""Plain tasks that follow a singleton call inside a canvas (a chain's next step, a chord's
body, an errback) and record what they were given on the checker, for the attach tests;
and receivers of Celery's ``after_task_publish``: one records what a worker published, one
holds a run's end after it sent its chain's next step (``gated_follow``)."""

from __future__ import annotations

import json
import os
from typing import Any

from celery_singleton_lock.tokens import ANSWER_HEADER, TOKEN_HEADER

from ..celery_app import app
from .records import checker, pause


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


def published(
    sender: str | None = None,
    headers: dict[str, Any] | None = None,
    routing_key: str | None = None,
    **_: Any,
) -> None:
    """``after_task_publish`` (connected in a worker by ``CSL_PUBLISHED``): what Celery's
    ``apply_async`` published, recorded in ``published`` (id, task, queue, the answer
    and token headers, the publishing pid)."""
    headers = headers or {}
    checker().rpush(
        "published",
        json.dumps(
            {
                "id": headers.get("id"),
                "task": sender,
                "routing_key": routing_key,
                "answer": headers.get(ANSWER_HEADER),
                "token": headers.get(TOKEN_HEADER),
                "pid": os.getpid(),
            }
        ),
    )


GATED = "gated"


def gated_follow(sender: str | None = None, body: Any = None, **_: Any) -> None:
    """``after_task_publish`` (connected in a worker by ``CSL_GATED_FOLLOW``): a ``follow``
    whose tag begins with ``gated`` waits, once published, until the test opens the gate
    of its tag (at most 20 s). Celery's tracer sends a chain's next step after the run
    released its key and before it stores the run's result: the gate holds that gap open."""
    args = body[0] if isinstance(body, (list, tuple)) and body else ()
    if sender == follow.name and args and str(args[-1]).startswith(GATED):
        pause(args[-1], -20.0)
