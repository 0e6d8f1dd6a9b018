"""The package's shape: SQL lives in store/ (and the EmDash double), store/ is in rooms, pure
values are a leaf, media/ is pure, assets live in assets/, the import graph has no cycle,
modules stay small.

Read from the source text (ast), so the checks cost nothing at run time and cannot be fooled by
lazy imports inside functions: every `import` statement counts, wherever it stands.
"""

from __future__ import annotations

import ast
import builtins
import functools
import re
from pathlib import Path

import pytest

PACKAGE = "media_usage_orchestration"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
# Besides store/, the resource that builds the engine, the EmDash double (which writes the
# database as EmDash does) and the bench's own SQL may name SQLAlchemy.
SQLALCHEMY_ALLOWED = ("store/", "resources/database.py", "emdash_double/", "bench/sql/")
# The workflows, named alike in every layer: a grep for one lands in its room of each.
WORKFLOWS = ("work", "reconciliation", "deletion", "projection_gc")
# The three repositories that mirror EmDash's seed files: each a room whose repository.py keeps
# the seed's class whole.
SEED_MIRRORS = {
    "store/work/repository.py": "WorkRepository",
    "store/reconciliation/repository.py": "ReconciliationRepository",
    "store/deletion/repository.py": "DeletionRepository",
}
MAX_REPOSITORY_LINES = 1000
MAX_MODULE_LINES = 800
# store/ and processing/ are rooms only: nothing but the package's __init__ at their top.
STORE_ROOMS = {*WORKFLOWS, "core", "sources", "host", "reads", "runs"}
PROCESSING_ROOMS = {*WORKFLOWS, "loop", "lane", "integrity", "operator", "activation"}


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for all the checks below."""
    return ast.parse(path.read_text("utf-8"), filename=str(path))


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


@functools.cache
def _imported_names(module: str, path: Path) -> list[str]:
    """Every module named by an import statement of `module`, resolved to absolute names."""
    tree = _tree(path)
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


@functools.cache
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


def _is_repository(path: Path) -> bool:
    return _relative(path).startswith("store/") and path.name == "repository.py"


def test_modules_stay_under_their_size_limits():
    """A repository module (a room's repository.py) holds about 1,000 lines at most, every
    other module 800."""
    oversized = {
        _relative(path): lines
        for path in MODULES.values()
        if (lines := len(path.read_text("utf-8").splitlines()))
        > (MAX_REPOSITORY_LINES if _is_repository(path) else MAX_MODULE_LINES)
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


def _rooms(folder: str) -> tuple[set[str], set[str]]:
    """The rooms (subpackages) of a folder, and the modules at its top besides __init__."""
    top = ROOT / folder
    rooms = {path.name for path in top.iterdir() if (path / "__init__.py").exists()}
    modules = {path.name for path in top.glob("*.py") if path.name != "__init__.py"}
    return rooms, modules


@pytest.mark.parametrize(
    ("folder", "expected"), [("store", STORE_ROOMS), ("processing", PROCESSING_ROOMS)]
)
def test_store_and_processing_are_rooms_only(folder, expected):
    rooms, modules = _rooms(folder)
    assert (rooms, modules) == (expected, set())
    for room in rooms:
        assert _rooms(f"{folder}/{room}")[0] == set(), f"{folder}/{room} has a room inside"


@pytest.mark.parametrize("workflow", WORKFLOWS)
def test_a_workflow_has_its_same_named_room_in_every_layer(workflow):
    homes = [f"ops/{workflow}.py", f"sensors/{workflow}.py", f"processing/{workflow}/__init__.py"]
    homes.append(f"store/{workflow}/repository.py")
    assert [home for home in homes if not (ROOT / home).is_file()] == []


@pytest.mark.parametrize(("mirror", "seed_class"), sorted(SEED_MIRRORS.items()))
def test_each_seed_mirror_keeps_the_seeds_class_whole_in_its_repository_module(mirror, seed_class):
    tree = _tree(ROOT / mirror)
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert classes == [seed_class]


def test_every_store_module_serves_the_product_not_only_the_bench():
    """Bench-only SQL lives in bench/sql/: every store module is imported by some module of the
    package outside bench/ (or is a room's package)."""
    importers: dict[str, set[str]] = {}
    for module in MODULES:
        for name in _package_names(module):
            importers.setdefault(name, set()).add(module)
    bench_only = sorted(
        _relative(path)
        for module, path in MODULES.items()
        if _in(module, "store")
        and path.name != "__init__.py"
        and not any(
            not _in(importer, "bench", "store") for importer in _served_by(module, importers)
        )
    )
    assert bench_only == []


def _served_by(module: str, importers: dict[str, set[str]]) -> set[str]:
    """The modules that import `module`, directly or through store modules that import it."""
    found, frontier = set(), [module]
    while frontier:
        for importer in importers.get(frontier.pop(), set()) - found:
            found.add(importer)
            if _in(importer, "store"):
                frontier.append(importer)
    return found


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
    tree = _tree(path)
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
NOT_AN_ERROR = {("dagster_kit/leased.py", "StepStopped")}


def _exception_classes() -> set[tuple[str, str]]:
    """(module path, class) of every class deriving from an exception: a builtin one, one named
    like an error, or (transitively) another such class of the package."""
    classes = [
        (_relative(path), node.name, {_base_name(base) for base in node.bases})
        for path in MODULES.values()
        for node in ast.walk(_tree(path))
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


# --- the Dagster kit and the wiring's order ------------------------------------------------------

WIRING = ("ops", "sensors", "assets", "resources", "schedules", "jobs", "definitions", "local")
QUARANTINE = "dagster_kit/dagster_internals.py"


def _folder(module: str) -> str:
    """A module's top-level folder (or top-level module) inside the package."""
    return module.removeprefix(f"{PACKAGE}.").split(".")[0]


def _folder_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, targets in _internal_edges().items():
        if module == PACKAGE:
            continue
        source = _folder(module)
        edges.setdefault(source, set())
        edges[source] |= {_folder(t) for t in targets if t != PACKAGE and _folder(t) != source}
    return edges


def test_the_dagster_kit_imports_no_wiring():
    """The kit stands between the wiring and the layers below: processing and the store."""
    below = ("dagster_kit", "processing", "media", "store", "values")
    assert _imports_outside("dagster_kit", below) == {}


def test_the_wiring_shares_its_dagster_vocabulary_through_the_kit():
    """ops/ holds ops only: sensors, assets, resources and the schedules import none of it but
    the instance-pruning probe the schedule shares with its op."""
    importers = {
        _relative(path): sorted(name for name in _package_names(module) if _in(name, "ops"))
        for module, path in MODULES.items()
        if _in(module, "sensors", "assets", "resources", "dagster_kit")
    }
    assert {path: names for path, names in importers.items() if names} == {}
    assert _folder_edges()["ops"] >= {"dagster_kit"}
    for folder in ("sensors", "assets", "resources", "schedules"):
        assert "dagster_kit" in _folder_edges()[folder], folder


def test_the_package_has_no_cycle_between_its_folders():
    assert _find_cycle(_folder_edges()) is None


def _private_dagster_uses(path: Path) -> list[str]:
    """`dagster._…` named anywhere in the module's text: imports, patch targets, config."""
    return sorted(set(re.findall(r"\bdagster\._[\w.]*", path.read_text("utf-8"))))


def test_only_the_quarantined_module_uses_dagster_internals():
    outside = {
        _relative(path): found
        for path in MODULES.values()
        if _relative(path) != QUARANTINE and (found := _private_dagster_uses(path))
    }
    assert outside == {}
    assert _private_dagster_uses(ROOT / QUARANTINE), "the quarantine lists what it wraps"


def _dagster_base_privates(node: ast.ClassDef) -> set[str]:
    """The private attributes of the Dagster classes a class derives from (`dg.X`)."""
    import dagster

    found: set[str] = set()
    for base in node.bases:
        if (
            isinstance(base, ast.Attribute)
            and isinstance(base.value, ast.Name)
            and base.value.id in ("dg", "dagster")
        ):
            base_class = getattr(dagster, base.attr)
            found |= {name for name in dir(base_class) if _is_private(name)}
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_class_outside_the_quarantine_overrides_a_private_dagster_method():
    overrides = {
        (_relative(path), node.name, item.name)
        for path in MODULES.values()
        if _relative(path) != QUARANTINE
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name in _dagster_base_privates(node)
    }
    assert overrides == set()


def test_the_private_override_check_sees_an_override():
    source = "class R(dg.ConfigurableResource):\n    def _with_updated_values(self, v): ...\n"
    node = ast.parse(source).body[0]
    assert "_with_updated_values" in _dagster_base_privates(node)


def _private_uses_across_modules(path: Path) -> set[str]:
    """`Name._private` where `Name` was imported from another module of the package."""
    tree = _tree(path)
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE)
        for alias in node.names
    }
    return {
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in imported
        and _is_private(node.attr)
    }


def test_no_module_reaches_into_another_modules_private_names():
    found = {
        _relative(path): sorted(uses)
        for path in MODULES.values()
        if (uses := _private_uses_across_modules(path))
    }
    assert found == {}


def test_the_private_use_check_sees_a_private_method_of_an_imported_class(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        f"from {PACKAGE}.store.work.repository import WorkRepository\n"
        "WorkRepository._operator_rows(None)\n"
    )
    assert _private_uses_across_modules(module) == {"WorkRepository._operator_rows"}


def test_processing_reaches_no_wiring_even_transitively():
    edges = _internal_edges()
    reached, frontier = set(), [m for m in MODULES if _in(m, "processing")]
    while frontier:
        for target in edges[frontier.pop()] - reached:
            reached.add(target)
            frontier.append(target)
    wiring = sorted(m for m in reached if _in(m, *WIRING, "dagster_kit", "emdash_double"))
    assert wiring == []
