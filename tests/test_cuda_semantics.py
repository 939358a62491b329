"""End to end: synchronizes and queries as CUDA treats them (docs/cuda-behaviour.md), on every
thread, and torch.accelerator's graph and synchronize.

The simulated scenarios run here; the `cuda` ones where a GPU exists.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

import pytest
import torch
from helpers import SourceFile

import cgguard

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.conftest import Runtime

THIS_FILE = SourceFile(__file__)
frame = THIS_FILE.frame
PROHIBITED = "operation not permitted"
INVALIDATED = "previous error during capture"
# torch.accelerator.Graph: torch 2.13 and later.
HAS_ACCELERATOR_GRAPH = isinstance(
    getattr(getattr(torch, "accelerator", None), "Graph", None), type
)


def on_thread(name: str, target: Callable[[], object]) -> object:
    """Run ``target`` on a thread called ``name``; its result or the exception it raised."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(target())
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join(timeout=30)
    return out[0]


def begin(mode: str) -> tuple[Any, Any]:
    """A raw capture on a fresh side stream of this thread: (graph, stream)."""
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(capture_error_mode=mode)  # @begin
    return graph, stream


def end(graph: Any) -> None:
    graph.capture_end()
    torch.cuda.set_stream(torch.cuda.default_stream())


def test_an_event_never_recorded_is_no_violation(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """Its synchronize and query make no CUDA call: nothing to report, even set to raise."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    never = torch.cuda.Event()
    graph, _ = begin("global")
    runtime.tensor().add_(1)
    never.synchronize()
    assert never.query() is True
    end(graph)
    graph.replay()
    assert events == []


@pytest.mark.parametrize("call", ["synchronize", "query"])
def test_another_threads_call_during_a_global_capture_is_reported_with_both_stacks(
    runtime: Runtime, events: list[dict[str, Any]], call: str
) -> None:
    """In global mode CUDA fails every thread's unsafe call: a thread that is not capturing gets
    the report, naming the capture and the thread that holds it."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    done = torch.cuda.Event()
    done.record()  # before the capture, on the default stream
    graph, _ = begin("global")
    runtime.tensor().add_(1)

    def other() -> None:
        getattr(done, call)()  # @other-call

    error = on_thread("cgg-other", other)
    assert isinstance(error, cgguard.SyncDuringCaptureError)
    end(graph)  # refused before CUDA: the capture is intact
    graph.replay()
    (event,) = events
    api = f"Event.{call}"
    verb = "queries" if call == "query" else "synchronizes"
    assert (
        event["api"],
        event["thread"],
        event["capture_thread_id"],
        event["stack"][-1],
        event["capture_stack"][-1],
    ) == (
        api,
        "cgg-other",
        threading.get_ident(),
        frame("@other-call", "other"),
        frame("@begin", "begin"),
    )
    assert event["message"].startswith(
        f"Synchronize during CUDA graph capture: {api} at {THIS_FILE.path}:"
        f"{THIS_FILE.line_of('@other-call')} (in other) {verb} while thread "
        f"{threading.get_ident()}'s capture begun at "
    )
    assert event["message"].endswith(
        "is active in capture_error_mode 'global', in which CUDA fails an unsafe call on any "
        "thread ('operation not permitted when stream is capturing') and invalidates the capture."
    )


@pytest.mark.parametrize("mode", ["thread_local", "relaxed"])
def test_another_threads_synchronize_is_not_checked_outside_global_mode(
    runtime: Runtime, events: list[dict[str, Any]], mode: str
) -> None:
    """thread_local and relaxed captures prohibit nothing on other threads that CUDA documents."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    done = torch.cuda.Event()
    done.record()
    graph, _ = begin(mode)
    runtime.tensor().add_(1)
    assert on_thread("cgg-other", done.query) is True
    end(graph)
    assert events == []


def test_a_global_capture_broken_by_another_threads_query_in_log_mode(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """Log mode reports the query, then CUDA fails it and the capture, as without cgguard."""
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    done = torch.cuda.Event()
    done.record()
    graph, _ = begin("global")
    runtime.tensor().add_(1)
    error = on_thread("cgg-watchdog", done.query)
    assert isinstance(error, RuntimeError)
    assert not isinstance(error, cgguard.CaptureViolation)
    assert PROHIBITED in str(error)
    with pytest.raises(RuntimeError, match=INVALIDATED):
        graph.capture_end()
    torch.cuda.set_stream(torch.cuda.default_stream())
    assert [(e["rule"], e["action"], e["api"], e["thread"]) for e in events] == [
        ("sync_during_capture", "logged", "Event.query", "cgg-watchdog")
    ]


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_querying_the_capturing_stream_is_reported_in_every_mode(
    runtime: Runtime, events: list[dict[str, Any]], mode: str
) -> None:
    """CUDA fails a query of the capturing stream in every mode."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    graph, stream = begin(mode)
    runtime.tensor().add_(1)
    with pytest.raises(cgguard.SyncDuringCaptureError):
        stream.query()  # @stream-query
    end(graph)
    assert [(e["api"], e["stack"][-1]) for e in events] == [
        (
            "Stream.query",
            frame("@stream-query", "test_querying_the_capturing_stream_is_reported_in_every_mode"),
        )
    ]


def test_a_query_of_another_stream_during_a_relaxed_capture_is_legal(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """Relaxed mode lets the capturing thread poll other work."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    side = torch.cuda.Stream()
    graph, _ = begin("relaxed")
    runtime.tensor().add_(1)
    assert side.query() is True
    end(graph)
    assert events == []


@pytest.mark.skipif(not HAS_ACCELERATOR_GRAPH, reason="needs torch.accelerator.Graph (torch 2.13+)")
def test_accelerator_graph_inside_a_capture_is_refused_before_torch_runs(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """torch.accelerator.Graph is checked like torch.cuda.graph: a nested one is refused in
    __enter__ before its synchronize, and a raw capture_begin before CUDA."""
    cgguard.install(cgguard.Config(log_file=os.devnull))
    outer = torch.cuda.CUDAGraph()
    # Bare instances: on a machine without a device torch cannot construct one, and a refused
    # capture never reaches the C half.
    inner = torch.accelerator.Graph.__new__(torch.accelerator.Graph)
    inner.capture_error_mode = "default"
    with torch.cuda.graph(outer):  # @outer
        runtime.tensor().add_(1)
        with pytest.raises(cgguard.NestedCaptureError):
            with inner:  # @accelerator-with
                pytest.fail("the body of a refused capture ran")
        with pytest.raises(cgguard.NestedCaptureError):
            inner.capture_begin()  # @accelerator-begin
    test = "test_accelerator_graph_inside_a_capture_is_refused_before_torch_runs"
    got = [(e["rule"], e["api"], e["stack"][-1], e["outer_stack"][-1]) for e in events]
    assert got == [
        (
            "nested_capture",
            "torch.accelerator.Graph",
            frame("@accelerator-with", test),
            frame("@outer", test),
        ),
        (
            "nested_capture",
            "Graph.capture_begin",
            frame("@accelerator-begin", test),
            frame("@outer", test),
        ),
    ]


@pytest.mark.skipif(not HAS_ACCELERATOR_GRAPH, reason="needs torch.accelerator.Graph (torch 2.13+)")
def test_an_accelerator_graph_with_nothing_capturing_is_counted_as_its_own_api(
    runtime: Runtime,
) -> None:
    """With nothing capturing, torch.accelerator.Graph's hooks take the path that makes no
    check() call: a raw capture_begin is still counted at its line as Graph.capture_begin, in
    its graph's mode, and an __enter__ that torch fails leaves nothing under way."""
    if runtime.simulation is None:
        pytest.skip("a bare Graph is what a machine without a device has; a device has real ones")
    cgguard.install(cgguard.Config(log_file=os.devnull))
    # A bare instance: without a device torch cannot construct one; its C half then fails.
    graph = torch.accelerator.Graph.__new__(torch.accelerator.Graph)
    graph.capture_error_mode = "relaxed"
    with pytest.raises(AttributeError):
        graph.capture_begin()  # @accelerator-raw
    with pytest.raises(RuntimeError):
        with graph:
            pytest.fail("the body of a capture torch failed ran")
    (site,) = cgguard.census()["captures"]
    assert (site["line"], site["apis"], site["modes"], site["errors"]) == (
        THIS_FILE.line_of("@accelerator-raw"),
        {"Graph.capture_begin": 1},
        {"relaxed": 1},
        {"AttributeError": 1},
    )
    assert cgguard.status().captures == ()


@pytest.mark.skipif(not HAS_ACCELERATOR_GRAPH, reason="needs torch.accelerator (torch 2.13+)")
def test_accelerator_synchronize_during_a_capture_is_reported(
    runtime: Runtime, events: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.accelerator.synchronize() lands in torch._C._accelerator_synchronizeDevice,
    checked like torch.cuda.synchronize()."""
    if runtime.simulation is not None:
        # Without a device torch fails to name the current one before the synchronize.
        monkeypatch.setattr(torch.accelerator, "_get_device_index", lambda *args, **kwargs: 0)
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    graph, _ = begin("global")
    runtime.tensor().add_(1)
    with pytest.raises(cgguard.SyncDuringCaptureError):
        torch.accelerator.synchronize()  # @accelerator-sync
    end(graph)
    test = "test_accelerator_synchronize_during_a_capture_is_reported"
    assert [(e["api"], e["stack"][-1]) for e in events] == [
        ("torch.accelerator.synchronize", frame("@accelerator-sync", test))
    ]


@pytest.mark.cuda
def test_accelerator_graph_nested_in_a_cuda_graph_on_a_gpu(events: list[dict[str, Any]]) -> None:
    """On a GPU: a real torch.accelerator.Graph begun inside a torch.cuda.graph is refused."""
    cgguard.install(cgguard.Config(log_file=os.devnull))
    x = torch.zeros(4, device="cuda")
    outer, inner = torch.cuda.CUDAGraph(), torch.accelerator.Graph()
    with torch.cuda.graph(outer):
        x.add_(1)
        with pytest.raises(cgguard.NestedCaptureError):
            with inner:
                pytest.fail("the body of a refused capture ran")
    outer.replay()
    plain = torch.accelerator.Graph()
    with torch.cuda.stream(torch.cuda.Stream()), plain:
        x.add_(1)
    plain.replay()
    assert [(e["rule"], e["api"]) for e in events] == [
        ("nested_capture", "torch.accelerator.Graph")
    ]
    assert cgguard.status().captures == ()


# --- Events recorded into a capture ------------------------------------------------------


@pytest.mark.parametrize("mode", ["thread_local", "relaxed"])
@pytest.mark.parametrize("call", ["synchronize", "query"])
def test_an_event_recorded_in_a_capture_is_reported_on_any_thread_in_every_mode(
    runtime: Runtime, events: list[dict[str, Any]], mode: str, call: str
) -> None:
    """cudaErrorCapturedEvent: refused before CUDA, on a thread that does not capture, even
    where the capture's mode prohibits nothing on other threads."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    graph, _ = begin(mode)
    runtime.tensor().add_(1)
    inside = torch.cuda.Event()
    inside.record()  # @record-inside

    def other() -> None:
        getattr(inside, call)()  # @captured-call

    error = on_thread("cgg-other", other)
    assert isinstance(error, cgguard.SyncDuringCaptureError)
    end(graph)
    graph.replay()
    (event,) = events
    verb = "queries" if call == "query" else "synchronizes"
    assert (event["api"], event["capture_thread_id"], event["stack"][-1]) == (
        f"Event.{call}",
        threading.get_ident(),
        frame("@captured-call", "other"),
    )
    assert event["message"].startswith(
        f"Synchronize during CUDA graph capture: Event.{call} at {THIS_FILE.path}:"
        f"{THIS_FILE.line_of('@captured-call')} (in other) {verb} an event last recorded in "
        f"thread {threading.get_ident()}'s capture begun at "
    )
    assert event["message"].endswith(
        "which is active; CUDA fails it in every capture_error_mode ('operation not permitted "
        "on an event last recorded in a capturing stream')."
    )


def test_a_captured_events_query_in_log_mode_then_fails_in_cuda(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """Log mode: reported, then CUDA's own error; a relaxed capture survives it."""
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    graph, _ = begin("relaxed")
    runtime.tensor().add_(1)
    inside = torch.cuda.Event()
    inside.record()
    with pytest.raises(RuntimeError, match="event last recorded in a capturing stream") as cuda:
        inside.query()
    assert not isinstance(cuda.value, cgguard.CaptureViolation)
    end(graph)
    assert [(e["rule"], e["action"], e["api"]) for e in events] == [
        ("sync_during_capture", "logged", "Event.query")
    ]


def test_an_event_recorded_in_a_capture_that_ended_or_rerecorded_is_not_reported(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """Once its capture ends, or once recorded again outside it, it is an ordinary event."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    ended, again = torch.cuda.Event(), torch.cuda.Event()
    first, _ = begin("relaxed")
    runtime.tensor().add_(1)
    ended.record()
    end(first)
    # What CUDA does with an event whose capture has ended is not settled
    # (docs/cuda-behaviour.md): the simulation lets it through, a GPU may not; cgguard reports
    # nothing either way.
    after = on_thread("cgg-after", ended.synchronize)
    assert not isinstance(after, cgguard.CaptureViolation)
    if runtime.simulation is not None:
        assert after is None
    second, _ = begin("relaxed")
    runtime.tensor().add_(1)
    again.record()
    again.record(torch.cuda.default_stream())  # its last record is outside the capture now
    assert on_thread("cgg-rerecorded", again.synchronize) is None
    end(second)
    assert events == []


@pytest.mark.parametrize("call", ["synchronize", "query"])
def test_another_threads_call_on_the_capturing_stream_is_reported_in_thread_local_mode(
    runtime: Runtime, events: list[dict[str, Any]], call: str
) -> None:
    """Waiting on a stream that captures fails in every mode, whoever waits."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    graph, stream = begin("thread_local")
    runtime.tensor().add_(1)

    def other() -> None:
        getattr(stream, call)()  # @stream-call

    assert isinstance(on_thread("cgg-other", other), cgguard.SyncDuringCaptureError)
    end(graph)
    graph.replay()
    (event,) = events
    verb = "queries" if call == "query" else "synchronizes"
    assert (event["api"], event["capture_thread_id"], event["stack"][-1]) == (
        f"Stream.{call}",
        threading.get_ident(),
        frame("@stream-call", "other"),
    )
    assert event["message"].startswith(
        f"Synchronize during CUDA graph capture: Stream.{call} at {THIS_FILE.path}:"
        f"{THIS_FILE.line_of('@stream-call')} (in other) {verb} the stream of thread "
        f"{threading.get_ident()}'s capture begun at "
    )
    assert event["message"].endswith(
        "which is active; CUDA fails it in every capture_error_mode ('operation not permitted "
        "when stream is capturing') and invalidates the capture."
    )


def test_a_captured_event_on_another_thread_during_a_global_capture_is_a_prohibited_call(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """The global capture prohibits the call before CUDA looks at the event: the message says
    the capture is lost, as the simulation's pick has it (docs/cuda-behaviour.md)."""
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    graph, _ = begin("global")
    runtime.tensor().add_(1)
    inside = torch.cuda.Event()
    inside.record()
    error = on_thread("cgg-other", inside.query)
    assert isinstance(error, RuntimeError)
    if runtime.simulation is not None:
        assert "when stream is capturing" in str(error)
        with pytest.raises(RuntimeError, match=INVALIDATED):
            graph.capture_end()
    else:
        with contextlib.suppress(RuntimeError):
            graph.capture_end()
    torch.cuda.set_stream(torch.cuda.default_stream())
    (event,) = events
    assert event["message"].endswith(
        "is active in capture_error_mode 'global', in which CUDA fails an unsafe call on any "
        "thread ('operation not permitted when stream is capturing') and invalidates the capture."
    )


def test_elapsed_time_queries_both_events(runtime: Runtime, events: list[dict[str, Any]]) -> None:
    """CUDAEvent::elapsed_time queries both events: one recorded into a capture fails it."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    graph, _ = begin("relaxed")
    runtime.tensor().add_(1)
    stop = torch.cuda.Event(enable_timing=True)
    stop.record()
    error = on_thread("cgg-timer", lambda: start.elapsed_time(stop))  # @elapsed
    assert isinstance(error, cgguard.SyncDuringCaptureError)
    end(graph)
    assert [(e["api"], e["thread"]) for e in events] == [("Event.elapsed_time", "cgg-timer")]


def test_an_event_recorded_on_a_stream_that_joined_the_capture(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A side stream that waits on the capturing stream joins its capture (a fork): an event
    recorded there is captured too, and CUDA fails its query on any thread."""
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    graph, stream = begin("relaxed")
    runtime.tensor().add_(1)
    side = torch.cuda.Stream()
    side.wait_stream(stream)  # the fork
    with torch.cuda.stream(side):
        assert torch.cuda.is_current_stream_capturing() is True
        runtime.tensor().add_(1)
        forked = torch.cuda.Event()
        forked.record()
    stream.wait_stream(side)  # the join
    error = on_thread("cgg-other", forked.query)
    assert isinstance(error, RuntimeError)
    assert "event last recorded in a capturing stream" in str(error)
    end(graph)
    assert [(e["api"], e["thread"]) for e in events] == [("Event.query", "cgg-other")]


def test_an_event_from_an_earlier_capture_of_the_same_graph_is_ordinary(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A keep_graph=True graph captures again: an event of its first capture is not captured
    in the second."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    graph, stream = torch.cuda.CUDAGraph(keep_graph=True), torch.cuda.Stream()
    earlier = torch.cuda.Event()
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="relaxed")
        runtime.tensor().add_(1)
        earlier.record()
        graph.capture_end()
        graph.capture_begin(capture_error_mode="relaxed")
        runtime.tensor().add_(1)
        outcome = on_thread("cgg-other", earlier.query)
        graph.capture_end()
    assert not isinstance(outcome, cgguard.CaptureViolation)
    if runtime.simulation is not None:
        assert outcome is True  # the simulation's pick for an ended capture's event
    assert events == []


class _Held:
    """Something a capturing function holds, as a model holds its static tensors."""


def test_an_event_that_outlives_its_capture_keeps_no_frame_alive(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """The captured-event record goes when its capture ends: the frame that began the capture,
    with its locals, is not kept by an event the program keeps."""
    cgguard.install(cgguard.Config(log_file=os.devnull))

    def capture(graph: Any) -> tuple[Any, weakref.ref[_Held]]:
        held = _Held()
        done = torch.cuda.Event()
        with torch.cuda.graph(graph):
            runtime.tensor().add_(1)
            done.record()
        return done, weakref.ref(held)

    graph = torch.cuda.CUDAGraph()
    kept, local = capture(graph)
    gc.collect()
    assert local() is None
    assert kept.query() is True  # an ordinary event again, not reported
    assert events == []
