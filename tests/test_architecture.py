"""The package's shape: SQL lives in store/, the import graph has no cycle, modules stay small.

Read from the source text (ast), so the checks cost nothing at run time and cannot be fooled by
lazy imports inside functions: every `import` statement counts, wherever it stands.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "media_usage_orchestration"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
# Besides store/, only the resource that builds the engine may name SQLAlchemy.
SQLALCHEMY_ALLOWED = ("store/", "resources/database.py")
# The three repositories that mirror EmDash's seed files keep the seeds' shape, whole.
SEED_MIRRORS = {"store/work.py", "store/reconciliations.py", "store/deletions.py"}
MAX_MODULE_LINES = 800


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(relative.parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _imported_names(module: str, path: Path) -> list[str]:
    """Every module named by an import statement of `module`, resolved to absolute names."""
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.append(prefix)
            # `from . import x` may name a submodule rather than an attribute.
            names.extend(f"{prefix}.{alias.name}" for alias in node.names)
    return names


def _internal_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {module: set() for module in MODULES}
    for module, path in MODULES.items():
        for name in _imported_names(module, path):
            if name in MODULES and name != module:
                edges[module].add(name)
    return edges


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    visiting, done = set(), set()
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        visiting.add(node)
        stack.append(node)
        for target in sorted(edges[node]):
            if target in visiting:
                return [*stack[stack.index(target) :], target]
            if target not in done:
                found = visit(target)
                if found:
                    return found
        visiting.discard(node)
        done.add(node)
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in done:
            found = visit(node)
            if found:
                return found
    return None


def test_only_store_and_the_engine_resource_import_sqlalchemy():
    offenders = {
        _relative(path): sorted(
            {name for name in _imported_names(module, path) if name.split(".")[0] == "sqlalchemy"}
        )
        for module, path in MODULES.items()
        if not _relative(path).startswith(SQLALCHEMY_ALLOWED)
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_package_import_graph_has_no_cycle():
    # A package imports its own submodules through __init__; only module-to-module edges count.
    edges = {
        module: {target for target in targets if not module.startswith(target + ".")}
        for module, targets in _internal_edges().items()
    }
    assert _find_cycle(edges) is None


def test_modules_stay_under_the_size_limit():
    oversized = {
        _relative(path): lines
        for path in MODULES.values()
        if (lines := len(path.read_text("utf-8").splitlines())) > MAX_MODULE_LINES
        and _relative(path) not in SEED_MIRRORS
    }
    assert oversized == {}


def _touches_the_database(module: str) -> bool:
    names = _imported_names(module, MODULES[module])
    return any(name.split(".")[0] in ("sqlalchemy", "dagster") for name in names)


def test_media_is_pure_domain_logic():
    """media/ may use store's pure helpers (identifier rules), never a module that holds SQL."""
    impure = {
        _relative(path): names
        for module, path in MODULES.items()
        if module.startswith(f"{PACKAGE}.media")
        and (
            names := sorted(
                name
                for name in _imported_names(module, path)
                if name.startswith((f"{PACKAGE}.processing", f"{PACKAGE}.ops", "dagster"))
                or (
                    name in MODULES
                    and name.startswith(f"{PACKAGE}.store")
                    and _touches_the_database(name)
                )
            )
        )
    }
    assert impure == {}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ],
)
def test_cycle_finder_finds_cycles(source, expected):
    assert _find_cycle(source) == expected


def test_nothing_below_ops_imports_dagster():
    below_ops = (f"{PACKAGE}.processing", f"{PACKAGE}.media", f"{PACKAGE}.store")
    offenders = {
        _relative(path)
        for module, path in MODULES.items()
        if module.startswith(below_ops)
        and any(name.split(".")[0] == "dagster" for name in _imported_names(module, path))
    }
    assert offenders == set()
