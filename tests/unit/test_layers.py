"""The package's layers: no module imports from a layer above its own.

Each module belongs to the layer of its top-level name (a folder or a module). A layer
may import from its own and lower layers only; the three process folders (publish, run,
worker) share a layer and never import one another: each runs in its own process.
"""

from __future__ import annotations

import ast
from pathlib import Path

import celery_singleton_lock

PACKAGE = Path(celery_singleton_lock.__file__).parent
NAME = PACKAGE.name

# Lowest first. docs/design.md draws the same order.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("exceptions", "_time"),  # errors and durations: everything may raise or parse
    ("lease",),  # the lease layer: no Celery
    ("tokens", "keys", "keyformat", "policies", "signals", "holders"),  # shared vocabulary
    ("modes",),
    ("config",),
    ("context", "outages"),
    ("broker",),
    ("publish", "run", "worker"),  # one per process: producer, pool child, worker's main
    ("__init__", "task", "decorator"),  # the face
    ("contrib",),  # operations: CLI, locks page, metrics, testing
)
PROCESSES = {"publish", "run", "worker"}

# Imports that go up, each with why it is allowed.
ALLOWED = {
    # Loaded only when singleton_lock_metrics_port is set (an optional extra).
    ("worker", "contrib.metrics_server"),
    # The decisions as Celery events, where the worker sends task events (-E, or
    # enable_events as Flower sends it): what it connects, and the flag its pool reads.
    ("worker", "contrib.events"),
    # Connected as a singleton task is defined, as the worker's hooks are: a producer's
    # refusals as Celery events (read as each task is bound), and OpenTelemetry's
    # span events where opentelemetry-api is installed (nothing connected without it).
    ("task", "contrib.events"),
    ("task", "contrib.tracing"),
    # Each singleton task's name, as it is bound: its metrics' series shown at 0 from the
    # start where they are installed (a name kept otherwise; prometheus_client not loaded).
    ("task", "contrib.metrics"),
}


def _rank(top: str) -> int:
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{top!r} is in no layer: add it to LAYERS (and docs/design.md)")


def _module(path: Path) -> list[str]:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts


def _imports(module: list[str], is_package: bool, source: str) -> list[tuple[int, list[str]]]:
    """(line, the imported module's parts under the package) for each import of ours."""
    package = module if is_package else module[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            for alias in node.names:
                sub = [*target, alias.name]
                is_module = PACKAGE.joinpath(*sub).with_suffix(".py").exists()
                found.append((node.lineno, sub if is_module else target))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(NAME + "."):
            found.append((node.lineno, (node.module or "").split(".")[1:]))
    return found


def _crossings(module: list[str], is_package: bool, source: str) -> list[str]:
    top = module[0]
    crossings = []
    for line, target in _imports(module, is_package, source):
        if not target:
            continue  # the package itself: its names come from the face
        to = target[0]
        allowed = (top, ".".join(target)) in ALLOWED
        up = _rank(to) > _rank(top)
        sideways = top in PROCESSES and to in PROCESSES and to != top
        if (up or sideways) and not allowed:
            crossings.append(f"{'.'.join(module)}:{line} imports {'.'.join(target)}")
    return crossings


# The lease core: what every store shares, naming none of them. The stores (``redis/``,
# ``redlock/``, ``limits/``) build on it; the helpers over every store (idempotency,
# offers) and the package's face sit above them.
LEASE_CORE = (
    "clock", "errors", "history", "interface", "lease", "names", "outcomes",
    "pending", "renewal", "takeover",
)  # fmt: skip
STORES = ("redis", "redlock", "limits")


class TestLayers:
    def test_the_lease_core_names_no_store(self) -> None:
        found = []
        for name in LEASE_CORE:
            path = PACKAGE / "lease" / f"{name}.py"
            for line, target in _imports(["lease", name], False, path.read_text()):
                if target[:1] == ["lease"] and target[1:2] and target[1] in STORES:
                    found.append(f"lease.{name}:{line} imports {'.'.join(target)}")
        assert found == []

    def test_no_module_imports_from_a_higher_layer_or_another_process(self) -> None:
        found = []
        for path in sorted(PACKAGE.rglob("*.py")):
            module = _module(path)
            found += _crossings(module, path.name == "__init__.py", path.read_text())
        assert found == []

    def test_every_top_level_name_has_a_layer(self) -> None:
        for entry in PACKAGE.iterdir():
            if entry.name.startswith(("__pycache__", ".")) or entry.name == "py.typed":
                continue
            _rank(entry.stem)

    def test_a_climbing_or_sideways_import_is_found(self) -> None:
        assert _crossings(["lease", "made_up"], False, "from ..task import X") == [
            "lease.made_up:1 imports task"
        ]
        assert _crossings(["run", "made_up"], False, "from ..worker import hooks") == [
            "run.made_up:1 imports worker.hooks"
        ]
        assert _crossings(["worker", "made_up"], False, "from ..lease import Lease") == []
