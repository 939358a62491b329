"""The package's layers: each folder imports only the folders below it in the declared order.

Every import counts: at a module's top, inside a function, and for types only. A planted upward
import is found, so the check can fail.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import cgguard

PACKAGE = Path(cgguard.__file__).parent

# Lowest first. Each tier holds units that import only from the tiers below it and from
# themselves: a unit is a folder, or a module at the package's top. Units sharing a tier may not
# import each other. docs/architecture.md draws the same order.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "_errors"),  # what cgguard is: its version and its exceptions
    ("_support",),
    ("_boot",),
    ("_rules",),
    ("_config",),
    ("_data",),
    ("_gate",),
    ("_reporting",),
    ("_core",),
    ("_inspect", "_census", "_ranks"),  # the features, each on the core, none on another
    ("_process",),  # the process's state, in one owner
    ("_install", "_switch"),  # the composition root, and the capture flag as the program sets it
    ("_commands",),
    ("__init__",),  # the public face
    ("testing",),
    ("_activation", "_startup"),
    ("pytest_plugin", "__main__"),
)
TIER = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """The unit a module of the package belongs to: ``cgguard._gate.flags`` -> ``_gate``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, name: str) -> list[tuple[int, str]]:
    """Every module of the package that ``path`` (the module ``name``) imports, with its line:
    at the top, in functions and under TYPE_CHECKING alike."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # ``from cgguard._gate import flags`` imports the module cgguard._gate.flags.
            targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
        else:
            continue
        found += [(node.lineno, t) for t in targets if t == "cgguard" or t.startswith("cgguard.")]
    return found


def modules(root: Path) -> dict[str, Path]:
    """The package's modules by name. A folder without ``__init__.py`` holds files the package
    ships, not modules of it (the bootstrap sitecustomize, run as a top-level module)."""
    return {
        module_name(path, root): path
        for path in sorted(root.rglob("*.py"))
        if all(
            (folder / "__init__.py").is_file()
            for folder in path.parents
            if root in [*folder.parents, folder]
        )
    }


def upward_imports(root: Path) -> list[str]:
    """Each import in the package at ``root`` that reaches its own tier's sibling or a higher
    tier, or a unit the order does not declare, as ``file:line: from -> to``."""
    known = modules(root)
    problems: dict[str, None] = {}  # one line per import, however many names it takes
    for name, path in known.items():
        source = unit_of(name)
        for line, named in imported(path, name):
            target = named
            while target not in known:  # a name a module defines: ``from cgguard import activate``
                target = target.rpartition(".")[0]
            into = unit_of(target)
            where = f"{path.relative_to(root.parent)}:{line}: {source} -> {into} ({target})"
            if source not in TIER or into not in TIER:
                problems[f"{where}: not in the declared order"] = None
            elif into != source and TIER[into] >= TIER[source]:
                problems[where] = None
    return list(problems)


def test_every_import_runs_down_the_declared_order() -> None:
    """No module imports one of a higher layer, or of a sibling in its own layer."""
    assert upward_imports(PACKAGE) == []


def test_every_unit_of_the_package_is_declared() -> None:
    """Each folder and each module at the package's top has its place in the order."""
    units = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()
    }
    assert units == set(TIER)


@pytest.mark.parametrize(
    ("into", "planted", "expected"),
    [
        pytest.param(
            "_support/text.py",
            "\ndef _planted():\n    from cgguard._install import install\n",
            "_support -> _install (cgguard._install)",
            id="in-a-function",
        ),
        pytest.param(
            "_rules/checks.py",
            "\nif TYPE_CHECKING:\n    from cgguard._core.tracker import Tracker\n",
            "_rules -> _core (cgguard._core.tracker)",
            id="for-types-only",
        ),
        pytest.param(
            "_inspect/liveness.py",
            "\nfrom cgguard._census import compile_skips\n",
            "_inspect -> _census (cgguard._census.compile_skips)",
            id="a-sibling",
        ),
    ],
)
def test_a_planted_upward_import_is_found(
    tmp_path: Path, into: str, planted: str, expected: str
) -> None:
    """The check fails on an upward import, wherever in a module it is written."""
    copy = tmp_path / "cgguard"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / into
    text = target.read_text() + planted
    target.write_text(text)
    statement = next(line for line in planted.splitlines() if "import" in line)
    line = text.splitlines().index(statement) + 1
    assert upward_imports(copy) == [f"cgguard/{into}:{line}: {expected}"]


# A class past this many lines has grown more than one idea: split it at its seams.
LONGEST_CLASS = 350


def test_no_class_grows_past_its_bound() -> None:
    """Every class of the package is at most LONGEST_CLASS lines, docstrings and comments in."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_CLASS:
                    long.append(f"{path.relative_to(PACKAGE.parent)}: {node.name}, {lines} lines")
    assert long == []


def test_the_architecture_page_draws_the_declared_order() -> None:
    """docs/architecture.md's map lists the layers as they are declared here, tier by tier."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    table = page.split("| layer |", 1)[1].split("\n\n", 1)[0]
    drawn = [
        tuple(name.strip(" `/").removesuffix(".py") for name in row.split("|")[1].split(", "))
        for row in table.splitlines()[2:]
    ]
    assert drawn == list(LAYERS)
