"""Every Python block of the documentation runs, page by page, in order.

Each page's blocks share one namespace, as a reader's session would: ``app`` is an
eager Celery app on the in-memory lock store, ``REDIS_URL`` points at a private test
server, and what an example leaves to the reader (your database, your metrics client)
is a stand-in that accepts any call.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from ..support.servers import RedisServer
from ..support.workers import ROOT

DOCS = ROOT / "docs"


class Anything:
    """Your database, your metrics client: takes every call, attribute and ``with``."""

    rowcount = 1

    def __getattr__(self, name: str) -> Anything:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Anything:
        return self

    def __enter__(self) -> Anything:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def stand_ins() -> dict[str, Any]:
    anything = Anything()
    return {
        "db": anything,
        "statsd": anything,
        "store": anything,
        "data": b"",
        "compute": lambda *args: 0,
        "batches": lambda *args: [[1, 2]],
        "write": lambda *args, **kwargs: None,
    }


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


PAGES = sorted(page.name for page in DOCS.glob("*.md") if python_blocks(page))


@pytest.fixture(name="redis_url")
def fixture_redis_url(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    monkeypatch.setenv("REDIS_URL", url)
    return url


def test_the_pages_with_examples_are_all_checked() -> None:
    assert {"getting-started.md", "lease.md", "migration.md", "modes.md"} <= set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(page: str, redis_url: str) -> None:
    app = Celery(f"docs-{page}")
    app.conf.update(task_always_eager=True, singleton_lock_url="memory://")
    module = "docs_" + page.removesuffix(".md").replace("-", "_")
    namespace: dict[str, Any] = {"app": app, "__name__": module, **stand_ins()}
    try:
        for number, block in enumerate(python_blocks(DOCS / page), 1):
            exec(compile(block, f"{page}[{number}]", "exec"), namespace)  # noqa: S102
    finally:
        app.close()
