"""A wait for a result that reads the stored result again once a second after its first.

Celery 5.7's Redis result consumer subscribes as a wait starts and now and then misses the
result's message published just then; a wait would then last until its timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Consumer(Protocol):
    """What of Celery's result consumer the wait asks: read the stored result now."""

    def on_wait_for_pending(self, result: object) -> object: ...


class ReadsAgain:
    """Mixed into the ride's Redis result backend (``results.RedisBackend``), before
    Celery's own, whose ``_wait_for_pending`` it wraps."""

    result_consumer: Consumer  # Celery's backend's

    def _wait_for_pending(
        self,
        result: object,
        timeout: float | None = None,
        on_interval: Callable[[], object] | None = None,
        on_message: object = None,
        **kwargs: object,
    ) -> object:
        """Celery's wait, reading the stored result again once a second after the first:
        Celery 5.7's consumer, subscribing as a wait starts, now and then misses the
        result's message (plain Celery's too, for a chain's result) and would wait until
        the timeout for a result already stored. A wait that ends within a second reads
        nothing more."""
        consumer = self.result_consumer
        due = [time.monotonic() + 1.0]

        def read_again() -> None:
            now = time.monotonic()
            if now >= due[0]:
                due[0] = now + 1.0
                consumer.on_wait_for_pending(result)
            if on_interval is not None:
                on_interval()

        wait: Callable[..., object] = super()._wait_for_pending  # type: ignore[misc]
        return wait(
            result, timeout=timeout, on_interval=read_again, on_message=on_message, **kwargs
        )


__all__ = ["ReadsAgain"]
