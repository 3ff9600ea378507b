"""Each module says what it is in one line (docs/design.md's tree is built from them), with
at most three more lines of why; a module's name appears once in the package."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import celery_singleton_lock

PACKAGE = Path(celery_singleton_lock.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))


def _docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text()), clean=True)


def test_every_module_says_what_it_is_in_a_line_and_why_in_three_more() -> None:
    long = {}
    for path in MODULES:
        doc = _docstring(path)
        assert doc, f"{path.relative_to(PACKAGE)} has no docstring"
        first, *rest = doc.splitlines()
        assert first.strip(), f"{path.relative_to(PACKAGE)}: the first line is empty"
        more = [line for line in rest if line.strip()]
        if len(more) > 3:
            long[str(path.relative_to(PACKAGE))] = len(more)
    assert long == {}, f"more than three lines after the first: {long}"


def test_a_module_name_appears_once() -> None:
    names = Counter(path.stem for path in MODULES if path.stem != "__init__")
    assert [name for name, count in names.items() if count > 1] == []
