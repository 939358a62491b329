"""End to end: exemptions let named code break a rule, counted, while the rule holds elsewhere.

The modules that capture are real files written into the test's folder and imported, so that
their frames carry real module names, files and qualnames. Each scenario runs on cgguard's
simulated CUDA runtime, and again on a real GPU where one exists.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

import pytest
import torch
from helpers import SourceFile

import cgguard
from cgguard import _process
from cgguard._support.frames import Stack

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path
    from types import ModuleType

    from tests.conftest import Runtime

    Make = Callable[[str, str], ModuleType]

# A library that captures through a helper of its own: the capture's innermost frame is the
# helper, the library's entry point is further out.
KERNELS = """\
import torch


def _capture(graph):
    with torch.cuda.graph(graph):  # @capture
        pass


class Kernel:
    def run(self):
        graph = torch.cuda.CUDAGraph()
        _capture(graph)  # @run
        return graph

    def other(self):
        graph = torch.cuda.CUDAGraph()
        _capture(graph)  # @other
        return graph
"""

# Captures through a helper module of someone else's.
CALLS_HELPER = """\
import torch

from {helper} import capture


def run():
    capture(torch.cuda.CUDAGraph())  # @calls-helper
"""

HELPER = """\
import torch


def capture(graph):
    with torch.cuda.graph(graph):  # @helper-captures
        pass
"""

# A nested capture of its own, opened the raw way on a stream of its own.
NESTS = """\
import torch


def nest():
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        graph.capture_begin(capture_error_mode="thread_local")  # @nested-begin
        graph.capture_end()
"""


@pytest.fixture
def make_module(tmp_path: Path) -> Iterator[Make]:
    """Write a module (dotted names make packages) into tmp_path and import it; forgotten after."""
    made: list[str] = []
    sys.path.insert(0, str(tmp_path))  # conftest puts sys.path back

    def make(name: str, source: str) -> ModuleType:
        *packages, leaf = name.split(".")
        folder = tmp_path
        for package in packages:
            folder = folder / package
            folder.mkdir(exist_ok=True)
            (folder / "__init__.py").touch()
        (folder / f"{leaf}.py").write_text(source)
        importlib.invalidate_caches()
        made.append(name)
        return importlib.import_module(name)

    yield make
    for name in made:
        for module in [n for n in sys.modules if n == name or n.startswith(name + ".")]:
            del sys.modules[module]
        package = name
        while "." in package:
            package = package.rpartition(".")[0]
            sys.modules.pop(package, None)


def install(exempt: object = (), **kwargs: Any) -> None:
    cgguard.install(cgguard.Config(exempt=exempt, log_format="json", **kwargs))  # type: ignore[arg-type]


def test_exempted_module_captures_while_capture_is_disabled(
    runtime: Runtime, make_module: Make, events: list[dict[str, Any]]
) -> None:
    """A module prefix lets its own captures through in raise mode, counted as exempted; the
    same code in another module is refused as before."""
    exempted = make_module("exempt_plugin_a.kernels", KERNELS)
    other = make_module("exempt_other_a", KERNELS)
    install("capture_disabled=exempt_plugin_a.")
    with cgguard.capture_disabled():
        graph = exempted.Kernel().run()
        with pytest.raises(cgguard.CaptureDisabledError):
            other.Kernel().run()
    graph.replay()  # captured for real: replay of an un-captured graph errors
    status = cgguard.status()
    assert ([e["rule"] for e in events], status.violations, status.exempted) == (
        ["capture_disabled"],
        {"capture_disabled": 1},
        {"capture_disabled": 1},
    )


def test_an_outer_frame_of_the_stack_matches(
    runtime: Runtime, make_module: Make, events: list[dict[str, Any]]
) -> None:
    """A library capturing through another module's helper is still that library; the helper
    called from elsewhere is not exempted."""
    make_module("exempt_helper_b", HELPER)
    caller = make_module("exempt_caller_b", CALLS_HELPER.format(helper="exempt_helper_b"))
    helper = sys.modules["exempt_helper_b"]
    install({"capture_disabled": ["exempt_caller_b"]})
    with cgguard.capture_disabled():
        caller.run()
        with pytest.raises(cgguard.CaptureDisabledError):
            helper.capture(torch.cuda.CUDAGraph())
    assert (len(events), cgguard.status().exempted) == (1, {"capture_disabled": 1})


def test_a_module_names_itself_and_what_is_below_it_only(
    runtime: Runtime, make_module: Make
) -> None:
    """``exempt_pkg_c`` covers exempt_pkg_c.kernels but not exempt_pkg_cx, whose name merely
    starts the same way."""
    below = make_module("exempt_pkg_c.kernels", KERNELS)
    alike = make_module("exempt_pkg_cx", KERNELS)
    install("capture_disabled=exempt_pkg_c")
    with cgguard.capture_disabled():
        below.Kernel().run()
        with pytest.raises(cgguard.CaptureDisabledError):
            alike.Kernel().run()


def test_function_form_names_one_method(runtime: Runtime, make_module: Make) -> None:
    """``module:qualname`` exempts captures made under that method, not under its neighbour."""
    kernels = make_module("exempt_func_d", KERNELS)
    install("capture_disabled=exempt_func_d:Kernel.run")
    with cgguard.capture_disabled():
        kernels.Kernel().run()
        with pytest.raises(cgguard.CaptureDisabledError):
            kernels.Kernel().other()
    assert cgguard.status().exempted == {"capture_disabled": 1}


def test_file_glob_form(runtime: Runtime, make_module: Make, tmp_path: Path) -> None:
    """A glob with a '/' matches a frame's file path; another file is not matched."""
    globbed = make_module("exempt_glob_e", KERNELS)
    other = make_module("exempt_plain_e", KERNELS)
    install("capture_disabled=*/exempt_glob_*.py")
    with cgguard.capture_disabled():
        globbed.Kernel().run()
        with pytest.raises(cgguard.CaptureDisabledError):
            other.Kernel().run()
    assert cgguard.status().exempted == {"capture_disabled": 1}


