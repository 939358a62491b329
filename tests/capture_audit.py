"""The capture-site audit: every capture site in a framework's released source, against the
table in docs/audit/ that classifies each one.

A site is a call that captures, or makes what captures, found by Python's own parser (so a
comment or a docstring naming one is no site): ``torch.cuda.graph(...)``, a ``...CUDAGraph(...)``
(``BreakableCUDAGraph`` too), ``.capture_begin(...)``, ``make_graphed_callables(...)``, and the
string ``"reduce-overhead"`` (``torch.compile(mode="reduce-overhead")``, or a mode assigned).
Sites are keyed by file, enclosing function and kind, and counted, so that a line moved within a
function is no change, while a site added, moved to another function or removed is.

Run as ``python tests/capture_audit.py WHEEL TABLE`` to print the sites the table lacks.
"""

from __future__ import annotations

import ast
import sys
import zipfile
from collections import Counter
from pathlib import Path
from typing import NamedTuple

KINDS = (
    "torch.cuda.graph",
    "CUDAGraph",
    "capture_begin",
    "make_graphed_callables",
    "reduce-overhead",
)
CLASSES = ("window", "exempt", "reported", "unreached")


class Site(NamedTuple):
    path: str  # inside the package: vllm/v1/worker/gpu/cudagraph_utils.py
    function: str  # the enclosing qualname, or <module>
    kind: str


class Row(NamedTuple):
    site: Site
    count: int
    lines: str  # where, for people; not compared
    classified: str  # one of CLASSES
    by: str  # the window entry or exemption place; "-" for reported
    why: str


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.scope: list[str] = []
        self.found: list[tuple[Site, int]] = []

    def _add(self, kind: str, node: ast.AST) -> None:
        function = ".".join(self.scope) or "<module>"
        self.found.append((Site(self.path, function, kind), getattr(node, "lineno", 0)))

    def _scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        body = node.body
        # A docstring is text, not a site.
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        for child in [*node.decorator_list, *body]:
            self.visit(child)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _scoped  # noqa: N815

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if (
            name == "graph"
            and isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Attribute)
            and func.value.attr == "cuda"
        ):
            self._add("torch.cuda.graph", node)
        elif name.endswith("CUDAGraph"):
            self._add("CUDAGraph", node)
        elif name == "capture_begin":
            self._add("capture_begin", node)
        elif name == "make_graphed_callables":
            self._add("make_graphed_callables", node)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if node.value == "reduce-overhead":
            self._add("reduce-overhead", node)


def scan_source(path: str, source: str | bytes) -> list[tuple[Site, int]]:
    """The sites of one file, each with its line."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # not Python this interpreter reads (a template, say): no site it can run
    finder = _Finder(path)
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    for node in body:
        finder.visit(node)
    return finder.found


def scan(archive: str | Path, package: str) -> dict[Site, list[int]]:
    """Every site in the wheel (or folder) ``archive``'s ``package``, with its lines."""
    sites: dict[Site, list[int]] = {}
    for path, source in _sources(Path(archive), package):
        for site, line in scan_source(path, source):
            sites.setdefault(site, []).append(line)
    return sites


def _sources(archive: Path, package: str) -> list[tuple[str, bytes]]:
    if archive.is_dir():
        return [
            (str(p.relative_to(archive)), p.read_bytes())
            for p in sorted((archive / package).rglob("*.py"))
        ]
    with zipfile.ZipFile(archive) as wheel:
        return [
            (name, wheel.read(name))
            for name in sorted(wheel.namelist())
            if name.startswith(package + "/") and name.endswith(".py")
        ]


def read_table(text: str) -> list[Row]:
    """The rows of the audit table in a docs/audit/ page: the one table whose header starts
    ``| file | function | kind |``."""
    rows: list[Row] = []
    in_table = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if "|" in line else []
        if cells[:3] == ["file", "function", "kind"]:
            in_table = True
            continue
        if not in_table:
            continue
        if not cells:
            break
        if set(cells[0]) <= {"-", ":"}:
            continue
        path, function, kind, count, lines, classified, by, why = cells
        rows.append(
            Row(
                Site(_unquote(path), _unquote(function), _unquote(kind)),
                int(count),
                lines,
                classified,
                _unquote(by),
                why,
            )
        )
    return rows


def _unquote(cell: str) -> str:
    return cell.strip("`").replace("\\|", "|")


def problems(sites: dict[Site, list[int]], rows: list[Row]) -> list[str]:
    """What the table gets wrong about ``sites``: each site it does not classify (or counts
    wrongly), each row for a site that is gone, each classification it does not allow."""
    found = Counter({site: len(lines) for site, lines in sites.items()})
    listed = {row.site: row for row in rows}
    lines: list[str] = []
    for site, count in sorted(found.items()):
        row = listed.get(site)
        where = ", ".join(str(n) for n in sites[site])
        if row is None:
            lines.append(f"not classified: {site.path} {site.function} {site.kind} (line {where})")
        elif row.count != count:
            lines.append(
                f"counted {row.count}, found {count}: {site.path} {site.function} {site.kind} "
                f"(line {where})"
            )
    for site in sorted(set(listed) - set(found)):
        lines.append(f"no such site any more: {site.path} {site.function} {site.kind}")
    for row in rows:
        if row.classified not in CLASSES:
            lines.append(f"{row.classified!r} is not one of {', '.join(CLASSES)}: {row.site}")
        if row.site.kind not in KINDS:
            lines.append(f"{row.site.kind!r} is not one of {', '.join(KINDS)}: {row.site}")
    return lines


def main(argv: list[str]) -> int:
    archive, table = argv
    package = Path(archive).name.split("-")[0]
    rows = read_table(Path(table).read_text())
    found = problems(scan(archive, package), rows)
    print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
