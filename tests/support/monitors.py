"""What a monitor sees: Celery events captured by an ``app.events.Receiver``, and Flower."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery
from celery.utils import uuid

from .http_service import HttpService
from .runs import wait_for
from .workers import ROOT


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


class Flower(HttpService):
    """A real Flower process on the test app's broker, asked over its HTTP API."""

    HEALTH = "/healthcheck"

    def __init__(self, env: Mapping[str, str], app: str = "tests.support.celery_app") -> None:
        super().__init__(Path(tempfile.mkdtemp(prefix="csl-flower-")) / "flower.log")
        self.env = {**os.environ, **env, "FLOWER_UNAUTHENTICATED_API": "true"}
        self.app = app

    def __enter__(self) -> Flower:
        args = [
            sys.executable, "-m", "celery", "-A", self.app, "flower",
            f"--port={self.port}", "--address=127.0.0.1",
        ]  # fmt: skip
        self.start(args, ROOT, self.env)
        return self

    def listening(self, app: Celery) -> Flower:
        """Once Flower files an event sent now: its events queue is bound (its HTTP server
        answers before), no event sent after is missed."""
        marker = uuid()
        deadline = time.monotonic() + 30
        while self.task(marker) is None:
            assert time.monotonic() < deadline, f"Flower saw no event:\n{self.output()}"
            with app.events.default_dispatcher() as dispatcher:
                dispatcher.send("task-test-marker", uuid=marker)
            time.sleep(0.2)
        return self

    def task(self, task_id: str) -> dict[str, Any] | None:
        """``/api/task/info/<id>``: the task as Flower's state has it (None: unknown yet)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/api/task/info/{task_id}", timeout=5
            ) as got:
                info: dict[str, Any] = json.loads(got.read())
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise
        return info

    def page(self, task_id: str) -> str:
        """The task's page, as an operator opens it."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.port}/task/{task_id}", timeout=5
        ) as got:
            text: str = got.read().decode()
        return text

    def __exit__(self, *_: object) -> None:
        self.stop()
