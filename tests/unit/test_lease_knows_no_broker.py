"""The lease layer knows nothing of kombu: its layout, its pushes and notes live in broker/.

What rides kombu's round trips (the push scripts, the notes of messages in transit, the
sweep) is one optional layer behind one seam; a word of kombu's layout or an import of
kombu or of broker/ in lease/ would tie the core to it again.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import celery_singleton_lock

PACKAGE = Path(celery_singleton_lock.__file__).parent
LEASE = PACKAGE / "lease"
SOURCES = sorted([*LEASE.rglob("*.py"), *LEASE.rglob("*.lua")])

# kombu's Redis layout (its unacked hash and index, its bindings' sets, the list it pops
# with BRPOP and we push to with LPUSH) and the ride's notes of messages in transit.
KOMBU_WORDS = re.compile(r"unacked|_kombu|binding|\bLPUSH\b|\bBRPOP\b|transit:", re.IGNORECASE)
# Top-level packages lease/ must not import: kombu, Celery, and the ride's own folder.
FORBIDDEN = ("kombu", "celery")


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, as written (relative ones resolved under the package)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                found.append(".".join([*base, *([node.module] if node.module else [])]))
            else:
                found.append(node.module or "")
    return found


def _forbidden(module: str) -> bool:
    top = module.split(".", maxsplit=1)[0]
    ours = f"{PACKAGE.name}.broker"
    return top in FORBIDDEN or module == ours or module.startswith(ours + ".")


class TestLeaseKnowsNoBroker:
    def test_there_are_sources_to_check(self) -> None:
        assert len([p for p in SOURCES if p.suffix == ".lua"]) >= 10
        assert len([p for p in SOURCES if p.suffix == ".py"]) >= 30

    @pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(LEASE)))
    def test_no_lease_source_names_kombus_layout(self, path: Path) -> None:
        found = [
            f"{number}: {line.strip()}"
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if KOMBU_WORDS.search(line)
        ]
        assert found == []

    @pytest.mark.parametrize(
        "path",
        [p for p in SOURCES if p.suffix == ".py"],
        ids=lambda path: str(path.relative_to(LEASE)),
    )
    def test_no_lease_module_imports_kombu_celery_or_the_broker_ride(self, path: Path) -> None:
        assert [module for module in _imports(path) if _forbidden(module)] == []

    def test_a_word_or_an_import_of_kombus_is_found(self) -> None:
        assert KOMBU_WORDS.search("redis.call('HEXISTS', unacked, tag)")
        assert KOMBU_WORDS.search("local queues = '_kombu.binding.celery'")
        assert not KOMBU_WORDS.search("redis.call('RPUSH', signal_key, '1')")
        assert _forbidden("kombu.transport.redis")
        assert _forbidden(f"{PACKAGE.name}.broker.pushes")
        assert not _forbidden(f"{PACKAGE.name}.lease.redis.scripts")
