"""`media/` is pure domain logic: it reads no database itself, and its modules import each other
without a cycle (counting imports inside functions and `TYPE_CHECKING` blocks)."""

from __future__ import annotations

import ast
from pathlib import Path

import media_usage_orchestration.media as media_package

MEDIA_DIR = Path(media_package.__file__).parent
PACKAGE = "media_usage_orchestration"
# What only a module that opens transactions or builds SQL would import.
FORBIDDEN_PREFIXES = ("sqlalchemy", f"{PACKAGE}.store.engine")


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports anywhere in its body, as absolute dotted names."""
    names: set[str] = set()
    package_parts = [PACKAGE, "media"]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package_parts[: len(package_parts) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names.add(module)
            if node.module is None:  # `from . import x` imports the sibling module x
                names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def media_modules() -> dict[str, Path]:
    return {f"{PACKAGE}.media.{path.stem}": path for path in MEDIA_DIR.glob("*.py")}


def test_media_modules_import_neither_sqlalchemy_nor_the_engine_helpers():
    offending = {
        name: sorted(
            module for module in imported_modules(path) if module.startswith(FORBIDDEN_PREFIXES)
        )
        for name, path in media_modules().items()
    }
    assert {name: found for name, found in offending.items() if found} == {}


def test_media_imports_form_no_cycle():
    modules = media_modules()
    graph = {
        name: {module for module in imported_modules(path) if module in modules}
        for name, path in modules.items()
    }
    assert graph[f"{PACKAGE}.media.snapshots"], "the graph should see intra-media imports"
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        assert name not in visiting, f"import cycle: {' -> '.join([*visiting, name])}"
        if name in done:
            return
        visiting.append(name)
        for imported in sorted(graph[name]):
            visit(imported)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
