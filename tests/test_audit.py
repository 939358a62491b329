"""The capture-site audit (tests/capture_audit.py and docs/audit/): the scanner finds each site,
the tables' classifications name what the built-in profiles hold, and the real wheels match.

The wheel scans are marked ``frameworks`` (deselected by default): they read the wheels from
``$FRAMEWORKS_CACHE/wheels`` (docs/integrations.md#the-audit-of-capture-sites says how to fill it).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
from capture_audit import Site, problems, read_table, scan, scan_source

from cgguard._gate.profiles import PROFILES

AUDIT = Path(__file__).parent.parent / "docs" / "audit"
TABLES = {"vllm": AUDIT / "vllm-0.33.0.md", "sglang": AUDIT / "sglang-0.5.23.md"}
WHEELS = {"vllm": "vllm-0.33.0-*.whl", "sglang": "sglang-0.5.23-*.whl"}

RUNNER = '''\
"""A runner: torch.cuda.graph( in a docstring is no site."""
import torch


class Runner:
    def capture_model(self):
        graph = torch.cuda.CUDAGraph()
        # torch.cuda.graph(graph) in a comment is no site either
        with torch.cuda.graph(graph):
            pass


def compiled(fn):
    return torch.compile(fn, mode="reduce-overhead")
'''

PLUGIN = """\
def lazy(graph):
    graph.capture_begin()
"""

TABLE = """\
Some text first.

| file | function | kind | count | lines | class | by | why |
| --- | --- | --- | --- | --- | --- | --- | --- |
| `fw/runner.py` | `Runner.capture_model` | `CUDAGraph` | 1 | 7 | window | `fw.w:R.c` | in |
| `fw/runner.py` | `Runner.capture_model` | `torch.cuda.graph` | 1 | 9 | window | `fw.w:R.c` | in |
| `fw/runner.py` | `compiled` | `reduce-overhead` | 1 | 14 | exempt | `fw.runner` | on purpose |
"""

PLUGIN_ROW = "| `fw/plugin.py` | `lazy` | `capture_begin` | 1 | 2 | reported | - | a plugin |\n"


def _tree(root: Path) -> Path:
    (root / "fw").mkdir(parents=True)
    (root / "fw" / "runner.py").write_text(RUNNER)
    (root / "fw" / "plugin.py").write_text(PLUGIN)
    return root


def test_the_scanner_finds_each_kind_of_site_and_no_text() -> None:
    """Calls and the reduce-overhead string are sites, by file, function and kind; a docstring or
    a comment naming one is not."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        found = scan(_tree(Path(folder)), "fw")
    assert found == {
        Site("fw/plugin.py", "lazy", "capture_begin"): [2],
        Site("fw/runner.py", "Runner.capture_model", "CUDAGraph"): [7],
        Site("fw/runner.py", "Runner.capture_model", "torch.cuda.graph"): [9],
        Site("fw/runner.py", "compiled", "reduce-overhead"): [14],
    }


EVERY_FORM = """\
import torch
from torch import cuda
from torch.cuda import graph as cuda_graph


def reached(g, x, xpu):
    with cuda.graph(g):
        pass
    with cuda_graph(g):
        pass
    with torch.cuda.graphs.graph(g):
        pass
    with torch.get_device_module(x.device).graph(g):
        pass
    graph_cls = torch.xpu.XPUGraph if xpu else torch.cuda.CUDAGraph
    graph_cls()
    original_end = torch.cuda.CUDAGraph.capture_end  # a method, not a graph class
    original_end(g)


def compiled(f):
    torch.compile(f, mode="max-autotune")
    torch.compile(f, mode="max-autotune-no-cudagraphs")
    torch.compile(f, options={"triton.cudagraphs": True})
    torch.compile(f, backend="cudagraphs")
    torch._inductor.config.triton.cudagraphs = True
"""


def test_the_scanner_finds_every_way_to_reach_a_capture() -> None:
    """torch.cuda.graph however imported or reached, a device module's graph, a call of a name
    bound to a CUDAGraph class, and each compile mode or option that turns on cudagraphs."""
    assert scan_source("fw/every.py", EVERY_FORM) == [
        (Site("fw/every.py", "reached", "torch.cuda.graph"), 7),
        (Site("fw/every.py", "reached", "torch.cuda.graph"), 9),
        (Site("fw/every.py", "reached", "torch.cuda.graph"), 11),
        (Site("fw/every.py", "reached", "<device>.graph"), 13),
        (Site("fw/every.py", "reached", "CUDAGraph"), 16),
        (Site("fw/every.py", "compiled", "max-autotune"), 22),
        (Site("fw/every.py", "compiled", "triton.cudagraphs"), 24),
        (Site("fw/every.py", "compiled", "cudagraphs"), 25),
        (Site("fw/every.py", "compiled", "triton.cudagraphs"), 26),
    ]


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "wheel"])
def test_a_doctored_package_fails_on_its_one_unclassified_site(
    tmp_path: Path, packed: bool
) -> None:
    """A package with one site the table lacks fails, naming that site; with its row added, it
    passes; a row whose site is gone, or a count that changed, fails too."""
    archive: Path = _tree(tmp_path / "tree")
    if packed:
        wheel = tmp_path / "fw-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as packing:
            for path in sorted((archive / "fw").iterdir()):
                packing.write(path, f"fw/{path.name}")
        archive = wheel
    sites = scan(archive, "fw")

    def table(*rows: str) -> str:
        # Text after the table is not read as rows.
        return TABLE + "".join(rows) + "\nText after the table.\n" + PLUGIN_ROW

    lacking = problems(sites, read_table(table()))
    complete = problems(sites, read_table(table(PLUGIN_ROW)))
    stale = problems(sites, read_table(table(PLUGIN_ROW, PLUGIN_ROW.replace("`lazy`", "`gone`"))))
    miscounted = problems(sites, read_table(table(PLUGIN_ROW.replace("| 1 |", "| 2 |"))))
    assert (lacking, complete, stale, miscounted) == (
        ["not classified: fw/plugin.py lazy capture_begin (line 2)"],
        [],
        ["no such site any more: fw/plugin.py gone capture_begin"],
        ["counted 2, found 1: fw/plugin.py lazy capture_begin (line 2)"],
    )


