"""A call's countdown checked as Celery checks it, and the library's own delays made ones
RabbitMQ's delay exchanges take (publish/timing.py), routed as Celery routes: no broker."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Queue

from celery_singleton_lock.publish.timing import delays_natively, deliverable, refuse_as_celery

NATIVE = importlib.util.find_spec("celery.utils.quorum_queues") is not None
needs_native = pytest.mark.skipif(not NATIVE, reason="Celery < 5.5 delays nothing natively")

CALL: tuple[tuple[object, ...], dict[str, object]] = ((1,), {})


def _app(broker: str = "amqp://guest@127.0.0.1:1//", **conf: Any) -> Celery:
    app = Celery("timing", broker=broker, set_as_current=False)
    # The default queue direct and classic; "jobs" a quorum queue on a topic exchange;
    # "fast" a quorum queue on a direct one.
    app.conf.update(
        task_queues=[
            Queue("celery", Exchange("celery", type="direct"), routing_key="celery"),
            Queue(
                "jobs",
                Exchange("jobs", type="topic"),
                routing_key="jobs",
                queue_arguments={"x-queue-type": "quorum"},
            ),
            Queue(
                "fast",
                Exchange("fast", type="direct"),
                routing_key="fast",
                queue_arguments={"x-queue-type": "quorum"},
            ),
        ],
        **conf,
    )
    return app


def _task(app: Celery, queue: str | None = None, **options: Any) -> Any:
    @app.task(shared=False, name="timing.job", **options)
    def job(n: int) -> int:
        return n

    if queue is not None:  # the task's queue, as Celery 5.7 would have it set
        app.conf.task_routes = {"timing.job": {"queue": queue}}
    app.finalize()
    return app.tasks["timing.job"]


class TestRoutedAsCeleryRoutes:
    @needs_native
    def test_a_tasks_own_queue_on_a_topic_exchange_is_delayed_natively(self) -> None:
        task = _task(_app(), queue="jobs")
        assert delays_natively(task, CALL, {})
        with pytest.raises(ValueError, match="countdown must be a positive number"):
            refuse_as_celery(task, CALL, {"countdown": 0.5})
        options: dict[str, object] = {"countdown": 0.2}
        deliverable(task, CALL, options)
        assert options == {"countdown": 1.0}

    def test_a_direct_exchange_is_not_delayed_natively(self) -> None:
        task = _task(_app(), queue="fast")
        assert not delays_natively(task, CALL, {})
        refuse_as_celery(task, CALL, {"countdown": 0.5})  # Celery sends it as it is
        options: dict[str, object] = {"countdown": 0.2}
        deliverable(task, CALL, options)
        assert options == {"countdown": 0.2}

    @needs_native
    def test_the_calls_own_queue_wins_over_the_tasks(self) -> None:
        task = _task(_app(), queue="fast")
        assert delays_natively(task, CALL, {"queue": "jobs"})

    def test_a_redis_broker_delays_nothing_natively(self) -> None:
        task = _task(_app("redis://127.0.0.1:1/0"), queue="jobs")
        assert not delays_natively(task, CALL, {})
        refuse_as_celery(task, CALL, {"countdown": 0.5})


class TestWhatCeleryRefuses:
    @pytest.mark.parametrize(
        ("options", "error"),
        [
            ({"countdown": float("inf")}, OverflowError),
            ({"countdown": 1e12}, OverflowError),
            ({"countdown": -3e9}, ValueError),
            ({"expires": float("inf")}, OverflowError),
            ({"eta": 1234}, AttributeError),
        ],
    )
    def test_with_celerys_exception(self, options: dict[str, object], error: type) -> None:
        task = _task(_app("redis://127.0.0.1:1/0"))
        with pytest.raises(error):
            refuse_as_celery(task, CALL, options)

    def test_a_tasks_own_expires_is_checked_too(self) -> None:
        task = _task(_app("redis://127.0.0.1:1/0"), expires=float("inf"))
        with pytest.raises(OverflowError):
            refuse_as_celery(task, CALL, {})

    def test_nothing_is_checked_when_calls_run_eagerly(self) -> None:
        # Celery's apply() reads no countdown, eta or expires.
        task = _task(_app("redis://127.0.0.1:1/0", task_always_eager=True))
        refuse_as_celery(task, CALL, {"countdown": float("inf")})