def test_exemption_names_its_rule_only(runtime: Runtime, make_module: Make) -> None:
    """A nested_capture exemption does not let the same module capture while disabled."""
    kernels = make_module("exempt_rule_f", KERNELS)
    install("nested_capture=exempt_rule_f")
    with cgguard.capture_disabled(), pytest.raises(cgguard.CaptureDisabledError):
        kernels.Kernel().run()
    assert cgguard.status().exempted == {}


def test_nested_capture_exempted(
    runtime: Runtime, make_module: Make, events: list[dict[str, Any]]
) -> None:
    """A module nesting a capture of its own goes ahead when exempted; elsewhere it is refused."""
    nests = make_module("exempt_nests_g", NESTS)
    other = make_module("exempt_nests_other_g", NESTS)
    install("nested_capture=exempt_nests_g:nest")
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer, capture_error_mode="thread_local"):
        nests.nest()
        with pytest.raises(cgguard.NestedCaptureError):
            other.nest()
    assert ([e["rule"] for e in events], cgguard.status().exempted) == (
        ["nested_capture"],
        {"nested_capture": 1},
    )


def test_concurrent_capture_exempted(
    runtime: Runtime, make_module: Make, events: list[dict[str, Any]]
) -> None:
    """With concurrent_capture raised, an exempted module's global capture beside another
    thread's goes ahead, and another module's is refused."""
    kernels = make_module("exempt_conc_h", KERNELS)
    other = make_module("exempt_conc_other_h", KERNELS)
    install("concurrent_capture=exempt_conc_h", rules={"concurrent_capture": "raise"})
    capturing, done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold_a_capture() -> None:
        try:
            # A stream of its own: torch.cuda.graph's default capture stream is one for all.
            graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                capturing.set()
                assert done.wait(timeout=20)
        except BaseException as exc:
            failures.append(exc)
            capturing.set()

    thread = threading.Thread(target=hold_a_capture)
    thread.start()
    try:
        assert capturing.wait(timeout=20)
        kernels.Kernel().run()
        with pytest.raises(cgguard.ConcurrentCaptureError):
            other.Kernel().run()
    finally:
        done.set()
        thread.join(timeout=20)
    assert (failures, [e["rule"] for e in events], cgguard.status().exempted) == (
        [],
        ["concurrent_capture"],
        {"concurrent_capture": 1},
    )


