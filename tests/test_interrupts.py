"""Interrupts and odd subclasses on the capture path: no later verdict goes wrong.

A KeyboardInterrupt (SIGINT, or SIGALRM from a test timeout) can land between any two
bytecodes, so these tests inject one deterministically at each place that matters: inside
torch's call, right after CUDA began or ended the capture, and in cgguard's own frame right
after torch returned.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest
import torch

import cgguard
from cgguard.testing import simulated_cuda

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from cgguard.testing import SimulatedCuda

pytestmark = pytest.mark.simulated


@pytest.fixture
def sim() -> Iterator[SimulatedCuda]:
    """The simulated runtime, with cgguard installed in raise mode."""
    with simulated_cuda() as runtime:
        cgguard.install(cgguard.Config(log_file="/dev/null"))
        yield runtime


def interrupted_after(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, then a KeyboardInterrupt, as if a signal landed as the C call returned."""

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        call(*args, **kwargs)
        raise KeyboardInterrupt("injected")

    return interrupted


def interrupt_at(function: Any, text: str) -> Callable[[Any, str, Any], Any]:
    """A trace function that raises KeyboardInterrupt in ``function``'s frame as it reaches
    the first line holding ``text``: a signal landing in cgguard's own bookkeeping."""
    lines, first = inspect.getsourcelines(function.__code__)  # not __wrapped__'s
    target = first + next(i for i, line in enumerate(lines) if text in line)
    code = function.__code__

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == target:
            raise KeyboardInterrupt("injected")
        return local

    def trace(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    return trace


def begin(graph: Any, stream: Any) -> None:
    with torch.cuda.stream(stream):
        graph.capture_begin()


def end(graph: Any, stream: Any) -> None:
    with torch.cuda.stream(stream):
        graph.capture_end()


def test_an_interrupt_as_torch_begins_a_capture_leaves_it_known(
    sim: SimulatedCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture CUDA began before an interrupt is still cgguard's: a nested one is refused."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    monkeypatch.setattr(type(sim), "_capture_begin", interrupted_after(type(sim)._capture_begin))
    with pytest.raises(KeyboardInterrupt):
        begin(graph, stream)
    monkeypatch.undo()
    with pytest.raises(cgguard.NestedCaptureError):
        begin(torch.cuda.CUDAGraph(), torch.cuda.Stream())
    end(graph, stream)
    assert cgguard.status().captures == ()


def test_an_interrupt_before_torch_begins_a_capture_leaves_nothing(
    sim: SimulatedCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture_begin interrupted before CUDA began anything is not a capture under way."""

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt("injected")

    monkeypatch.setattr(type(sim), "_capture_begin", interrupted)
    with pytest.raises(KeyboardInterrupt):
        begin(torch.cuda.CUDAGraph(), torch.cuda.Stream())
    assert cgguard.status().captures == ()


def test_an_interrupt_after_torch_ended_a_capture_leaves_no_phantom(sim: SimulatedCuda) -> None:
    """A capture CUDA ended just before an interrupt in cgguard's own frame does not make the
    thread's next capture nested, nor its synchronizes violations."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    begin(graph, stream)
    hook = vars(torch.cuda.graphs.CUDAGraph)["capture_end"]
    sys.settrace(interrupt_at(hook, "ended = active.pop("))
    try:
        with pytest.raises(KeyboardInterrupt):
            end(graph, stream)
    finally:
        sys.settrace(None)
    with cgguard.testing.capture_violations() as events:
        torch.cuda.synchronize()
        again = torch.cuda.CUDAGraph()
        with torch.cuda.graph(again):
            pass
    assert (events, cgguard.status().captures) == ([], ())


def test_a_subclass_whose_capture_end_skips_torchs_is_not_left_capturing(
    sim: SimulatedCuda,
) -> None:
    """A capture_end that calls the C base directly ends the capture; the thread's next
    capture is not refused as nested."""

    class Direct(torch.cuda.CUDAGraph):  # type: ignore[misc]
        def capture_end(self) -> None:
            # Past torch's Python method, which carries cgguard's hook.
            super(torch.cuda.graphs.CUDAGraph, self).capture_end()

    graph, stream = Direct(), torch.cuda.Stream()
    begin(graph, stream)
    end(graph, stream)
    with cgguard.testing.capture_violations() as events:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
    assert (events, cgguard.status().captures) == ([], ())


def test_another_threads_capture_is_never_judged_stale(sim: SimulatedCuda) -> None:
    """Only the calling thread's own records are checked against their streams: another
    thread's capture under way still makes a global capture here concurrent."""
    began, release = threading.Event(), threading.Event()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()

    def other() -> None:
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            began.set()
            assert release.wait(timeout=20)
            graph.capture_end()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert began.wait(timeout=20)
        cgguard.install(cgguard.Config(mode="log", log_file="/dev/null"))
        with cgguard.testing.capture_violations() as events:
            mine = torch.cuda.CUDAGraph()
            with torch.cuda.graph(mine, capture_error_mode="thread_local"):
                pass
            torch.cuda.synchronize()  # thread_local elsewhere: nothing to report
        assert [e["rule"] for e in events] == []
        assert [c.thread_id for c in cgguard.status().captures] == [thread.ident]
    finally:
        release.set()
        thread.join()


def test_a_capture_begin_refused_on_a_stream_another_capture_holds_leaves_no_record(
    sim: SimulatedCuda,
) -> None:
    """Two threads' torch.cuda.graph share torch's default capture stream: the second one's
    capture_begin fails there, and cgguard keeps no record of a capture that never began."""
    inside, tried = threading.Event(), threading.Event()
    failures: list[str] = []
    cgguard.install(cgguard.Config(mode="log", log_file="/dev/null"))

    def second() -> None:
        assert inside.wait(timeout=20)
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="thread_local"):
                pass
        except RuntimeError as exc:
            failures.append(type(exc).__name__)
        tried.set()

    with cgguard.testing.capture_violations() as events:
        thread = threading.Thread(target=second)
        thread.start()
        # The refused capture_begin invalidates the capture on that stream, as CUDA's does.
        with (
            pytest.raises(RuntimeError),
            torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="thread_local"),
        ):
            inside.set()
            assert tried.wait(timeout=20)
        thread.join()
        with torch.cuda.graph(torch.cuda.CUDAGraph()):  # the next capture: legitimate
            pass
    assert (len(failures), events, cgguard.status().captures) == (1, [], ())


def test_a_refused_second_capture_begin_into_a_capturing_graph_keeps_its_capture(
    sim: SimulatedCuda,
) -> None:
    """A capture_begin into a graph already capturing, that torch refuses, does not make cgguard
    forget the capture under way: a synchronize during it is still reported."""
    cgguard.install(cgguard.Config(mode="log", log_file="/dev/null"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    begin(graph, stream)
    with pytest.raises(RuntimeError):
        graph.capture_begin()  # on the default stream: torch refuses it
    with cgguard.testing.capture_violations() as events:
        with pytest.raises(RuntimeError):
            torch.cuda.synchronize()  # fails as CUDA fails it, and invalidates the capture
    with pytest.raises(RuntimeError):
        end(graph, stream)
    assert [e["rule"] for e in events] == ["sync_during_capture"]
