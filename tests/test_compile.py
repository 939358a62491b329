"""End to end: torch.compile (inductor, on CPU) under the simulated CUDA runtime and cgguard.

Each test compiles for real, with the system's C++ compiler: a few seconds each, so few compiles.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pytest
import torch
from torch.torch_version import TorchVersion

import cgguard
from cgguard.testing import simulated_cuda
from cgguard.testing._simcuda import Call, SimulatedCuda

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.simulated,
    # Inductor's first import reaches torch/utils/mkldnn.py, which uses the deprecated decorator.
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

X = torch.arange(4.0)
# sin(3x) for x = 0, 1, 2, 3, computed apart from torch.
EXPECTED = torch.tensor([math.sin(3.0 * x) for x in range(4)])
# torch 2.13 counts a skip of cudagraphs for a graph on CPU (torch/_inductor/output_code.py,
# cudagraph_post_compile); earlier releases are not relied on to.
COUNTS_CPU_CUDAGRAPH_SKIPS = TorchVersion(torch.__version__) >= "2.13"


def triple_sin(t: torch.Tensor) -> torch.Tensor:
    # A torch function, not only tensor methods: dynamo looks it up among its special cases.
    return torch.sin(t * 3)


def per_process_caches() -> list[Any]:
    """What torch builds once per process from what torch.cuda holds then, and keeps: inductor's
    answer to which device it runs on (its cache key) and dynamo's table of the functions it
    handles itself, torch.cuda's device switches among them; those this torch has."""
    # Imported here: inductor and dynamo take seconds to import, for these tests alone.
    from torch._dynamo.variables import torch as variables
    from torch._inductor.codecache import CacheBase

    handlers = getattr(variables, "TorchInGraphFunctionVariable", None)
    found = [getattr(CacheBase, "get_system", None), getattr(handlers, "_get_handlers", None)]
    return [cache for cache in found if hasattr(cache, "cache_clear")]


@pytest.fixture
def sim(events: list[dict[str, Any]]) -> Iterator[SimulatedCuda]:
    """cgguard installed in log mode on an active simulation, with no compiled state before or
    after: every violation is seen in ``events``, none raised."""
    cgguard.install(cgguard.Config(mode="log", log_format="json"))
    torch._dynamo.reset()
    # Built outside the simulation, they would not be built inside; built inside, they must not
    # outlive it.
    caches = per_process_caches()
    for cache in caches:
        cache.cache_clear()
    try:
        with simulated_cuda() as runtime:
            yield runtime
    finally:
        torch._dynamo.reset()
        for cache in caches:
            cache.cache_clear()


def capture_calls(graph_id: int, stream_id: int) -> list[Call]:
    """What one ``with torch.cuda.graph(g)`` and ``g.replay()`` ask of the simulated driver."""
    return [
        Call("synchronize", (), "MainThread"),
        Call("set_stream", (stream_id,), "MainThread"),
        Call("capture_begin", (graph_id, stream_id, "global"), "MainThread"),
        Call("capture_end", (graph_id, True), "MainThread"),
        Call("set_stream", (0,), "MainThread"),
        Call("replay", (graph_id,), "MainThread"),
    ]


def driver_calls(sim: SimulatedCuda) -> list[Call]:
    # torch 2.1's graph.__enter__ does not empty the host cache; later releases do.
    return [call for call in sim.calls if call.name != "host_empty_cache"]


def test_compiled_function_runs_outside_a_capture(
    sim: SimulatedCuda, events: list[dict[str, Any]]
) -> None:
    """A function compiled by inductor on CPU tensors gives the eager result, asks nothing of
    the simulated driver and breaks no rule."""
    compiled = torch.compile(triple_sin)
    torch.testing.assert_close(compiled(X), EXPECTED)
    assert (sim.calls, events) == ([], [])


def test_function_compiled_inside_a_simulated_capture(
    sim: SimulatedCuda, events: list[dict[str, Any]]
) -> None:
    """Compiled and first run inside torch.cuda.graph on the simulation, a function on CPU
    tensors gives the eager result; the capture is the only work the driver sees, unbroken."""
    compiled = torch.compile(triple_sin)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert torch.cuda.is_current_stream_capturing()
        result = compiled(X)
    graph.replay()
    torch.testing.assert_close(result, EXPECTED)
    assert (driver_calls(sim), events) == (capture_calls(1, 1), [])


def test_reduce_overhead_skips_cudagraphs_for_cpu_tensors(
    sim: SimulatedCuda, events: list[dict[str, Any]]
) -> None:
    """mode="reduce-overhead" on CPU tensors: inductor skips its cudagraphs (counted once), so
    neither its calls outside a capture nor inside one capture anything on the simulation."""
    from torch._dynamo.utils import counters

    skipped_before = counters["inductor"]["cudagraph_skips"]
    compiled = torch.compile(triple_sin, mode="reduce-overhead")
    # cudagraph trees would warm up on the first call and record on the second.
    outside = [compiled(X), compiled(X)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inside = compiled(X)
    graph.replay()
    for result in (*outside, inside):
        torch.testing.assert_close(result, EXPECTED)
    if COUNTS_CPU_CUDAGRAPH_SKIPS:
        assert counters["inductor"]["cudagraph_skips"] - skipped_before == 1
    assert (driver_calls(sim), events) == (capture_calls(1, 1), [])


def test_compiled_function_stays_compiled_inside_an_inspected_capture(
    sim: SimulatedCuda, events: list[dict[str, Any]]
) -> None:
    """Under inspection, a compiled function called inside a simulated capture still runs its
    compiled code (the inspection's mode passes over compiled internals), with the eager
    result, and breaks no rule."""
    from torch._inductor.compile_fx import compile_fx

    cgguard.install(cgguard.Config(mode="log", log_format="json", inspect=True))
    runs: list[int] = []

    def counting_inductor(gm: Any, example_inputs: Any) -> Any:
        compiled = compile_fx(gm, example_inputs)

        def run(*args: Any) -> Any:
            runs.append(1)  # the compiled artifact ran, not the function eagerly
            return compiled(*args)

        return run

    compiled = torch.compile(triple_sin, backend=counting_inductor)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = compiled(X)
    graph.replay()
    torch.testing.assert_close(result, EXPECTED)
    assert (runs, events) == ([1], [])