def test_exempted_from_many_threads_at_once_counts_each(
    runtime: Runtime, make_module: Make
) -> None:
    """Exempted captures on several threads at once are each counted, at one site."""
    # Thread-local captures: in global mode each torch.cuda.graph's own synchronize would fail
    # while another thread's capture is under way, as CUDA's does, whenever two overlap. Each on
    # a stream of its own: torch.cuda.graph's default capture stream is one for the process,
    # and a capture begun on a stream that already captures fails, as in CUDA.
    kernels = make_module(
        "exempt_threads_i",
        KERNELS.replace(
            "graph(graph)",
            'graph(graph, stream=torch.cuda.Stream(), capture_error_mode="thread_local")',
        ),
    )
    install("capture_disabled=exempt_threads_i")
    failures: list[BaseException] = []

    def capture_often() -> None:
        try:
            for _ in range(25):
                kernels.Kernel().run()
        except BaseException as exc:
            failures.append(exc)

    with cgguard.capture_disabled():
        threads = [threading.Thread(target=capture_often) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert (failures, cgguard.status().exempted) == ([], {"capture_disabled": 100})


def test_off_rule_is_not_counted_as_exempted(runtime: Runtime, make_module: Make) -> None:
    """A rule switched off is not broken at all: nothing is exempted."""
    kernels = make_module("exempt_off_j", KERNELS)
    install("capture_disabled=exempt_off_j", rules={"capture_disabled": "off"})
    with cgguard.capture_disabled():
        kernels.Kernel().run()
    assert (cgguard.status().violations, cgguard.status().exempted) == ({}, {})


def test_debug_event_once_per_site(runtime: Runtime, make_module: Make, tmp_path: Path) -> None:
    """The first exempted capture at a site is logged at debug level, with the exemption and
    the frame it matched; repeats there are counted, not logged."""
    kernels = make_module("exempt_log_k", KERNELS)
    make_module("exempt_log_helper_k", HELPER)
    caller = make_module("exempt_log_caller_k", CALLS_HELPER.format(helper="exempt_log_helper_k"))
    log = tmp_path / "events.jsonl"
    exempt = "capture_disabled=exempt_log_k;capture_disabled=exempt_log_caller_k:run"
    install(exempt, log_file=str(log))
    with cgguard.capture_disabled():
        for _ in range(3):
            kernels.Kernel().run()
        caller.run()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    # The stacks end with the library's frames; the test's and pytest's above them vary.
    tails = [line.pop("stack")[-2:] for line in lines]
    stamps = [line.pop("timestamp") for line in lines]
    kernels_file, helper_file = SourceFile(kernels.__file__), SourceFile(caller.__file__)
    helper_source = SourceFile(sys.modules["exempt_log_helper_k"].__file__)
    capture = kernels_file.frame("@capture", "_capture")
    helper_capture = helper_source.frame("@helper-captures", "capture")
    calls_helper = helper_file.frame("@calls-helper", "run")

    def event(exemption: str, matched: dict[str, Any], at: dict[str, Any]) -> dict[str, Any]:
        return {
            "event": "cgguard.capture_exempted",
            "level": "debug",
            "rule": "capture_disabled",
            "action": "exempted",
            "api": "torch.cuda.graph",
            "message": f"capture_disabled exempted by {exemption} (matched {where(matched)}): "
            f"torch.cuda.graph at {where(at)}",
            "count": 1,
            "thread": "MainThread",
            "thread_id": threading.get_ident(),
            "pid": os.getpid(),
            "exemption": exemption,
            "matched": matched,
        }

    expected = (
        [
            event("capture_disabled=exempt_log_k", capture, capture),
            # Matched further out than the capture's own line: the caller's frame.
            event("capture_disabled=exempt_log_caller_k:run", calls_helper, helper_capture),
        ],
        [[kernels_file.frame("@run", "run"), capture], [calls_helper, helper_capture]],
    )
    assert expected == (lines, tails)
    assert all(stamp.endswith("Z") for stamp in stamps)
    assert cgguard.status().exempted == {"capture_disabled": 4}


def where(frame: dict[str, Any]) -> str:
    return f"{frame['file']}:{frame['line']} (in {frame['function']})"


def test_malformed_entry_warns_and_the_rest_applies(
    runtime: Runtime, make_module: Make, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed CGGUARD_EXEMPT entry and an unknown rule are one warning each, naming the
    entry (and the rules accepted); the good entry between them still applies."""
    kernels = make_module("exempt_env_l", KERNELS)
    environ = {
        "CGGUARD_EXEMPT": "capture_disabled ; capture_disabled=exempt_env_l ; nested=exempt_env_l",
        "CGGUARD_LOG_FILE": str(tmp_path / "events.jsonl"),
    }
    cgguard.install(cgguard.Config.from_environ(environ))
    with cgguard.capture_disabled():
        kernels.Kernel().run()
    expected = (
        "cgguard: ignoring the exemption 'capture_disabled' in CGGUARD_EXEMPT: not RULE=PLACE; "
        "an entry is RULE=PLACE, PLACE a module (torch._inductor.), a file glob with a '/' "
        "(*/kernels.py) or a function (module:qualname)\n"
        "cgguard: ignoring the exemption 'nested=exempt_env_l' in CGGUARD_EXEMPT: no rule "
        "'nested'; the rules are capture_disabled, nested_capture, concurrent_capture, "
        "sync_during_capture, abandoned_capture, implicit_sync, dead_input, stale_binding, "
        "rng_during_capture, first_use_in_capture, rank_divergence\n"
    )
    assert (capsys.readouterr().err, cgguard.status().exempted) == (
        expected,
        {"capture_disabled": 1},
    )


def test_exemptions_file_with_comments(
    runtime: Runtime, make_module: Make, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CGGUARD_EXEMPT_FILE: one entry a line, # comments; a bad line is one warning naming the
    file and line, and the lines around it apply."""
    kernels = make_module("exempt_file_m", KERNELS)
    nests = make_module("exempt_file_nests_m", NESTS)
    listed = tmp_path / "exemptions"
    listed.write_text(
        "# exemptions for the serving image\n"
        "\n"
        "capture_disabled=exempt_file_m:Kernel.run   # lazy capture on first use\n"
        "capture_disabled=exempt_file_m:Kernel.#other\n"
        "  nested_capture=exempt_file_nests_m\n"
    )
    environ = {
        "CGGUARD_EXEMPT_FILE": str(listed),
        "CGGUARD_EXEMPT": "sync_during_capture=x",
        "CGGUARD_LOG_FILE": str(tmp_path / "events.jsonl"),
    }
    cgguard.install(cgguard.Config.from_environ(environ))
    with cgguard.capture_disabled():
        kernels.Kernel().run()
        with pytest.raises(cgguard.CaptureDisabledError):
            kernels.Kernel().other()
    with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="thread_local"):
        nests.nest()
    expected = (
        f"cgguard: ignoring the exemption 'capture_disabled=exempt_file_m:Kernel.#other' in "
        f"{str(listed)!r} line 4: a function is module:qualname (vllm_plugin.kernels:Kernel.run)"
        "; an entry is RULE=PLACE, PLACE a module (torch._inductor.), a file glob with a '/' "
        "(*/kernels.py) or a function (module:qualname)\n"
    )
    status = cgguard.status()
    assert (capsys.readouterr().err, status.exempted, status.exemptions) == (
        expected,
        {"capture_disabled": 1, "nested_capture": 1},
        (
            "sync_during_capture=x",
            "capture_disabled=exempt_file_m:Kernel.run",
            "nested_capture=exempt_file_nests_m",
        ),
    )


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda path: None, "No such file or directory", id="missing"),
        pytest.param(lambda path: path.mkdir(), "Is a directory", id="a folder"),
        pytest.param(os.mkfifo, "not a regular file", id="a FIFO"),
        pytest.param(lambda path: path.write_bytes(b"\xff\xfe"), "not UTF-8 text", id="binary"),
    ],
)
def test_unreadable_exemptions_file_is_one_warning(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], object],
    reason: str,
) -> None:
    """An exemptions file that cannot be read is one warning, at start-up and install alike."""
    path = tmp_path / "exemptions"
    make(path)
    config = cgguard.Config.from_environ({"CGGUARD_EXEMPT_FILE": str(path)})
    cgguard.install(config)
    cgguard.install(config)
    expected = f"cgguard: ignoring the exemptions file {str(path)!r}: {reason}\n"
    assert (capsys.readouterr().err, cgguard.status().exemptions) == (expected, ())


