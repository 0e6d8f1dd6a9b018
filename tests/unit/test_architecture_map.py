"""`docs/architecture.md` cannot drift: it lists every module of the package and no other, and
every EmDash entry point (every method of the three seed repositories, the lane, the processors,
the projection GC, the deletion request, activation and the usage route) leads to a Python home
that exists, in one hop (`module.py: name`)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from tests.fixtures import SEEDS

PACKAGE = "media_usage_orchestration"
REPOSITORY = Path(__file__).resolve().parents[2]
ROOT = REPOSITORY / PACKAGE
MAP = REPOSITORY / "docs" / "architecture.md"
# EmDash's entry points besides the seed repositories' methods, by the names EmDash gives them.
ENTRY_POINTS = (
    "runScheduledMediaUsageLane",
    "processDueMediaUsageWork",
    "processMediaUsageWorkAfterWrite",
    "processDueMediaUsageReconciliation",
    "processDueMediaUsageCollectionDeletions",
    "cleanupMediaUsage",
    "SchemaRegistry.deleteCollection",
    "activateMediaUsageCapture",
    "GET /_emdash/api/media/[id]/usage",
)
_HOME = re.compile(r"`([\w/]+\.py): ([\w.]+)`")
_ROW = re.compile(r"^\| `([^`]+)`[^|]*\| (.+) \|$")


def _section(title: str) -> str:
    text = MAP.read_text("utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _map_rows() -> dict[str, str]:
    """EmDash name → the Python home cell of its row."""
    rows = {}
    for line in _section("From an EmDash name to its Python home").splitlines():
        match = _ROW.match(line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} has two rows"
            rows[match.group(1)] = match.group(2)
    return rows


def _listed_modules() -> list[str]:
    return re.findall(r"^\| `([\w/]+\.py)` \|", _section("Modules, one line each"), re.M)


def _package_modules() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*.py")
        if path.name != "__init__.py"
    }


def seed_names(text: str) -> list[str]:
    """`Class.method` for every method of the seed's exported classes (not the constructor),
    and the name of every exported function. The seeds are diffs: every line starts with +."""
    lines = [line[1:] for line in text.splitlines() if line.startswith("+")]
    names, current = [], None
    for line in lines:
        if match := re.match(r"export class (\w+)", line):
            current = match.group(1)
        elif current and line.startswith("}"):
            current = None
        elif current and (
            match := re.match(
                r"\t(?:(?:private|public|protected|static|async|readonly)\s+)*(\w+)\s*(?:<[^>]*>)?\(",
                line,
            )
        ):
            if match.group(1) != "constructor":
                names.append(f"{current}.{match.group(1)}")
        elif match := re.match(r"export (?:async )?function (\w+)", line):
            names.append(match.group(1))
    return names


def _resolves(module_path: str, name: str) -> bool:
    module = importlib.import_module(
        f"{PACKAGE}." + module_path.removesuffix(".py").replace("/", ".")
    )
    target = module
    for part in name.split("."):
        if not hasattr(target, part):
            return False
        target = getattr(target, part)
    return True


def test_the_map_lists_every_module_of_the_package_once_and_no_other():
    listed = _listed_modules()
    assert sorted(set(listed)) == sorted(listed), "a module is listed twice"
    assert set(listed) == _package_modules()


def test_the_seed_reader_finds_the_seeds_classes_and_their_methods():
    names = [name for seed in SEEDS for name in seed_names(seed.read_text("utf-8"))]
    assert len(names) == len(set(names)) > 60
    assert "MediaUsageWorkRepository.claimWork" in names
    assert "MediaUsageReconciliationRepository.finalizeCoverage" in names
    assert "MediaUsageCollectionDeletionRepository.deleteRegistryAndCheckpoint" in names
    assert "deleteActivatedMediaUsageCollection" in names
    assert not [name for name in names if name.endswith(".constructor")]


@pytest.mark.parametrize("seed", SEEDS, ids=lambda path: path.name.removesuffix(".txt"))
def test_every_method_of_the_seed_leads_to_its_python_home(seed):
    rows = _map_rows()
    assert [name for name in seed_names(seed.read_text("utf-8")) if name not in rows] == []


def test_every_emdash_entry_point_leads_to_its_python_home():
    rows = _map_rows()
    assert [name for name in ENTRY_POINTS if name not in rows] == []


def test_every_python_home_in_the_map_exists():
    rows = _map_rows()
    homes = {name: _HOME.findall(cell) for name, cell in rows.items()}
    assert [name for name, found in homes.items() if not found] == [], "rows without a home"
    missing = [
        f"{name} → {module}: {attribute}"
        for name, found in homes.items()
        for module, attribute in found
        if not (ROOT / module).is_file() or not _resolves(module, attribute)
    ]
    assert missing == []


def _package_docstring_caption(package: Path) -> str:
    """The first paragraph of a package's docstring, on one line."""
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text("utf-8")))
    assert docstring, f"{package} has no docstring"
    return " ".join(docstring.split("\n\n")[0].split())


def _map_captions() -> dict[str, str]:
    """Folder → the paragraph under its `### \\`folder/\\`` heading in the modules section."""
    section = _section("Modules, one line each")
    found = re.findall(r"^### `([\w/]+/)`\n\n(.+?)\n\n", section, re.M | re.S)
    return {folder: " ".join(caption.split()) for folder, caption in found}


def _packages() -> dict[str, Path]:
    packages = {f"{PACKAGE}/": ROOT}
    for init in ROOT.rglob("__init__.py"):
        if init.parent != ROOT:
            packages[init.parent.relative_to(ROOT).as_posix() + "/"] = init.parent
    return packages


def test_every_folder_has_its_caption_and_it_is_its_package_docstring():
    captions = _map_captions()
    packages = _packages()
    assert set(captions) == set(packages)
    differing = {
        folder: (captions[folder], _package_docstring_caption(path))
        for folder, path in packages.items()
        if captions[folder] != _package_docstring_caption(path)
    }
    assert differing == {}


def test_each_module_is_listed_under_its_own_folder():
    section = _section("Modules, one line each")
    current, misplaced = None, []
    for line in section.splitlines():
        if heading := re.match(r"^### `([\w/]+/)`", line):
            current = heading.group(1)
        elif row := re.match(r"^\| `([\w/]+\.py)` \|", line):
            folder = row.group(1).rpartition("/")[0] + "/" if "/" in row.group(1) else None
            if folder != (current if current != f"{PACKAGE}/" else None):
                misplaced.append(row.group(1))
    assert misplaced == []


# A room's records, guards and statements are read through its repository's conformance file.
NOT_REPOSITORY_MODULES = {"records.py", "guards.py", "statements.py"}


def test_every_repository_module_has_its_conformance_file():
    conformance = REPOSITORY / "tests" / "conformance"
    missing = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "store").rglob("*.py")
        if path.name != "__init__.py"
        and path.name not in NOT_REPOSITORY_MODULES
        and path.parent.name != "core"
        and not (conformance / path.parent.name / f"test_{path.name}").is_file()
    )
    assert missing == []
