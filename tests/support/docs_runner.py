"""Run every Python block of one docs page in order, in one namespace, as a reader would.

    python -m tests.support.docs_runner docs/lease.md

A new interpreter per page: shared tasks another test defined must not meet the page's
app. ``app`` is an eager Celery app on the in-memory lock store; what an example leaves
to the reader (your database, your metrics client) is a stand-in that takes any call.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

from celery import Celery


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


def definition(page: Path, name: str, namespace: dict[str, Any]) -> Any:
    """The page's own function ``name``, with its block's imports, made in ``namespace``
    (whose names stand in for what the page defined around it; decorators left off, so a
    test can mount it where it runs): what the page shows, run by a test against real
    workers rather than the page's eager app."""
    imports: list[ast.stmt] = []  # the page's so far, as a reader has them
    for number, block in enumerate(python_blocks(page), 1):
        tree = ast.parse(block)
        imports += [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        if found:
            found[0].decorator_list = []
            module = ast.Module(body=[*imports, found[0]], type_ignores=[])
            exec(compile(module, f"{page.name}[{number}]", "exec"), namespace)  # noqa: S102
            return namespace[name]
    raise LookupError(f"{page.name} defines no function {name!r}")


def django_project() -> None:
    """Your Django project, for a page whose examples mount something into one."""
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="docs-only",
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
        ],
    )
    django.setup()


def run(page: Path) -> None:
    if any("from django" in block for block in python_blocks(page)):
        django_project()
    app = Celery(f"docs-{page.stem}")
    app.conf.update(task_always_eager=True, singleton_lock_url="memory://")
    module = "docs_" + page.stem.replace("-", "_")
    namespace: dict[str, Any] = {"app": app, "__name__": module, **stand_ins()}
    try:
        for number, block in enumerate(python_blocks(page), 1):
            exec(compile(block, f"{page.name}[{number}]", "exec"), namespace)  # noqa: S102
    finally:
        app.close()


if __name__ == "__main__":
    run(Path(sys.argv[1]))