def test_config_takes_pairs_and_mappings(make_module: Make) -> None:
    """Config(exempt=...) keeps (rule, place) pairs, whichever form gave them, once each."""
    pairs = (("capture_disabled", "torch._inductor."), ("nested_capture", "*/kernels.py"))
    forms = [
        "capture_disabled=torch._inductor.; nested_capture=*/kernels.py",
        ["Capture_Disabled = torch._inductor.", ("nested_capture", "*/kernels.py")],
        {"capture_disabled": "torch._inductor.", "nested_capture": ["*/kernels.py"]},
        [*pairs, "capture_disabled=torch._inductor."],
        pairs,
    ]
    assert [cgguard.Config(exempt=form).exempt for form in forms] == [pairs] * len(forms)  # type: ignore[arg-type]


REPORTING_PROGRAM = """\
import sys

import torch

import cgguard
from cgguard.testing import simulated_cuda

sys.path.insert(0, sys.argv[1])
import exempt_report_n


with simulated_cuda():
    cgguard.install(cgguard.Config.from_environ())
    with cgguard.capture_disabled():
        for _ in range(3):
            exempt_report_n.Kernel().run()
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):  # @refused
                pass
        except cgguard.CaptureDisabledError:
            pass
"""


@pytest.mark.subprocess
def test_summary_and_report_count_exempted_captures(tmp_path: Path) -> None:
    """The exit summary and the JSON report count exempted captures apart from violations,
    per rule and per site, with the exemption that matched."""
    (tmp_path / "exempt_report_n.py").write_text(KERNELS)
    program = tmp_path / "exempting_program.py"
    program.write_text(REPORTING_PROGRAM)
    log, report = tmp_path / "events.jsonl", tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")}
    env.update(
        # The program switches cgguard on itself, after importing torch.
        CGGUARD_ENABLED="0",
        CGGUARD_EXEMPT="capture_disabled=exempt_report_n",
        CGGUARD_LOG_FILE=str(log),
        CGGUARD_LOG_FORMAT="json",
        CGGUARD_REPORT=str(report),
    )
    done = subprocess.run(
        [sys.executable, str(program), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    kernels, main = SourceFile(tmp_path / "exempt_report_n.py"), SourceFile(program)
    capture, refused = kernels.frame("@capture", "_capture"), main.frame("@refused", "<module>")
    events = [json.loads(line) for line in log.read_text().splitlines()]
    # The census of the captures that went ahead follows it.
    summary = next(event for event in events if event["event"] == "cgguard.summary")
    document = json.loads(report.read_text())
    site = {k: capture[k] for k in ("file", "line", "function")}
    expected = (
        [
            "cgguard.capture_exempted",
            "cgguard.capture_violation",
            "cgguard.summary",
            "cgguard.census",
        ],
        {
            "level": "warning",
            "totals": {"capture_disabled": 1},
            "sites": [
                {
                    "rule": "capture_disabled",
                    "count": 1,
                    "file": refused["file"],
                    "line": refused["line"],
                    "function": "<module>",
                }
            ],
            "exempted_totals": {"capture_disabled": 3},
            "exempted_sites": [
                {
                    "rule": "capture_disabled",
                    "count": 3,
                    **site,
                    "exemption": "capture_disabled=exempt_report_n",
                }
            ],
        },
        {"capture_disabled": 1},
        {"capture_disabled": 3},
        [("capture_disabled", 3, "capture_disabled=exempt_report_n", capture)],
    )
    assert expected == (
        [e["event"] for e in events],
        {k: summary[k] for k in expected[1]},
        document["totals"],
        document["exempted_totals"],
        [
            (e["rule"], e["count"], e["exemption"], e["first"]["stack"][-1])
            for e in document["exempted"]
        ],
    )


# The exemptions docs/exemptions.md gives for inductor's own captures, in torch 2.13:
# Benchmarker.benchmark_gpu_with_cuda_graph (torch/_inductor/runtime/benchmarking.py) captures
# the kernel autotuning benchmarks; CUDAGraphTreeManager.__init__
# (torch/_inductor/cudagraph_trees.py) captures an empty graph to keep its memory pool alive.
AUTOTUNING = (
    "capture_disabled=torch._inductor.runtime.benchmarking:"
    "Benchmarker.benchmark_gpu_with_cuda_graph"
)
TREE_MANAGER = "capture_disabled=torch._inductor.cudagraph_trees:CUDAGraphTreeManager.__init__"


@pytest.mark.parametrize("exempted", [True, False], ids=["exempted", "not exempted"])
def test_inductors_own_captures_by_the_documented_exemptions(
    runtime: Runtime, exempted: bool
) -> None:
    """torch's own autotuning benchmark and cudagraph-tree manager capture while capture is
    disabled when exempted as the documentation says, and are refused when not."""
    with warnings.catch_warnings():
        # Importing inductor warns that torch.jit.script_method is deprecated (torch 2.13).
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch._inductor import cudagraph_trees

        benchmarking = pytest.importorskip(
            "torch._inductor.runtime.benchmarking",
            reason="the documented exemption names inductor's Benchmarker of torch 2.13",
        )
        Benchmarker = benchmarking.Benchmarker  # noqa: N806 (the class, by its own name)

    install(f"{AUTOTUNING};{TREE_MANAGER}" if exempted else ())
    x = runtime.tensor()
    with cgguard.capture_disabled():
        # The base Benchmarker times nothing itself: its benchmark_gpu, after the capture,
        # raises NotImplementedError.
        refused: type[BaseException] = (
            NotImplementedError if exempted else cgguard.CaptureDisabledError
        )
        with pytest.raises(refused):
            Benchmarker().benchmark_gpu_with_cuda_graph(lambda: x.add_(1))
        if exempted:
            cudagraph_trees.CUDAGraphTreeManager(x.device.index or 0)
        else:
            with pytest.raises(cgguard.CaptureDisabledError):
                cudagraph_trees.CUDAGraphTreeManager(x.device.index or 0)
    status = cgguard.status()
    expected = ({}, {"capture_disabled": 2}) if exempted else ({"capture_disabled": 2}, {})
    assert expected == (status.violations, status.exempted)


def test_report_follows_exempted_counts_while_running(
    runtime: Runtime, make_module: Make, tmp_path: Path
) -> None:
    """The report on disk gains exempted counts within a second, before any exit or uninstall."""
    kernels = make_module("exempt_live_o", KERNELS)
    report = tmp_path / "report.json"
    install("capture_disabled=exempt_live_o", report=str(report), log_file=os.devnull)
    with cgguard.capture_disabled():
        for _ in range(2):
            kernels.Kernel().run()
    deadline = time.monotonic() + 5
    document: dict[str, Any] = {}
    while document.get("exempted_totals") != {"capture_disabled": 2}:
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
        try:
            document = json.loads(report.read_text())
        except (OSError, ValueError):
            document = {}
    found = (document.get("exempted_totals"), document.get("totals"), document.get("exempted"))
    assert (found[0], found[1], len(found[2] or [])) == ({"capture_disabled": 2}, {}, 1)


def test_summary_of_a_run_that_only_exempted_is_info(
    runtime: Runtime, make_module: Make, tmp_path: Path
) -> None:
    """A run whose every broken rule was exempted still gets its exit summary, at info level."""

    kernels = make_module("exempt_info_p", KERNELS)
    log = tmp_path / "events.jsonl"
    install("capture_disabled=exempt_info_p", log_file=str(log))
    with cgguard.capture_disabled():
        kernels.Kernel().run()
    _process._at_exit()  # what the interpreter's exit runs
    events = [json.loads(line) for line in log.read_text().splitlines()]
    # The census of the capture that went ahead follows it.
    (summary,) = [event for event in events if event["event"] == "cgguard.summary"]
    expected = ("cgguard.summary", "info", {}, {"capture_disabled": 1})
    assert expected == (
        summary["event"],
        summary["level"],
        summary["totals"],
        summary["exempted_totals"],
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_another_thread_matches_exemptions_does_not_hang() -> None:
    """A lock another thread held at the fork is the child's own again, so matching goes on."""
    from cgguard import _process

    install("capture_disabled=cgg_nowhere.")
    installation = _process.PROCESS.installation
    exempt = installation.reporter.exemptions if installation is not None else None
    assert exempt is not None
    holding, release = threading.Event(), threading.Event()

    def matcher() -> None:
        with exempt._lock:  # as a thread inside match() does
            holding.set()
            release.wait(timeout=20)

    thread = threading.Thread(target=matcher)
    thread.start()
    assert holding.wait(timeout=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, Python 3.12+
        pid = os.fork()
    if pid == 0:  # the child: one frame to match, which takes the lock
        code = 0
        try:
            assert _process.PROCESS.installation is not None
            # The exemptions the child's violations are matched against.
            child = _process.PROCESS.installation.reporter.exemptions
            assert child is not None
            child.match("capture_disabled", Stack((sys._getframe().f_code, 0)))
        except BaseException:
            code = 1
        os._exit(code)
    release.set()
    thread.join()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the exemptions' lock")
    assert os.waitstatus_to_exitcode(status) == 0


class Counted(tuple[str, str]):
    """A (rule, place) pair that counts the equality comparisons made with it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return tuple.__eq__(self, other)

    __hash__ = tuple.__hash__


def test_config_and_file_exemptions_merge_with_one_comparison_per_repeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """install() joins 2,000 exemptions of a Config with a file repeating them and adding 2,000
    more: the Config's first, each once, at most one comparison per repeat."""
    from cgguard import _install
    from cgguard._rules import exempt_syntax as _exempt_syntax

    real = _exempt_syntax.parse_entry
    monkeypatch.setattr(_exempt_syntax, "parse_entry", lambda entry: Counted(real(entry)))
    given = [f"capture_disabled=pkg{i}.mod:Kernel.run" for i in range(2000)]
    more = [f"nested_capture=*/lib{i}/kernels.py" for i in range(2000)]
    path = tmp_path / "exemptions"
    path.write_text("\n".join(more[:1000] + given + more[1000:]) + "\n")
    config = cgguard.Config(exempt=given, exempt_file=str(path))
    monkeypatch.setattr(Counted, "compared", 0)
    pairs = _install._exemptions_of(config)
    compared = Counted.compared  # before the comparisons of the assertion itself
    assert [tuple(entry.split("=")) for entry in given + more] == pairs
    assert compared <= len(given)


def test_catch_all_under_the_logging_target_still_says_so(
    runtime: Runtime,
    make_module: Make,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under the logging target at its default level, the debug line and the summary of a
    catch-all's exempted captures pass no handler: the one line said at install is on stderr."""

    kernels = make_module("exempt_every_q", KERNELS)
    cgguard.install(cgguard.Config(exempt="capture_disabled=*/*", log_target="logging"))
    with cgguard.capture_disabled():
        kernels.Kernel().run()
    _process._at_exit()  # what the interpreter's exit runs
    expected = (
        {"capture_disabled": 1},
        [],
        "cgguard: the exemption 'capture_disabled=*/*' matches every file: it exempts every "
        "capture from capture_disabled; an exemption meant for one place names its file "
        "(*/vllm_plugin/kernels.py), module or module:qualname\n",
    )
    assert expected == (cgguard.status().exempted, caplog.records, capsys.readouterr().err)
