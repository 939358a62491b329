"""cgguard.testing._simcuda: the simulated CUDA runtime that torch's real graph code runs on."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from helpers import clean_environ
from torch.torch_version import TorchVersion

from cgguard.testing import simulated_cuda
from cgguard.testing._simcuda import (
    ActiveCapture,
    Call,
    SimulatedCuda,
    SimulatedCudaError,
    SimulationError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.simulated

REPO = Path(__file__).resolve().parent.parent
PROHIBITED = "CUDA error: operation not permitted when stream is capturing [simulated CUDA]"
FAILED = "CUDA error: operation failed due to a previous error during capture [simulated CUDA]"
MISSING = object()
# What torch raises for a CUDA error: torch.AcceleratorError where this torch has it.
CUDA_ERROR_TYPE: type[RuntimeError] = getattr(torch, "AcceleratorError", RuntimeError)
REAL_GRAPH = torch.cuda.graphs.CUDAGraph
REAL_STREAM = torch.cuda.streams.Stream
REAL_EVENT = torch.cuda.streams.Event
CUDA_BUILT = torch.backends.cuda.is_built()
# torch's own, on CUDA builds; on CPU-only builds only while the simulation adds it.
HAS_HOST_EMPTY_CACHE = hasattr(torch._C, "_host_emptyCache")
# torch 2.15's graph.__exit__ restores the stream in a `finally` (torch/cuda/graphs.py): earlier
# releases skip the restore when capture_end raises.
RESTORES_STREAM_AFTER_FAILED_END = TorchVersion(torch.__version__) >= "2.15"
# What torch.cuda.graph.__enter__ asks of the driver besides its synchronize: torch 2.1 does not
# empty the host cache.
HOST_EMPTY_CACHE = (
    [Call("host_empty_cache", (), "MainThread")]
    if "_host_emptyCache" in inspect.getsource(torch.cuda.graphs.graph.__enter__)
    else []
)

# (owner, attribute) pairs the simulation may touch; all must be as they were after each test.
WATCHED = [
    (torch.cuda, name)
    for name in (
        "CUDAGraph",
        "Stream",
        "Event",
        "current_stream",
        "default_stream",
        "set_stream",
        "stream",
        "synchronize",
        "is_current_stream_capturing",
        "graph_pool_handle",
        "is_available",
        "empty_cache",
    )
] + [
    (torch.cuda.graphs, "CUDAGraph"),
    (torch.cuda.graphs, "is_current_stream_capturing"),
    (torch.cuda.graphs, "graph_pool_handle"),
    (torch.cuda.streams, "Stream"),
    (torch.cuda.streams, "Event"),
    (torch._C, "_host_emptyCache"),
    (torch._C, "_cuda_synchronize"),
    (torch.cuda, "_lazy_init"),
    (torch.cuda.memory, "_lazy_init"),
    (torch.cuda.random, "_lazy_init"),
    (torch.cuda, "_exchange_device"),
    (torch.cuda, "_maybe_exchange_device"),
    (torch.cuda, "get_device_name"),
    (torch._C, "_cuda_getDevice"),
    (torch._C, "_cuda_setDevice"),
    (torch._C, "_cuda_resetPeakMemoryStats"),
    (torch.cuda.graphs.graph, "default_capture_stream"),
    (threading.Thread, "_bootstrap_inner"),
]


def snapshot() -> list[object]:
    """Each watched attribute's current value, MISSING where absent."""
    return [vars(owner).get(name, MISSING) for owner, name in WATCHED]


def assert_same(before: list[object], after: list[object]) -> None:
    """Every watched attribute is the very object it was."""
    changed = [
        WATCHED[i][1] for i, (b, a) in enumerate(zip(before, after, strict=True)) if b is not a
    ]
    assert changed == []


@pytest.fixture(autouse=True)
def torch_untouched() -> Iterator[None]:
    """Fail any test that leaves torch patched, or a function mode on this thread's stack."""
    before = snapshot()
    yield
    assert_same(before, snapshot())
    assert torch._C._len_torch_function_stack() == 0


@pytest.fixture
def sim() -> Iterator[SimulatedCuda]:
    """An active simulated runtime, torch restored afterwards."""
    with simulated_cuda() as runtime:
        yield runtime


def run_in_thread(fn: Callable[[], object]) -> object:
    """Run fn on a new thread named "other"; return its result or the exception it raised."""
    result: list[object] = []

    def target() -> None:
        try:
            result.append(fn())
        except Exception as exc:  # the caller compares it
            result.append(exc)

    thread = threading.Thread(target=target, name="other")
    thread.start()
    thread.join()
    return result[0]