@pytest.mark.parametrize("framework", sorted(TABLES))
def test_each_tables_windows_and_exemptions_are_the_profiles(framework: str) -> None:
    """A row classified window names one of its profile's windows; exempt, one of its built-in
    exemptions whose module holds the site's file; every other row names nothing."""
    (profile,) = [p for p in PROFILES if p.name == framework]
    windows = {w.entry for w in profile.windows}
    places = {place for _, place in profile.exempt}
    wrong = []
    for row in read_table(TABLES[framework].read_text()):
        module = row.site.path.removesuffix(".py").replace("/", ".")
        if row.classified == "window":
            ok = row.by in windows
        elif row.classified == "exempt":
            held = row.by.partition(":")[0]  # a function place's module
            ok = row.by in places and (module == held or module.startswith(held + "."))
        else:
            ok = row.by == "-"
        if not ok:
            wrong.append(row.site)
    assert wrong == []


def _cache() -> Path:
    found = os.environ.get("FRAMEWORKS_CACHE")
    if not found:
        pytest.skip("FRAMEWORKS_CACHE is not set: the folder of the downloaded framework wheels")
    return Path(found)


@pytest.mark.frameworks
@pytest.mark.parametrize("framework", sorted(TABLES))
def test_the_real_wheel_has_no_site_its_table_does_not_classify(framework: str) -> None:
    """Every capture site in the released wheel's source is classified, counted as found."""
    wheels = sorted((_cache() / "wheels").glob(WHEELS[framework]))
    if not wheels:
        pytest.skip(f"no {WHEELS[framework]} in $FRAMEWORKS_CACHE/wheels")
    sites = scan(wheels[-1], framework)
    assert (problems(sites, read_table(TABLES[framework].read_text())), bool(sites)) == ([], True)


def _defines(source: str, qualname: str) -> bool:
    """Whether ``source`` defines ``qualname`` (``Class.method`` or ``function``) at its top."""
    import ast

    scope: list[ast.stmt] = ast.parse(source).body
    *owners, name = qualname.split(".")
    for owner in owners:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == owner]
        if not found:
            return False
        scope = found[0].body
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return any(isinstance(n, kinds) and n.name == name for n in scope)


@pytest.mark.frameworks
@pytest.mark.parametrize("framework", sorted(TABLES))
def test_each_lifecycle_function_is_defined_in_the_real_wheel(framework: str) -> None:
    """Every lifecycle function the profile names is defined, where it says, in the released
    wheel's source (read, not imported: SGLang's runner modules need more than CPU torch)."""
    wheels = sorted((_cache() / "wheels").glob(WHEELS[framework]))
    if not wheels:
        pytest.skip(f"no {WHEELS[framework]} in $FRAMEWORKS_CACHE/wheels")
    (profile,) = [p for p in PROFILES if p.name == framework]
    missing = []
    with zipfile.ZipFile(wheels[-1]) as wheel:
        names = set(wheel.namelist())
        for entry in profile.lifecycle:
            module, _, qualname = entry.partition(":")
            path = module.replace(".", "/") + ".py"
            source = wheel.read(path).decode() if path in names else ""
            if not _defines(source, qualname):
                missing.append(entry)
    assert (missing, len(profile.lifecycle) > 0) == ([], True)


def test_the_definition_check_tells_a_method_from_a_missing_one() -> None:
    """The check the wheel test rests on: a method of a class is found, a missing one and one
    of another class are not."""
    source = "class A:\n    def f(self): ...\n    async def g(self): ...\nclass B:\n    pass\n"
    found = [_defines(source, q) for q in ("A.f", "A.g", "A.h", "B.f", "f")]
    assert found == [True, True, False, False, False]
