"""What a monitor sees: Celery events captured by an ``app.events.Receiver`` in a thread."""

from __future__ import annotations

import threading
import time
from typing import Any

from celery import Celery
from celery.utils import uuid

from .runs import wait_for


class Seen:
    """Every event the broker fans out while it runs (``celery events --dump`` in a thread).

    Started, it has seen a marker of its own: its queue is bound, no event sent after is
    missed."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.events: list[dict[str, Any]] = []
        self.connection = app.connection_for_read()
        self.receiver = app.events.Receiver(self.connection, handlers={"*": self.events.append})
        self.thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self) -> None:
        self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> Seen:
        self.thread.start()
        marker = uuid()
        deadline = time.monotonic() + 20
        while not self.of("test-marker", uuid=marker):
            # Sent again until seen: the receiver's queue is bound on its first consume.
            assert time.monotonic() < deadline, "the receiver saw no marker"
            self.mark(marker)
            time.sleep(0.1)
        return self

    def __exit__(self, *_: object) -> None:
        self.receiver.should_stop = True
        self.thread.join(10)
        self.connection.release()

    def mark(self, marker: str) -> None:
        with self.app.events.default_dispatcher() as dispatcher:
            dispatcher.send("test-marker", uuid=marker)

    def after_marker(self) -> list[dict[str, Any]]:
        """The events seen once a marker sent now is seen: every event sent before."""
        marker = uuid()
        self.mark(marker)
        wait_for(lambda: self.of("test-marker", uuid=marker), 20, "the marker")
        return list(self.events)

    def of(self, type_: str, **fields: object) -> list[dict[str, Any]]:
        return [
            e
            for e in list(self.events)
            if e["type"] == type_ and all(e.get(k) == v for k, v in fields.items())
        ]

    def wait(self, type_: str, timeout: float = 20.0, **fields: object) -> dict[str, Any]:
        found: list[dict[str, Any]] = wait_for(lambda: self.of(type_, **fields), timeout, type_)
        return found[0]
