"""The capture-site audit: every capture site in a framework's released source, against the
table in docs/audit/ that classifies each one.

A site is a call that captures, or makes what captures, found by Python's own parser (so a
comment or a docstring naming one is no site): ``torch.cuda.graph(...)`` however it is reached
(``cuda.graph``, ``torch.cuda.graphs.graph``, a ``graph`` imported from either), any other
``<x>.graph(...)`` (a device module's: ``torch.get_device_module(...).graph``), a
``...CUDAGraph(...)`` (``BreakableCUDAGraph`` too) or a call of a name bound to a ``CUDAGraph``
class (``graph_cls = torch.cuda.CUDAGraph``), ``.capture_begin(...)``,
``make_graphed_callables(...)``, and the compile modes and options that turn on inductor's
cudagraphs: the strings ``"reduce-overhead"`` and ``"max-autotune"`` (``torch.compile(mode=...)``,
or a mode assigned; both set ``triton.cudagraphs``, as ``torch._inductor.list_mode_options()``
shows), ``"triton.cudagraphs"`` (an ``options`` key) or ``triton.cudagraphs = ...`` (inductor's
config set), and ``"cudagraphs"`` (``backend="cudagraphs"``).
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
    "<device>.graph",
    "CUDAGraph",
    "capture_begin",
    "make_graphed_callables",
    "reduce-overhead",
    "max-autotune",
    "triton.cudagraphs",
    "cudagraphs",
)
# Strings that turn on inductor's cudagraphs, by the kind of site they are.
_STRINGS = {
    "reduce-overhead": "reduce-overhead",
    "max-autotune": "max-autotune",
    "triton.cudagraphs": "triton.cudagraphs",
    "cudagraphs": "cudagraphs",
}
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


def _names_graph_class(node: ast.AST) -> bool:
    """Whether ``node`` is a CUDAGraph class, or an ``if`` expression choosing one."""
    if isinstance(node, ast.IfExp):
        return _names_graph_class(node.body) or _names_graph_class(node.orelse)
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return isinstance(name, str) and name.endswith("CUDAGraph")


def _bound_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names bound to a CUDAGraph class (``graph_cls = torch.cuda.CUDAGraph``, or an
    attribute so set), and the local names of ``torch.cuda``'s ``graph``."""
    classes: set[str] = set()
    graphs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("torch.cuda", "torch.cuda.graphs"):
            graphs.update(a.asname or a.name for a in node.names if a.name == "graph")
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = node.value
            if not _names_graph_class(value):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    classes.add(target.id)
                elif isinstance(target, ast.Attribute):
                    classes.add(target.attr)
    return classes - {"CUDAGraph"}, graphs


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str, classes: set[str], graphs: set[str]) -> None:
        self.path = path
        self.scope: list[str] = []
        self.found: list[tuple[Site, int]] = []
        self.classes = classes
        self.graphs = graphs

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
        if isinstance(func, ast.Attribute) and name == "graph":
            owner = func.value
            held = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            kind = "torch.cuda.graph" if held in ("cuda", "graphs") else "<device>.graph"
            self._add(kind, node)
        elif isinstance(func, ast.Name) and name in self.graphs:
            self._add("torch.cuda.graph", node)
        elif name.endswith("CUDAGraph") or name in self.classes:
            self._add("CUDAGraph", node)
        elif name == "capture_begin":
            self._add("capture_begin", node)
        elif name == "make_graphed_callables":
            self._add("make_graphed_callables", node)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        kind = _STRINGS.get(node.value) if isinstance(node.value, str) else None
        if kind is not None:
            self._add(kind, node)

    def visit_Assign(self, node: ast.Assign) -> None:
        # torch._inductor.config.triton.cudagraphs = True
        for target in node.targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr == "cudagraphs"
                and isinstance(target.value, ast.Attribute)
                and target.value.attr == "triton"
            ):
                self._add("triton.cudagraphs", node)
        self.generic_visit(node)


def scan_source(path: str, source: str | bytes) -> list[tuple[Site, int]]:
    """The sites of one file, each with its line."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # not Python this interpreter reads (a template, say): no site it can run
    finder = _Finder(path, *_bound_names(tree))
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
