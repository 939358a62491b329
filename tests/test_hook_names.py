"""Every name the package hands to Python as text leads to what it names.

Hooks named ``"module:function"``, the ``.pth`` line, the sitecustomize files, the entry points
and the lazy faces' tables are resolved by Python only when they fire: a name that a move left
behind would leave programs silently unguarded. Each is imported here, and a planted bad name
is found, so the check can fail.
"""

from __future__ import annotations

import ast
import importlib
import re
import shutil
from pathlib import Path

import pytest

import cgguard

PACKAGE = Path(cgguard.__file__).parent
REPO = PACKAGE.parent
_HOOK = re.compile(r"cgguard(\.\w+)*:\w+(\.\w+)*")


def hook_strings(package: Path) -> list[tuple[str, str]]:
    """Each ``"module:function"`` string constant of the package's code, with its place."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _HOOK.fullmatch(node.value)
            ):
                found.append((f"{path.relative_to(package.parent)}:{node.lineno}", node.value))
    return found


def face_names(package: Path) -> list[tuple[str, str]]:
    """What each lazy face (``_HOMES``: name -> module) hands out, as ``module:name``."""
    found = []
    for path in sorted(package.rglob("__init__.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_HOMES":
                homes = ast.literal_eval(node.value)
                where = f"{path.relative_to(package.parent)}:{node.lineno}"
                found += [(where, f"{module}:{name}") for name, module in homes.items()]
    return found


def start_up_names(repo: Path) -> list[tuple[str, str]]:
    """What the .pth line, the sitecustomize files and the entry points name."""
    found = []
    line = (repo / "cgguard.pth").read_text()
    for module, attribute in re.findall(r'__import__\("([\w.]+)"\)\.(\w+)\(', line):
        found.append(("cgguard.pth", f"{module}:{attribute}"))
    for path in (repo / "sitecustomize_example", repo / "cgguard" / "_sitecustomize"):
        source = path / "sitecustomize.py"
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cgguard"):
                where = str(source.relative_to(repo))
                found += [(where, f"{node.module}:{alias.name}") for alias in node.names]
    # The entry-point tables, read as lines (tomllib is Python 3.11's): name = "target".
    table = None
    for line in (repo / "pyproject.toml").read_text().splitlines():
        if line.startswith("["):
            table = (
                line.strip("[]")
                if line.startswith(("[project.scripts", "[project.entry"))
                else None
            )
        elif table is not None and "=" in line:
            target = line.partition("=")[2].strip().strip('"')
            found.append((f"pyproject.toml [{table}]", target))
    return found


def unresolved(names: list[tuple[str, str]], *, called: bool = True) -> list[str]:
    """Each name that does not lead to something (``called``: to something callable), as
    ``place: name: why``."""
    problems = []
    for where, name in names:
        module, _, attribute = name.partition(":")
        try:
            value: object = importlib.import_module(module)
            for part in attribute.split(".") if attribute else ():
                value = getattr(value, part)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{where}: {name}: {exc}")
            continue
        if called and attribute and not callable(value):
            problems.append(f"{where}: {name}: not callable")
    return problems


def test_every_name_the_package_hands_to_python_resolves() -> None:
    """Hooks, faces, the .pth line, the sitecustomize files and the entry points all lead
    somewhere callable."""
    called = hook_strings(PACKAGE) + start_up_names(REPO)
    faces = face_names(PACKAGE)  # a face hands out values too: the version, say
    kinds = {where.split(":")[0].split(" ")[0] for where, _ in called + faces}
    assert unresolved(called) + unresolved(faces, called=False) == []
    # Each kind of place was read: an empty collection would pass for the wrong reason.
    assert {
        "cgguard/_boot.py",
        "cgguard/__init__.py",
        "cgguard.pth",
        "sitecustomize_example/sitecustomize.py",
        "cgguard/_sitecustomize/sitecustomize.py",
        "pyproject.toml",
    } <= kinds


def test_a_planted_bad_hook_string_is_found(tmp_path: Path) -> None:
    """A hook named after a module or function that is not there fails the check."""
    copy = tmp_path / "cgguard"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "_census" / "compile_skips.py"
    target.write_text(target.read_text() + '\nLATER = "cgguard._census.compile_skips:gone"\n')
    line = len(target.read_text().splitlines())
    planted = [item for item in hook_strings(copy) if "gone" in item[1]]
    assert planted == [
        (f"cgguard/_census/compile_skips.py:{line}", "cgguard._census.compile_skips:gone")
    ]
    assert unresolved(planted) == [
        f"cgguard/_census/compile_skips.py:{line}: cgguard._census.compile_skips:gone: "
        "module 'cgguard._census.compile_skips' has no attribute 'gone'"
    ]


@pytest.mark.parametrize(
    "name",
    ["cgguard._nowhere:activate", "cgguard._boot:nothing", "cgguard._boot:ENABLED"],
)
def test_a_name_that_leads_nowhere_is_reported(name: str) -> None:
    """A missing module, a missing function and a value that cannot be called are each found."""
    assert len(unresolved([("planted", name)])) == 1
