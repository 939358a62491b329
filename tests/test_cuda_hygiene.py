"""The clean-up after each `cuda` test (cuda_hygiene.restore), simulated and on a GPU."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

import pytest
import torch
from cuda_hygiene import end_capture_on_gpu, is_capturing, pool_streams, restore

from cgguard.testing import simulated_cuda

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from cgguard.testing import SimulatedCuda


@pytest.fixture
def sim() -> Iterator[SimulatedCuda]:
    """The simulated runtime, for the test's duration."""
    with simulated_cuda() as simulation:
        yield simulation


def ending(graphs: dict[int, Any]) -> Callable[[Any], None]:
    """What ends a capture on the simulation: the capturing graph's own capture_end."""

    def end(stream: Any) -> None:
        with torch.cuda.stream(stream):
            graphs[stream.stream_id].capture_end()

    return end


def after(sim: SimulatedCuda, start: int) -> list[tuple[str, tuple[object, ...]]]:
    """The simulated calls since ``start``, stream switches left out, as (name, args)."""
    return [(c.name, c.args) for c in sim.calls[start:] if c.name != "set_stream"]


def open_capture(device: str = "cpu") -> tuple[Any, Any]:
    """A graph capturing work on a new stream, left current, as a failed test leaves them.

    The kernel runs once before the capture: loading it during a capture is itself unsafe.
    """
    graph, stream, x = torch.cuda.CUDAGraph(), torch.cuda.Stream(), torch.zeros(4, device=device)
    with torch.cuda.stream(stream):
        x.add_(1)
    torch.cuda.synchronize()
    torch.cuda.set_stream(stream)
    graph.capture_begin()
    x.add_(1)
    return graph, stream


@pytest.mark.simulated
def test_an_open_capture_is_ended_then_the_device_synchronized(sim: SimulatedCuda) -> None:
    """A capture left open is ended, then the device synchronized and the default stream current."""
    graph, stream = open_capture()
    start = len(sim.calls)
    listed = [torch.cuda.current_stream(), torch.cuda.Stream()]
    problems = restore(listed, ending({stream.stream_id: graph}))
    assert (problems, sim.active_captures()) == ([], [])
    assert after(sim, start) == [("capture_end", (1, True)), ("synchronize", ())]
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


@pytest.mark.simulated
def test_an_invalidated_capture_ends_though_its_end_fails(sim: SimulatedCuda) -> None:
    """A poisoned capture's failing capture_end still ends it: nothing to report."""
    graph, stream = open_capture()
    with pytest.raises(RuntimeError, match="operation not permitted"):
        torch.cuda.synchronize()
    start = len(sim.calls)
    assert restore([torch.cuda.current_stream()], ending({stream.stream_id: graph})) == []
    assert after(sim, start) == [("capture_end", (1, False)), ("synchronize", ())]
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


@pytest.mark.simulated
def test_a_capture_that_stays_open_is_reported_and_not_synchronized(sim: SimulatedCuda) -> None:
    """A capture nothing can end (begun by a thread now gone) is reported; no synchronize."""
    _, stream = open_capture()
    start = len(sim.calls)
    problems = restore([stream], lambda s: None)
    assert [f"a capture stays open on {stream!r} (begun by a thread now gone?)"] == problems
    assert after(sim, start) == []
    assert [c.graph_id for c in sim.active_captures()] == [1]
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


@pytest.mark.simulated
def test_with_nothing_open_it_only_synchronizes(sim: SimulatedCuda) -> None:
    """After a clean test: one synchronize, the default stream current, nothing reported."""
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    start = len(sim.calls)
    assert restore([stream, stream, torch.cuda.Stream()], ending({})) == []
    assert after(sim, start) == [("synchronize", ())]
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


@pytest.mark.simulated
def test_a_failing_step_is_reported_and_the_next_steps_still_run(sim: SimulatedCuda) -> None:
    """Listing the streams and synchronizing fail; both are reported, the stream still restored."""
    _, hidden = open_capture()  # on a stream not listed: its global capture forbids synchronize

    def streams() -> Iterator[Any]:
        raise OSError("no streams")
        yield  # pragma: no cover - a generator that fails when listed

    problems = restore(streams(), ending({}))
    assert len(problems) == 2
    assert problems[0] == "could not list the streams to check: OSError('no streams')"
    assert problems[1].startswith("torch.cuda.synchronize() failed: ")
    assert "operation not permitted when stream is capturing" in problems[1]
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert is_capturing(hidden)


@pytest.mark.cuda
@pytest.mark.parametrize("graph_kept", [True, False], ids=["graph-kept", "graph-freed"])
def test_gpu_capture_left_open_is_ended(graph_kept: bool) -> None:
    """On a GPU, an open capture ends through its graph, or in CUDA once the graph is freed."""
    streams = pool_streams()
    graph, stream = open_capture("cuda")
    assert any(s == stream for s in streams)
    if not graph_kept:
        del graph
        gc.collect()
    assert restore(streams) == []
    assert not is_capturing(stream)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    x = torch.ones(4, device="cuda")
    torch.cuda.synchronize()
    assert float(x.sum()) == 4.0


@pytest.mark.cuda
def test_gpu_end_capture_on_gpu_ends_an_invalidated_capture() -> None:
    """On a GPU, a capture poisoned by a synchronize is ended by end_capture_on_gpu."""
    graph, stream = open_capture("cuda")
    with pytest.raises(RuntimeError, match="operation not permitted"):
        torch.cuda.synchronize()
    end_capture_on_gpu(stream)
    assert not is_capturing(stream)
    torch.cuda.set_stream(torch.cuda.default_stream())
    torch.cuda.synchronize()
    del graph