def begin_raw(mode: str = "global") -> tuple[Any, Any]:
    """Begin a raw capture on a fresh side stream of this thread; return (graph, stream)."""
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(capture_error_mode=mode)
    return graph, stream


def test_context_restores_torch_exactly() -> None:
    """Every replaced or added attribute is the original object again after the context."""
    before = snapshot()
    with simulated_cuda():
        assert torch.cuda.CUDAGraph is not torch.cuda.graphs.CUDAGraph
        assert callable(torch._C._host_emptyCache)
    assert_same(before, snapshot())
    # Added for the context on a CPU-only build and gone again; torch's own, put back, on a
    # CUDA build.
    assert hasattr(torch._C, "_host_emptyCache") is HAS_HOST_EMPTY_CACHE


def test_context_restores_torch_after_exception() -> None:
    """An exception inside the context still restores torch."""
    before = snapshot()
    with pytest.raises(KeyError), simulated_cuda():
        raise KeyError("boom")
    assert_same(before, snapshot())
    # Added for the context on a CPU-only build and gone again; torch's own, put back, on a
    # CUDA build.
    assert hasattr(torch._C, "_host_emptyCache") is HAS_HOST_EMPTY_CACHE


def test_default_capture_stream_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda.graph's cached side stream is cleared inside and put back after."""
    cached = object()
    monkeypatch.setattr(torch.cuda.graphs.graph, "default_capture_stream", cached)
    with simulated_cuda():
        assert torch.cuda.graphs.graph.default_capture_stream is None
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
        assert isinstance(torch.cuda.graphs.graph.default_capture_stream, torch.cuda.Stream)
    assert torch.cuda.graphs.graph.default_capture_stream is cached


