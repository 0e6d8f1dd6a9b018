"""The package's shape: SQL lives in store/ (and the EmDash double), store/ is in rooms, pure
values are a leaf, media/ is pure, assets live in assets/, the import graph has no cycle,
modules stay small.

Read from the source text (ast), so the checks cost nothing at run time and cannot be fooled by
lazy imports inside functions: every `import` statement counts, wherever it stands.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

PACKAGE = "media_usage_orchestration"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
# Besides store/, the resource that builds the engine and the EmDash double (which writes the
# database as EmDash does) may name SQLAlchemy.
SQLALCHEMY_ALLOWED = ("store/", "resources/database.py", "emdash_double/")
# The three repositories that mirror EmDash's seed files keep the seeds' shape, whole.
SEED_MIRRORS = {"store/work.py", "store/reconciliations.py", "store/deletions.py"}
MAX_MODULE_LINES = 800
# store/'s rooms below its top, where the seed mirrors and the other repositories stand.
STORE_ROOMS = {"core", "sources"}


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


def _package_names(module: str) -> list[str]:
    """The package-internal modules `module` imports (an import of a package counts as such)."""
    return [
        name
        for name in _imported_names(module, MODULES[module])
        if name.split(".")[0] == PACKAGE and name != PACKAGE
    ]


def _in(module: str, *folders: str) -> bool:
    return any(module == f"{PACKAGE}.{f}" or module.startswith(f"{PACKAGE}.{f}.") for f in folders)


def _imports_outside(folder: str, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    """For every module of `folder`: the package modules it imports outside `allowed`."""
    found = {}
    for module, path in MODULES.items():
        if not _in(module, folder):
            continue
        outside = sorted({name for name in _package_names(module) if not _in(name, *allowed)})
        if outside:
            found[_relative(path)] = outside
    return found


def _third_party(module: str) -> set[str]:
    return {
        name.split(".")[0]
        for name in _imported_names(module, MODULES[module])
        if name.split(".")[0] in ("sqlalchemy", "dagster", "psycopg", "click", "rich", "pydantic")
    }


def test_the_values_leaf_imports_only_itself_and_no_database_or_dagster():
    assert _imports_outside("values", ("values",)) == {}
    assert {m: found for m in MODULES if _in(m, "values") and (found := _third_party(m))} == {}


def test_media_imports_nothing_but_media_and_the_values_leaf():
    assert _imports_outside("media", ("media", "values")) == {}
    assert {m: found for m in MODULES if _in(m, "media") and (found := _third_party(m))} == {}


def test_the_store_imports_only_the_store_and_the_values_leaf():
    assert _imports_outside("store", ("store", "values")) == {}


def test_processing_imports_no_wiring():
    """processing/ (the loops, steps and reports) imports only itself and the layers below it:
    never ops/, sensors/, assets/, resources/, schedules, jobs, definitions or the local lanes.
    With media/ and store/ held to their own floors above, this holds transitively."""
    assert _imports_outside("processing", ("processing", "media", "store", "values")) == {}


def test_the_stores_core_room_is_its_floor():
    """core/ (engine, clock, schema, triggers, guard vocabulary) imports no other room and no
    repository, so every repository and the sources room can build on it."""
    assert _imports_outside("store.core", ("store.core", "values")) == {}


def test_the_store_is_in_its_rooms_with_the_seed_mirrors_at_its_top():
    store = ROOT / "store"
    rooms = {path.name for path in store.iterdir() if (path / "__init__.py").exists()}
    assert rooms == STORE_ROOMS
    for room in rooms:
        assert not [p for p in (store / room).iterdir() if (p / "__init__.py").exists()], room
    assert {mirror for mirror in SEED_MIRRORS if (ROOT / mirror).is_file()} == SEED_MIRRORS


def test_only_the_demo_the_bench_and_the_local_lanes_import_the_emdash_double():
    allowed = ("emdash_double", "bench", "demo", "local")
    importers = {
        _relative(path)
        for module, path in MODULES.items()
        if not _in(module, *allowed)
        and any(_in(name, "emdash_double") for name in _package_names(module))
    }
    assert importers == set()


def _constructs_assets(path: Path) -> set[str]:
    """Dagster's asset constructors a module calls or decorates with (dg.AssetSpec, ...)."""
    constructors = {
        "AssetSpec",
        "asset",
        "multi_asset",
        "asset_check",
        "multi_asset_check",
        "multi_observable_source_asset",
        "AssetCheckSpec",
        "AssetChecksDefinition",
    }
    tree = ast.parse(path.read_text("utf-8"))
    from_dagster = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dagster"
        for alias in node.names
    }
    found = set()
    for node in ast.walk(tree):
        target = node.func if isinstance(node, ast.Call) else node
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id in ("dg", "dagster")
            and target.attr in constructors
        ):
            found.add(target.attr)
        elif isinstance(target, ast.Name) and target.id in constructors & from_dagster:
            found.add(target.id)
    return found


def test_assets_and_their_checks_are_defined_in_assets():
    outside = {
        _relative(path): sorted(found)
        for module, path in MODULES.items()
        if not _in(module, "assets") and (found := _constructs_assets(path))
    }
    assert outside == {}
    assert _constructs_assets(ROOT / "assets" / "index.py") >= {"AssetSpec"}
    assert _constructs_assets(ROOT / "assets" / "coverage_history.py") >= {"AssetSpec"}
    assert _constructs_assets(ROOT / "assets" / "health.py") >= {
        "AssetCheckSpec",
        "multi_observable_source_asset",
    }


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ],
)
def test_cycle_finder_finds_cycles(source, expected):
    assert _find_cycle(source) == expected


def test_nothing_below_ops_and_assets_imports_dagster():
    below = ("processing", "media", "store", "values", "emdash_double")
    offenders = {
        _relative(path)
        for module, path in MODULES.items()
        if _in(module, *below) and "dagster" in _third_party(module)
    }
    assert offenders == set()


# The one module that defines the project's errors, and the one control-flow exception elsewhere.
ERRORS_MODULE = "values/errors.py"
NOT_AN_ERROR = {("ops/leased.py", "StepStopped")}


def _exception_classes() -> set[tuple[str, str]]:
    """(module path, class) of every class deriving from an exception: a builtin one, one named
    like an error, or (transitively) another such class of the package."""
    classes = [
        (_relative(path), node.name, {_base_name(base) for base in node.bases})
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.ClassDef)
    ]
    exceptions = {
        name
        for name, value in vars(builtins).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    found: set[tuple[str, str]] = set()
    while True:
        more = {
            (path, name)
            for path, name, bases in classes
            if any(base in exceptions or base.endswith(("Error", "Exception")) for base in bases)
        }
        if more == found:
            return found
        found = more
        exceptions |= {name for _, name in found}


def _base_name(base: ast.expr) -> str:
    if isinstance(base, ast.Attribute):
        return base.attr
    return base.id if isinstance(base, ast.Name) else ""


def test_errors_are_defined_only_in_the_errors_module():
    outside = {
        (path, name)
        for path, name in _exception_classes()
        if path != ERRORS_MODULE and (path, name) not in NOT_AN_ERROR
    }
    assert outside == set()
    assert ("values/errors.py", "MediaUsageError") in _exception_classes()
