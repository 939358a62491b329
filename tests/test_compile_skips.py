"""torch.compile's skipped cudagraphs (cgguard._census.compile_skips): counted by reason and by the
user's call of the compiled function, from torch's own counter.

One test compiles for real with inductor on CPU (the system's C++ compiler, tens of seconds the
first time); the rest drive the hook with a stand-in for torch._dynamo.utils.
"""

from __future__ import annotations

import collections
import os
import sys
import types
from typing import TYPE_CHECKING, Any

import pytest
import torch
from torch.torch_version import TorchVersion

import cgguard
from cgguard._census import compile_skips as _compile_skips

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [
    # Inductor's first import reaches torch/utils/mkldnn.py, which uses the deprecated decorator.
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

# torch 2.13 counts a skip of cudagraphs for a graph on CPU (torch/_inductor/output_code.py);
# torch 2.1 has no such counter, and logs a skip only for a graph with CUDA nodes.
COUNTS_CPU_CUDAGRAPH_SKIPS = TorchVersion(torch.__version__) >= "2.13"


@pytest.fixture
def fake_utils(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in torch._dynamo.utils, with torch's kind of counters, hooked by a census."""
    module = types.ModuleType(_compile_skips.MODULE)
    module.counters = collections.defaultdict(collections.Counter)  # type: ignore[attr-defined]
    module.counters["inductor"]["fxgraph_cache_miss"] = 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, _compile_skips.MODULE, module)
    cgguard.install(cgguard.Config(log_file=os.devnull))
    yield module
    cgguard.uninstall()


def log_cudagraph_skip_and_bump_counter(counters: Any, msg: str) -> None:
    # Named as torch's: the hook reads ``msg`` from the frame of this name.
    counters["inductor"]["cudagraph_skips"] += 1


class CompiledFxGraph:
    def __init__(self, counters: Any, reason: str) -> None:
        self.disabled_cudagraphs_reason = reason
        counters["inductor"]["cudagraph_skips"] += 1  # as torch's does for a graph on CPU


def skips() -> list[tuple[str, int, str, str | None]]:
    return [
        (s["reason"], s["count"], s["example"], s["function"])
        for s in cgguard.census()["cudagraph_skips"]
    ]


def test_each_skip_is_counted_with_its_reason_and_the_users_call(
    fake_utils: types.ModuleType,
) -> None:
    """The message of torch's logging function, or the compiled graph's reason; the site is
    the innermost frame outside torch (here the stand-ins themselves, which are not torch's:
    the real compile below shows the user's call)."""
    counters: Any = fake_utils.counters
    log_cudagraph_skip_and_bump_counter(counters, "skipping cudagraphs due to cpu device (arg0_1)")
    log_cudagraph_skip_and_bump_counter(counters, "skipping cudagraphs due to cpu device (arg3_1)")
    CompiledFxGraph(counters, "skipping cudagraphs due to multiple devices: ")
    logging = "log_cudagraph_skip_and_bump_counter"
    assert skips() == [
        ("cpu device", 2, "skipping cudagraphs due to cpu device (arg0_1)", logging),
        ("multiple devices", 1, "skipping cudagraphs due to multiple devices:", "__init__"),
    ]
    # torch's own count is untouched, and its other counters too.
    assert dict(counters["inductor"]) == {"fxgraph_cache_miss": 1, "cudagraph_skips": 3}


def test_counters_cleared_by_torch_still_count(fake_utils: types.ModuleType) -> None:
    """torch._dynamo's reset clears the counters: the "inductor" entry made anew still counts."""
    counters: Any = fake_utils.counters
    counters.clear()
    counters["inductor"]["cudagraph_skips"] += 1
    assert [count for _, count, _, _ in skips()] == [1]


def test_uninstall_gives_torch_plain_counters_back(fake_utils: types.ModuleType) -> None:
    """After uninstall, nothing of cgguard's is left in torch's counters."""
    counters: Any = fake_utils.counters
    counters["inductor"]["cudagraph_skips"] += 1
    cgguard.uninstall()
    assert (type(counters["inductor"]), counters.default_factory) == (
        collections.Counter,
        collections.Counter,
    )
    assert dict(counters["inductor"]) == {"fxgraph_cache_miss": 1, "cudagraph_skips": 1}


def test_a_copy_keeps_the_counts_and_counts_where_torch_puts_it_back(
    fake_utils: types.ModuleType,
) -> None:
    """torch copies the "inductor" counters and may put the copy in their place: the copy holds
    torch's counts, and a skip bumped on it is counted."""
    counters: Any = fake_utils.counters
    copied = counters["inductor"].copy()
    assert dict(copied) == {"fxgraph_cache_miss": 1}
    counters["inductor"] = copied
    counters["inductor"]["cudagraph_skips"] += 1
    assert [count for _, count, _, _ in skips()] == [1]


def test_torchs_own_lazy_init_leaves_its_counters_whole_and_counting() -> None:
    """torch's ``init_once_fakemode`` (inductor's pattern passes) copies the "inductor" counters
    and puts the copy back: torch's counts survive it, and a later skip, bumped by torch's own
    logging function, is counted rather than failing the user's compile."""
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter
    from torch._inductor.pattern_matcher import init_once_fakemode

    cgguard.install(cgguard.Config(log_file=os.devnull))
    counters.clear()
    try:
        counters["inductor"]["fxgraph_cache_miss"] += 2

        @init_once_fakemode
        def lazy_init() -> None:
            return None

        lazy_init()
        assert dict(counters["inductor"]) == {"fxgraph_cache_miss": 2}
        message = "skipping cudagraphs due to mutated inputs (1 instances)"
        log_cudagraph_skip_and_bump_counter(message)
        assert dict(counters["inductor"]) == {"fxgraph_cache_miss": 2, "cudagraph_skips": 1}
        assert [(reason, count) for reason, count, _, _ in skips()] == [("mutated inputs", 1)]
    finally:
        counters.clear()


def test_the_counting_counters_pickle_as_torchs_own(fake_utils: types.ModuleType) -> None:
    """Pickled, the "inductor" counters are a plain Counter with torch's counts."""
    import pickle

    counters: Any = fake_utils.counters
    copied = pickle.loads(pickle.dumps(counters["inductor"]))  # noqa: S301 - made just above
    assert (type(copied), copied) == (collections.Counter, {"fxgraph_cache_miss": 1})


def test_torchs_whole_counters_pickled_load_where_cgguard_is_not(
    fake_utils: types.ModuleType, tmp_path: Path
) -> None:
    """Pickled whole, torch's counters (their factory too) load in a python -S that cannot
    import cgguard, as the defaultdict of Counters torch made."""
    import pickle
    import subprocess

    counters: Any = fake_utils.counters
    counters["inductor"]["cudagraph_skips"] += 1
    counters["stats"]["calls"] += 2
    load = (
        "import collections, pickle, sys\n"
        "counters = pickle.loads(sys.stdin.buffer.read())\n"
        "print(type(counters).__name__, counters.default_factory is collections.Counter,\n"
        "      sorted((k, type(v).__name__, sorted(v.items())) for k, v in counters.items()),\n"
        "      'cgguard' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    result = subprocess.run(
        [sys.executable, "-S", "-c", load],
        input=pickle.dumps(counters),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    expected = [
        ("inductor", "Counter", [("cudagraph_skips", 1), ("fxgraph_cache_miss", 1)]),
        ("stats", "Counter", [("calls", 2)]),
    ]
    assert (result.returncode, result.stdout.decode()) == (
        0,
        f"defaultdict True {expected} False\n",
    ), result.stderr.decode()


def test_without_the_census_nothing_is_hooked(fake_utils: types.ModuleType) -> None:
    """census=False: torch's counters are plain."""
    cgguard.install(cgguard.Config(log_file=os.devnull, census=False))
    counters: Any = fake_utils.counters
    assert type(counters["inductor"]) is collections.Counter


def test_a_module_imported_later_is_hooked_on_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed before torch._dynamo.utils is imported: hooked once it is, never imported by
    cgguard itself."""
    monkeypatch.delitem(sys.modules, _compile_skips.MODULE, raising=False)
    from cgguard import _boot, _process

    cgguard.install(cgguard.Config(log_file=os.devnull))
    hook = _process.PROCESS.skips.hook
    assert hook in _boot.pending(_compile_skips.MODULE)
    cgguard.uninstall()
    assert hook not in _boot.pending(_compile_skips.MODULE)


UTILS_BODY = """
import builtins
import collections

counters = collections.defaultdict(collections.Counter)
builtins.cgguard_utils_started.set()
builtins.cgguard_utils_release.wait(60)
LAST = "body ran to the end"
"""


def test_installs_while_another_thread_imports_the_module_leave_its_import_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """install(), again and again, while another thread is inside the import of the module
    whose counters the census hooks: the import finishes whole, its spec its own class, and
    its counters are hooked once it has."""
    import builtins
    import importlib
    import threading
    from importlib.machinery import ModuleSpec

    name = "cgguard_sample_dynamo_utils"
    (tmp_path / f"{name}.py").write_text(UTILS_BODY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_compile_skips, "MODULE", name)
    monkeypatch.setattr(builtins, "cgguard_utils_started", threading.Event(), raising=False)
    monkeypatch.setattr(builtins, "cgguard_utils_release", threading.Event(), raising=False)
    failures: list[BaseException] = []

    def load() -> None:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            failures.append(exc)

    importer = threading.Thread(target=load)
    importer.start()
    try:
        assert builtins.cgguard_utils_started.wait(60)  # type: ignore[attr-defined]
        for _ in range(1200):
            cgguard.install(cgguard.Config(log_file=os.devnull))
    finally:
        builtins.cgguard_utils_release.set()  # type: ignore[attr-defined]
        importer.join(60)
    try:
        module = sys.modules[name]
        assert (failures, module.LAST, type(module.__spec__)) == (
            [],
            "body ran to the end",
            ModuleSpec,
        )
        assert type(module.counters["inductor"]) is _compile_skips.CountingCounter
    finally:
        cgguard.uninstall()
        sys.modules.pop(name, None)


@pytest.mark.skipif(not COUNTS_CPU_CUDAGRAPH_SKIPS, reason="torch counts no CPU cudagraph skip")
def test_a_real_reduce_overhead_compile_on_cpu_shows_its_skip_reason_and_site() -> None:
    """torch.compile(mode="reduce-overhead") on a CPU tensor: inductor skips cudagraphs, and
    the census names torch's reason and the line that called the compiled function."""
    cgguard.install(cgguard.Config(log_file=os.devnull))
    torch._dynamo.reset()

    def scaled_sin(t: torch.Tensor) -> torch.Tensor:
        return torch.sin(t * 3) + 1

    compiled = torch.compile(scaled_sin, mode="reduce-overhead")
    line = sys._getframe().f_lineno + 1
    result = compiled(torch.arange(4.0))
    assert torch.allclose(result, torch.sin(torch.arange(4.0) * 3) + 1)
    # Measured on torch 2.13 (CPU): the graph has no CUDA node, and inductor's reason, with
    # no device to list, is "multiple devices: ".
    assert cgguard.census()["cudagraph_skips"] == [
        {
            "reason": "multiple devices",
            "count": 1,
            "example": "skipping cudagraphs due to multiple devices:",
            "file": __file__,
            "line": line,
            "function": "test_a_real_reduce_overhead_compile_on_cpu_shows_its_skip_reason_and_site",
        }
    ]
    torch._dynamo.reset()