def failure(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    """The type and message of what ``call`` raises, which must be what torch raises where CUDA
    cannot initialise: an AssertionError on a CPU-only build, a RuntimeError without a driver."""
    with pytest.raises((AssertionError, RuntimeError)) as info:
        call()
    return type(info.value), str(info.value)


def test_cuda_calls_the_simulation_does_not_provide_fail_as_without_it_naming_it() -> None:
    """torch.cuda's device queries the simulation cannot answer fail inside it with the type
    torch fails them with outside it, which is what torch's own probes (inductor's cache key)
    catch, in one line that names the simulation and ends with torch's words; the ones it
    answers (synchronize, current_device) run."""
    calls: dict[str, Callable[[], object]] = {
        "init": torch.cuda.init,
        "get_device_properties": lambda: torch.cuda.get_device_properties(0),
        "mem_get_info": torch.cuda.mem_get_info,
        "get_device_capability": torch.cuda.get_device_capability,
        "get_rng_state": torch.cuda.get_rng_state,  # its module binds _lazy_init by name
        "get_per_process_memory_fraction": torch.cuda.get_per_process_memory_fraction,  # also
    }
    without = {name: failure(call) for name, call in calls.items()}
    with simulated_cuda() as sim:
        within = {name: failure(call) for name, call in calls.items()}
        torch.cuda.synchronize()
        current = torch.cuda.current_device()
    served = (
        "it answers current_device(), set_device(0), get_device_name() and synchronize() for "
        "its one device, cuda:0, and torch itself has no CUDA here"
    )
    expected = {
        name: (
            kind,
            f"cgguard's simulated CUDA runtime cannot serve torch.cuda.{name}(): {served} ({said})",
        )
        for name, (kind, said) in without.items()
    }
    assert (within, current, sim.calls) == (expected, 0, [Call("synchronize", (), "MainThread")])


def test_graph_context_then_replay_records_calls(sim: SimulatedCuda) -> None:
    """torch.cuda.graph's real code drives the runtime in CUDA's order."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        assert [ActiveCapture(1, 1, "global", threading.get_ident(), False)] == (
            sim.active_captures()
        )
    g.replay()
    expected = [
        Call("synchronize", (), "MainThread"),
        *HOST_EMPTY_CACHE,
        Call("set_stream", (1,), "MainThread"),
        Call("capture_begin", (1, 1, "global"), "MainThread"),
        Call("capture_end", (1, True), "MainThread"),
        Call("set_stream", (0,), "MainThread"),
        Call("replay", (1,), "MainThread"),
    ]
    assert expected == sim.calls
    assert sim.active_captures() == []


def test_capture_on_default_stream_refused(sim: SimulatedCuda) -> None:
    """A raw capture_begin on the default stream fails as torch does."""
    g = torch.cuda.CUDAGraph()
    with pytest.raises(SimulatedCudaError) as info:
        g.capture_begin()
    assert str(info.value) == (
        "CUDA graphs must be captured on a non-default stream. (However, after capture, "
        "it's ok to replay them on the default stream.) [simulated CUDA]"
    )
    assert sim.active_captures() == []


def test_capture_begin_on_captured_graph_refused(sim: SimulatedCuda) -> None:
    """A graph that holds a capture cannot capture again."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    with torch.cuda.stream(torch.cuda.Stream()), pytest.raises(SimulatedCudaError) as info:
        g.capture_begin()
    assert str(info.value) == (
        "This CUDAGraph instance already owns a captured graph. "
        "To capture a new graph, create a new instance. [simulated CUDA]"
    )


def test_capture_begin_on_capturing_stream_refused(sim: SimulatedCuda) -> None:
    """A second capture on a stream that is capturing fails and poisons the first."""
    first, _ = begin_raw()
    with pytest.raises(SimulatedCudaError) as info:
        torch.cuda.CUDAGraph().capture_begin()
    assert str(info.value) == PROHIBITED
    with pytest.raises(SimulatedCudaError, match="previous error during capture"):
        first.capture_end()


def test_unknown_capture_mode_refused(sim: SimulatedCuda) -> None:
    """capture_error_mode must be one of CUDA's three modes."""
    with torch.cuda.stream(torch.cuda.Stream()), pytest.raises(SimulatedCudaError) as info:
        torch.cuda.CUDAGraph().capture_begin(capture_error_mode="strict")
    assert str(info.value) == (
        "Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, "
        "got strict [simulated CUDA]"
    )


def test_replay_without_capture_refused(sim: SimulatedCuda) -> None:
    """Replaying a graph that holds nothing fails, also after reset()."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    g.replay()
    g.reset()
    for graph in (g, torch.cuda.CUDAGraph()):
        with pytest.raises(SimulatedCudaError) as info:
            graph.replay()
        assert str(info.value) == (
            "Called CUDAGraph::replay without a preceding successful capture. [simulated CUDA]"
        )


def test_synchronize_in_global_capture_invalidates_it(sim: SimulatedCuda) -> None:
    """synchronize() during a global capture fails, and the capture then fails to end."""
    g, stream = begin_raw()
    with pytest.raises(SimulatedCudaError) as info:
        torch.cuda.synchronize()
    assert str(info.value) == PROHIBITED
    assert [ActiveCapture(1, stream.stream_id, "global", threading.get_ident(), True)] == (
        sim.active_captures()
    )
    with pytest.raises(SimulatedCudaError) as ended:
        g.capture_end()
    assert str(ended.value) == FAILED
    assert sim.active_captures() == []
    assert not torch.cuda.is_current_stream_capturing()
    with pytest.raises(SimulatedCudaError, match="without a preceding successful capture"):
        g.replay()


def test_thread_local_capture_allows_other_threads(sim: SimulatedCuda) -> None:
    """A thread_local capture forbids synchronize on its own thread only."""
    g, _ = begin_raw("thread_local")
    assert run_in_thread(torch.cuda.synchronize) is None
    done = torch.cuda.Event()
    done.record(torch.cuda.default_stream())  # recorded outside the capture
    with pytest.raises(SimulatedCudaError, match="not permitted when stream is capturing"):
        done.synchronize()
    with pytest.raises(SimulatedCudaError, match="previous error during capture"):
        g.capture_end()


def test_global_capture_forbids_other_threads(sim: SimulatedCuda) -> None:
    """A global capture on one thread forbids synchronize on every other thread."""
    g, _ = begin_raw()
    error = run_in_thread(torch.cuda.synchronize)
    assert isinstance(error, SimulatedCudaError)
    assert str(error) == PROHIBITED
    assert [Call("synchronize", (), "other"), Call("capture_invalidated", (1,), "other")] == (
        sim.calls[-2:]
    )
    with pytest.raises(SimulatedCudaError, match="previous error during capture"):
        g.capture_end()


def test_refused_sync_poisons_only_the_captures_that_forbid_it(sim: SimulatedCuda) -> None:
    """A sync refused because of another thread's global capture leaves a relaxed one intact."""
    g, _ = begin_raw("relaxed")
    other = run_in_thread(lambda: begin_raw("global")[0])
    assert not isinstance(other, Exception)
    with pytest.raises(SimulatedCudaError, match="not permitted"):
        torch.cuda.synchronize()
    g.capture_end()
    assert [c.graph_id for c in sim.active_captures() if c.invalidated] == [2]


def test_relaxed_capture_forbids_nothing(sim: SimulatedCuda) -> None:
    """Under a relaxed capture, device, event and other-stream syncs all pass."""
    g, _ = begin_raw("relaxed")
    torch.cuda.synchronize()
    torch.cuda.Event().synchronize()
    torch.cuda.default_stream().synchronize()
    assert run_in_thread(torch.cuda.synchronize) is None
    g.capture_end()
    g.replay()


def test_sync_of_capturing_stream_always_refused(sim: SimulatedCuda) -> None:
    """Stream.synchronize() on the capturing stream fails even in relaxed mode."""
    g, stream = begin_raw("relaxed")
    with pytest.raises(SimulatedCudaError) as info:
        stream.synchronize()
    assert str(info.value) == PROHIBITED
    with pytest.raises(SimulatedCudaError, match="previous error during capture"):
        g.capture_end()


def test_nested_graph_fails_in_synchronize_and_poisons_outer(sim: SimulatedCuda) -> None:
    """A torch.cuda.graph inside a global capture fails where torch syncs, and the outer too."""
    outer, inner = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with (
        pytest.raises(SimulatedCudaError) as info,
        torch.cuda.graph(outer),
        torch.cuda.graph(inner),
    ):
        pytest.fail("the inner capture must not begin")
    assert str(info.value) == FAILED
    assert isinstance(info.value.__context__, SimulatedCudaError)
    assert str(info.value.__context__) == PROHIBITED
    expected = [
        Call("synchronize", (), "MainThread"),
        *HOST_EMPTY_CACHE,
        Call("set_stream", (1,), "MainThread"),
        Call("capture_begin", (1, 1, "global"), "MainThread"),
        Call("synchronize", (), "MainThread"),
        Call("capture_invalidated", (1,), "MainThread"),
        Call("capture_end", (1, False), "MainThread"),
        *([Call("set_stream", (0,), "MainThread")] if RESTORES_STREAM_AFTER_FAILED_END else []),
    ]
    assert expected == sim.calls
    assert sim.active_captures() == []
    # Before 2.15, torch's graph.__exit__ never reaches its stream restore once capture_end
    # raises.
    assert torch.cuda.current_stream().stream_id == (0 if RESTORES_STREAM_AFTER_FAILED_END else 1)


def test_current_stream_is_per_thread(sim: SimulatedCuda) -> None:
    """Setting the stream on one thread leaves others on the default stream."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert side == torch.cuda.current_stream()
        assert torch.cuda.default_stream() == run_in_thread(torch.cuda.current_stream)
    assert torch.cuda.default_stream() == torch.cuda.current_stream()
    assert torch.cuda.current_stream().stream_id == 0


def test_stream_none_is_a_no_op(sim: SimulatedCuda) -> None:
    """torch.cuda.stream(None) and set_stream(None) change and record nothing."""
    with torch.cuda.stream(None):
        torch.cuda.set_stream(None)
    assert sim.calls == []
    assert torch.cuda.current_stream().stream_id == 0


def test_is_current_stream_capturing_follows_the_stream(sim: SimulatedCuda) -> None:
    """Only a thread whose current stream is the capturing one sees a capture."""
    g, stream = begin_raw()
    assert torch.cuda.is_current_stream_capturing()
    assert torch.cuda.graphs.is_current_stream_capturing()
    assert run_in_thread(torch.cuda.is_current_stream_capturing) is False

    def join_capture() -> bool:
        torch.cuda.set_stream(stream)
        return torch.cuda.is_current_stream_capturing()

    assert run_in_thread(join_capture) is True
    with torch.cuda.stream(torch.cuda.Stream()):
        assert not torch.cuda.is_current_stream_capturing()
    g.capture_end()
    assert not torch.cuda.is_current_stream_capturing()


def test_discarded_captures_are_gone_and_their_thread_is_on_the_default_stream(
    sim: SimulatedCuda,
) -> None:
    """discard_captures() drops only the captures named, records no call, and puts the calling
    thread back on the default stream when it was on one of theirs."""
    other = run_in_thread(lambda: begin_raw("relaxed")[0]._simcuda_id)
    mine, stream = begin_raw()
    calls = sim.calls
    dropped = sim.discard_captures({mine._simcuda_id})
    me = threading.get_ident()
    assert dropped == [ActiveCapture(mine._simcuda_id, stream.stream_id, "global", me, False)]
    assert [other] == [c.graph_id for c in sim.active_captures()]
    assert (calls, 0) == (sim.calls, torch.cuda.current_stream().stream_id)
    # Nothing of the dropped capture is left to forbid a synchronize, or a capture on its stream.
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        again = torch.cuda.CUDAGraph()
        again.capture_begin()
        again.capture_end()


def test_capture_end_on_other_stream_refused(sim: SimulatedCuda) -> None:
    """capture_end on another stream fails and leaves the capture running."""
    g, stream = begin_raw()
    with torch.cuda.stream(torch.cuda.Stream()), pytest.raises(SimulatedCudaError) as info:
        g.capture_end()
    assert str(info.value) == "Capture must end on the same stream it began on. [simulated CUDA]"
    assert [ActiveCapture(1, stream.stream_id, "global", threading.get_ident(), False)] == (
        sim.active_captures()
    )
    g.capture_end()


def test_capture_end_without_capture_refused(sim: SimulatedCuda) -> None:
    """capture_end on a graph that is not capturing fails."""
    with pytest.raises(SimulatedCudaError) as info:
        torch.cuda.CUDAGraph().capture_end()
    assert str(info.value) == (
        "Called CUDAGraph::capture_end on a graph that is not capturing. [simulated CUDA]"
    )


def test_standins_lead_to_the_real_classes(sim: SimulatedCuda) -> None:
    """Each stand-in is a class of cgguard's whose first torch base is torch's real class."""
    from cgguard._core.patches import real_class

    standins = [torch.cuda.CUDAGraph, torch.cuda.Stream, torch.cuda.Event]
    assert [real_class(cls) for cls in standins] == [REAL_GRAPH, REAL_STREAM, REAL_EVENT]
    assert [cls.__module__ for cls in standins] == ["cgguard.testing._simcuda"] * 3


def test_real_methods_run_through_the_standins(sim: SimulatedCuda) -> None:
    """torch's own Stream/Event methods work over the simulated backend."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    event = side.record_event()
    torch.cuda.current_stream().wait_event(event)
    assert event.query()
    assert side.query()
    assert torch.device("cuda", 0) == side.device
    assert hash(side) == hash(torch.cuda.Stream(stream_id=1, device_index=0, device_type=1))
    expected = [
        Call("event_record", (1, 0), "MainThread"),
        Call("event_wait", (1, 1), "MainThread"),
        Call("event_record", (2, 1), "MainThread"),
        Call("event_wait", (2, 0), "MainThread"),
        Call("event_query", (2,), "MainThread"),
        Call("stream_query", (1,), "MainThread"),
    ]
    assert expected == sim.calls


def test_elapsed_time_needs_timing_and_records(sim: SimulatedCuda) -> None:
    """elapsed_time refuses events without timing or not yet recorded."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with pytest.raises(SimulatedCudaError, match="must be recorded"):
        start.elapsed_time(end)
    start.record()
    end.record()
    assert start.elapsed_time(end) == 0.0
    with pytest.raises(SimulatedCudaError, match="enable_timing=True"):
        torch.cuda.Event().elapsed_time(end)


def test_reprs_say_simulated(sim: SimulatedCuda) -> None:
    """The runtime and its streams and events say they are simulated."""
    assert repr(sim) == "<cgguard simulated CUDA runtime (no GPU): 0 calls, 0 active captures>"
    assert repr(torch.cuda.current_stream()) == "<torch.cuda.Stream stream_id=0 [simulated CUDA]>"
    assert repr(torch.cuda.Event()) == "<torch.cuda.Event event_id=1 [simulated CUDA]>"


def test_objects_from_an_ended_session_refuse() -> None:
    """A graph kept past its session raises instead of touching a new runtime."""
    with simulated_cuda():
        g = torch.cuda.CUDAGraph()
    with simulated_cuda(), pytest.raises(SimulationError) as info:
        g.replay()
    assert str(info.value) == (
        "this object belongs to a simulated_cuda() session that has ended [simulated CUDA]"
    )


def test_refuses_when_real_cuda_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA available the simulation refuses unless forced."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SimulationError) as info, simulated_cuda():
        pytest.fail("must not activate")
    assert str(info.value) == (
        "real CUDA is available and simulated_cuda() would shadow it; "
        "pass force=True to simulate anyway [simulated CUDA]"
    )
    with simulated_cuda(force=True) as runtime:
        assert isinstance(runtime, SimulatedCuda)


def test_reentry_refused(sim: SimulatedCuda) -> None:
    """A second simulated_cuda() while one is active is refused."""
    with pytest.raises(SimulationError) as info, simulated_cuda():
        pytest.fail("must not activate")
    assert str(info.value) == "simulated_cuda() is already active [simulated CUDA]"


CUDA_BUILD_STANDINS = """
import os, torch, cgguard
from cgguard.testing import simulated_cuda

torch.backends.cuda.is_built = lambda: True  # before the first simulation builds its stand-ins
cgguard.install(cgguard.Config(log_file=os.devnull))
with simulated_cuda() as sim:
    graph_class = torch.cuda.CUDAGraph
    print("extends torch's:", issubclass(graph_class, torch.cuda.graphs.CUDAGraph))
    print("hooked itself:", sorted(set(vars(graph_class)) & {"capture_begin", "capture_end"}))
    graph, x = graph_class(), torch.zeros(2)
    with torch.cuda.graph(graph):
        x.add_(1)
    graph.replay()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with cgguard.capture_disabled(), torch.cuda.stream(side):
            graph_class().capture_begin()
    except cgguard.CaptureDisabledError:
        print("refused")
    print([name for name, _, _ in sim.calls if name != "host_empty_cache"])
print("hooked after:", sorted(set(vars(graph_class)) & {"capture_begin", "capture_end"}))
"""


@pytest.mark.subprocess
def test_the_standins_of_a_cuda_build_run_and_are_guarded_on_any_build() -> None:
    """The stand-ins a CUDA build gets (cgguard's own classes with torch's Python layer, since
    torch's extend C types that need a driver) run torch.cuda.graph and streams, and carry
    cgguard's hooks only while both are in place: checked here whatever this build is."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", CUDA_BUILD_STANDINS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    calls = [
        "synchronize",
        "set_stream",
        "capture_begin",
        "capture_end",
        "set_stream",
        "replay",
        "event_record",
        "event_wait",
        # The refused capture_begin never reaches the runtime: only the stream switches.
        "set_stream",
        "set_stream",
    ]
    expected = [
        "extends torch's: False",
        "hooked itself: ['capture_begin', 'capture_end']",
        "refused",
        str(calls),
        "hooked after: []",
    ]
    assert (out.returncode, out.stdout.splitlines()) == (0, expected), out.stderr


@pytest.mark.subprocess
def test_import_does_not_import_torch() -> None:
    """Importing the module leaves torch unimported."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import cgguard.testing._simcuda, sys; print('torch' in sys.modules)",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "False\n"


@pytest.mark.skipif(
    CUDA_BUILT,
    reason="a CUDA build's stand-ins cannot extend torch's CUDAGraph (a C type that needs a "
    "driver): cgguard hooks them itself, see test_install.py",
)
def test_patches_on_the_real_class_reach_the_standin(
    sim: SimulatedCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapper put on torch's real CUDAGraph.capture_begin runs for stand-in graphs."""
    seen: list[str] = []
    original = REAL_GRAPH.capture_begin

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(kwargs["capture_error_mode"])
        original(self, *args, **kwargs)

    monkeypatch.setattr(REAL_GRAPH, "capture_begin", wrapper)
    with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="relaxed"):
        pass
    assert seen == ["relaxed"]


