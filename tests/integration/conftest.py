"""Fixtures of the integration tests that several files share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import CeleryEnv
from ..support.modes import QUEUE
from ..support.rabbitmq import RabbitMQServer
from ..support.servers import RedisServer
from ..support.workers import Worker


@pytest.fixture(name="queue")
def fixture_queue(cenv: CeleryEnv) -> Any:
    broker = cenv.broker.client()
    broker.delete(QUEUE)
    yield broker
    broker.delete(QUEUE)


@pytest.fixture(name="three_workers", scope="module")
def fixture_three_workers(celery_env: CeleryEnv, worker: Worker) -> Any:
    """The shared worker and two more on its queue: six pool children in all (for the
    module: tests that kill one start their own)."""
    extra = [Worker(celery_env.env, queue=worker.queue) for _ in range(2)]
    try:
        for each in extra:
            each.start()
        yield [worker, *extra]
    finally:
        for each in extra:
            each.stop()


@pytest.fixture(name="shared", scope="module")
def fixture_shared() -> Iterator[RedisServer]:
    """One Redis for broker (db 0) and locks (db 1): the default on a Redis broker."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(name="rabbit", scope="module")
def fixture_rabbit() -> Iterator[RabbitMQServer]:
    """A private RabbitMQ node for a module's tests (its tests skip without one)."""
    server = RabbitMQServer().start()
    try:
        yield server
    finally:
        server.cleanup()