def test_a_child_forked_while_another_thread_is_inside_the_runtime_does_not_hang(
    sim: SimulatedCuda,
) -> None:
    """fork() while another thread holds the runtime's lock: the child's calls still run."""
    import os
    import signal
    import time
    import warnings

    held, release = threading.Event(), threading.Event()

    def inside_a_call() -> None:
        with sim._lock:  # as any simulated call holds it
            held.set()
            release.wait(timeout=20)

    holder = threading.Thread(target=inside_a_call)
    holder.start()
    assert held.wait(timeout=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: one simulated call, then out without any clean-up
        sim._synchronize()
        os._exit(7)
    release.set()
    holder.join(timeout=20)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    hung = done == (0, 0)
    if hung:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert (hung, None if hung else os.waitstatus_to_exitcode(done[1])) == (False, 7)


# --- What torch and CUDA do that the simulation models (docs/cuda-behaviour.md) -------------

CAPTURED_EVENT = (
    "CUDA error: operation not permitted on an event last recorded in a capturing stream "
    "[simulated CUDA]"
)


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_an_event_never_recorded_makes_no_cuda_call(sim: SimulatedCuda, mode: str) -> None:
    """CUDAEvent::synchronize and ::query do nothing before the event's first record()."""
    g, _ = begin_raw(mode)
    never = torch.cuda.Event()
    since = len(sim.calls)
    never.synchronize()
    assert never.query() is True
    assert run_in_thread(never.synchronize) is None
    assert sim.calls[since:] == []
    g.capture_end()  # the capture is intact
    g.replay()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_an_event_recorded_in_the_capture_fails_in_every_mode(
    sim: SimulatedCuda, mode: str
) -> None:
    """cudaErrorCapturedEvent: the event's last record is a node of an active capture."""
    g, _ = begin_raw(mode)
    inside = torch.cuda.Event()
    inside.record()
    # Another thread, not capturing: the event's state fails the call, unless the global
    # capture's prohibition of unsafe calls on every thread comes first.
    expected = PROHIBITED if mode == "global" else CAPTURED_EVENT
    for call in (inside.synchronize, inside.query):
        error = run_in_thread(call)
        assert isinstance(error, CUDA_ERROR_TYPE)
        assert isinstance(error, SimulatedCudaError)
        assert str(error) == expected
    if mode == "relaxed":
        # The capturing thread may make unsafe calls in relaxed mode, not this one.
        with pytest.raises(SimulatedCudaError) as info:
            inside.synchronize()
        assert str(info.value) == CAPTURED_EVENT
        g.capture_end()
    else:
        with pytest.raises(SimulatedCudaError) as info:
            inside.synchronize()  # prohibited on the capturing thread before anything else
        assert str(info.value) == PROHIBITED
        with pytest.raises(SimulatedCudaError, match="previous error during capture"):
            g.capture_end()
    inside.synchronize()  # once the capture has ended, the event is an ordinary one


def test_event_query_during_a_global_capture_fails_on_any_thread(sim: SimulatedCuda) -> None:
    """cudaEventQuery is unsafe during a global capture, from every thread (pytorch PR 104555)."""
    done = torch.cuda.Event()
    done.record()  # on the default stream, before the capture
    g, _ = begin_raw("global")
    error = run_in_thread(done.query)
    assert isinstance(error, SimulatedCudaError)
    assert str(error) == PROHIBITED
    with pytest.raises(SimulatedCudaError, match="previous error during capture"):
        g.capture_end()


def test_event_query_during_a_thread_local_capture_fails_on_its_thread_only(
    sim: SimulatedCuda,
) -> None:
    """thread_local: only the capturing thread is prohibited from unsafe calls."""
    done = torch.cuda.Event()
    done.record()
    g, _ = begin_raw("thread_local")
    assert run_in_thread(done.query) is True
    with pytest.raises(SimulatedCudaError) as info:
        done.query()
    assert str(info.value) == PROHIBITED
    with pytest.raises(SimulatedCudaError, match="previous error during capture"):
        g.capture_end()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_querying_the_capturing_stream_fails_in_every_mode(sim: SimulatedCuda, mode: str) -> None:
    """cudaStreamQuery of a capturing stream is invalid and invalidates its capture."""
    g, stream = begin_raw(mode)
    with pytest.raises(SimulatedCudaError) as info:
        stream.query()
    assert str(info.value) == PROHIBITED
    assert isinstance(info.value, CUDA_ERROR_TYPE)
    with pytest.raises(SimulatedCudaError, match="previous error during capture"):
        g.capture_end()


def test_pool_needs_a_finished_capture(sim: SimulatedCuda) -> None:
    """CUDAGraph::pool() refuses before capture_end, and after reset()."""
    g = torch.cuda.CUDAGraph()
    message = "Called CUDAGraph::pool() without a preceding successful capture. [simulated CUDA]"
    with pytest.raises(SimulatedCudaError) as before:
        g.pool()
    with torch.cuda.stream(torch.cuda.Stream()):
        g.capture_begin()
        with pytest.raises(SimulatedCudaError) as during:
            g.pool()
        g.capture_end()
    private = g.pool()
    shared = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        shared.capture_begin(pool=private)
        shared.capture_end()
    g.reset()
    with pytest.raises(SimulatedCudaError) as after_reset:
        g.pool()
    assert [str(e.value) for e in (before, during, after_reset)] == [message] * 3
    assert type(before.value) is SimulatedCudaError  # torch's check, not CUDA's
    assert shared.pool() == private
    assert (private[0] > 0, private[1]) == (True, 0)  # a private pool, as torch numbers them


def test_keep_graph_may_be_captured_again_until_instantiated(sim: SimulatedCuda) -> None:
    """has_graph_exec_: set by capture_end without keep_graph, by instantiate() or replay()."""
    kept = torch.cuda.CUDAGraph(keep_graph=True)
    owns = "This CUDAGraph instance already owns a captured graph"
    with torch.cuda.stream(torch.cuda.Stream()):
        kept.capture_begin()
        kept.capture_end()
        kept.capture_begin()  # not instantiated yet: a new capture
        kept.capture_end()
        kept.instantiate()
        kept.instantiate()  # again, after changing the raw graph, say
        with pytest.raises(SimulatedCudaError, match=owns):
            kept.capture_begin()
    plain = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        plain.capture_begin()
        plain.capture_end()
        with pytest.raises(SimulatedCudaError, match="only when keep_graph=true"):
            plain.instantiate()
        with pytest.raises(SimulatedCudaError, match=owns):
            plain.capture_begin()
    lazy = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(torch.cuda.Stream()):
        with pytest.raises(SimulatedCudaError, match="capture_end\\(\\) must have been called"):
            lazy.instantiate()
        lazy.capture_begin()
        lazy.capture_end()
        lazy.replay()  # instantiates
        with pytest.raises(SimulatedCudaError, match=owns):
            lazy.capture_begin()


def test_an_empty_capture_warns_where_the_simulation_sees_the_work(sim: SimulatedCuda) -> None:
    """torch warns of a graph with no node; the simulation sees only launch() and events."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        quiet = torch.cuda.CUDAGraph()
        quiet.capture_begin()
        quiet.capture_end()  # off by default: CPU tensors' work never reaches the simulation
        sim.warn_empty_captures = True
        empty, full, evented = (torch.cuda.CUDAGraph() for _ in range(3))
        empty.capture_begin()
        with pytest.warns(UserWarning, match="The CUDA Graph is empty") as warned:
            empty.capture_end()
        full.capture_begin()
        sim.launch()
        full.capture_end()
        evented.capture_begin()
        torch.cuda.Event().record()
        evented.capture_end()
    assert len(warned) == 1
    assert str(warned[0].message) == (
        "The CUDA Graph is empty. This usually means that the graph was attempted to be "
        "captured on wrong device or stream. [simulated CUDA]"
    )
    launches = [c for c in sim.calls if c.name == "launch"]
    assert launches == [Call("launch", (stream.stream_id,), "MainThread")]


def test_cuda_errors_are_accelerator_errors_and_torch_checks_are_not(sim: SimulatedCuda) -> None:
    """AT_CUDA_CHECK raises torch.AcceleratorError; TORCH_CHECK a plain RuntimeError."""
    g, _ = begin_raw()
    with pytest.raises(SimulatedCudaError) as cuda_error:
        torch.cuda.synchronize()
    with pytest.raises(SimulatedCudaError) as invalidated:
        g.capture_end()
    with pytest.raises(SimulatedCudaError) as torch_check:
        g.replay()
    assert [isinstance(e.value, CUDA_ERROR_TYPE) for e in (cuda_error, invalidated)] == [True] * 2
    assert type(torch_check.value) is SimulatedCudaError  # a plain RuntimeError's kind


def test_a_simulation_a_test_asks_for_keeps_every_call(sim: SimulatedCuda) -> None:
    """simulated_cuda() as a context manager keeps its whole record, past the 10,000 calls a
    process-wide simulation keeps."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pass
    since = len(sim.calls)
    for _ in range(20_000):
        graph.replay()
    assert sim.calls[since:] == [Call("replay", (graph._simcuda_id,), "MainThread")] * 20_000


def test_max_calls_keeps_the_latest_calls() -> None:
    """simulated_cuda(max_calls=N) keeps the latest N calls, oldest first."""
    with simulated_cuda(max_calls=2) as sim:
        for op in ("aten::first", "aten::second", "aten::third"):
            sim.implicit_sync(op)
        assert sim.calls == [
            Call("implicit_sync", ("aten::second",), "MainThread"),
            Call("implicit_sync", ("aten::third",), "MainThread"),
        ]


@pytest.mark.parametrize("value", [-1, 2.5, True, "10"])
def test_max_calls_other_than_a_whole_number_is_refused(value: Any) -> None:
    """max_calls is None (every call) or a whole number of 0 or more: anything else is refused
    before torch is touched."""
    with pytest.raises(ValueError, match="max_calls") as info, simulated_cuda(max_calls=value):
        pytest.fail("must not activate")
    assert str(info.value) == (
        f"simulated_cuda(max_calls={value!r}): None (every call) or a whole number of 0 or more "
        "expected"
    )


SOAK = """
import torch
from cgguard.testing import active_simulation

graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    pass
for _ in range(100_000):
    graph.replay()
calls = active_simulation().calls
print(len(calls), sorted({call.name for call in calls}), calls[-1])
"""


@pytest.mark.subprocess
def test_a_process_wide_simulation_keeps_its_latest_10000_calls() -> None:
    """CGGUARD_SIMULATE_CUDA=1 lasts the whole process: 100,000 replays leave the latest 10,000
    calls recorded, not every one (about 120 bytes each, for as long as a soak test runs)."""
    done = subprocess.run(
        [sys.executable, "-c", SOAK],
        cwd=REPO,
        env=clean_environ(CGGUARD_ENABLED="1", CGGUARD_SIMULATE_CUDA="1"),
        capture_output=True,
        text=True,
        check=False,
    )
    last = Call("replay", (1,), "MainThread")
    assert (done.returncode, done.stdout) == (0, f"10000 ['replay'] {last}\n"), done.stderr
