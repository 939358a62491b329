"""End to end: cgguard installed on torch, every scenario of the two rules on a capture runtime.

Each test runs on cgguard's simulated CUDA runtime, and again on a real GPU where one exists.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from helpers import DISABLED_SENTENCE, SourceFile, tracker
from torch.cuda import graph as graph_taken_early

import cgguard
from cgguard import _process
from cgguard._rules import record as _record

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.conftest import Runtime

THIS_FILE = SourceFile(__file__)
line_of, frame = THIS_FILE.line_of, THIS_FILE.frame


class PluginGraph(torch.cuda.graph):
    """A library's own subclass of torch.cuda.graph, defined before cgguard is installed."""


def install(mode: str = "raise") -> None:
    cgguard.install(cgguard.Config(mode=mode, log_format="json"))  # type: ignore[arg-type]


def run_in_thread(target: Callable[[], None]) -> threading.Thread:
    """Start ``target`` on a thread that re-raises its failure when joined by ``join_all``."""
    thread = threading.Thread(target=_keep_error, args=(target,))
    thread.start()
    return thread


_thread_errors: list[BaseException] = []


def _keep_error(target: Callable[[], None]) -> None:
    try:
        target()
    except BaseException as exc:
        _thread_errors.append(exc)


def join_all(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a scenario thread hung"
    if _thread_errors:
        raise _thread_errors.pop()


def test_capture_refused_while_disabled_changes_nothing(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A torch.cuda.graph begun while capture is disabled is refused before torch moves a stream."""
    install()
    g = torch.cuda.CUDAGraph()
    stream_before = torch.cuda.current_stream()
    calls_before = len(runtime.simulation.calls) if runtime.simulation else 0
    with cgguard.capture_disabled():  # @disabled-here
        with pytest.raises(cgguard.CaptureDisabledError) as raised:
            with torch.cuda.graph(g):  # @refused-graph
                pytest.fail("the body of a refused capture ran")
        assert cgguard.is_capture_enabled() is False
    assert cgguard.is_capture_enabled() is True
    assert torch.cuda.current_stream() == stream_before
    assert torch.cuda.is_current_stream_capturing() is False
    assert cgguard.status().captures == ()
    if runtime.simulation:
        assert runtime.simulation.calls[calls_before:] == []
    message = str(raised.value)
    assert message.startswith(DISABLED_SENTENCE)
    assert f"capture was disabled at {__file__}:{line_of('@disabled-here')} " in message
    event = raised.value.event
    assert events == [event]
    assert (event["rule"], event["action"], event["api"]) == (
        "capture_disabled",
        "raised",
        "torch.cuda.graph",
    )
    test = "test_capture_refused_while_disabled_changes_nothing"
    assert event["stack"][-1] == frame("@refused-graph", test)
    assert event["disabled_stack"][-1] == frame("@disabled-here", test)


def test_capture_allowed_again_after_reenabling(runtime: Runtime) -> None:
    """set_capture_enabled(True) lets the next capture through and the graph replays."""
    install()
    cgguard.set_capture_enabled(False)
    cgguard.set_capture_enabled(True)
    g, x = torch.cuda.CUDAGraph(), runtime.tensor()
    with torch.cuda.graph(g):
        x.add_(1)
    g.replay()
    assert cgguard.status().captures == ()


def test_nested_graph_refused_with_outer_stack(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A torch.cuda.graph inside another on one thread is refused, naming where the outer began."""
    install()
    outer, x = torch.cuda.CUDAGraph(), runtime.tensor()
    with torch.cuda.graph(outer):  # @outer-graph
        x.add_(1)
        with pytest.raises(cgguard.NestedCaptureError) as raised:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):  # @inner-graph
                pytest.fail("the body of a refused capture ran")
        assert torch.cuda.is_current_stream_capturing() is True
    outer.replay()
    test = "test_nested_graph_refused_with_outer_stack"
    event = raised.value.event
    assert events == [event]
    assert event["rule"] == "nested_capture"
    assert event["stack"][-1] == frame("@inner-graph", test)
    assert event["outer_stack"][-1] == frame("@outer-graph", test)
    assert f"begun at {__file__}:{line_of('@outer-graph')} " in str(raised.value)


def test_nested_raw_capture_begin_refused(runtime: Runtime, events: list[dict[str, Any]]) -> None:
    """A raw capture_begin on a thread that is capturing is refused; the outer capture goes on."""
    install()
    outer, inner, x = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), runtime.tensor()
    with torch.cuda.graph(outer):  # @outer-for-raw
        x.add_(1)
        with torch.cuda.stream(torch.cuda.Stream()), pytest.raises(cgguard.NestedCaptureError):
            inner.capture_begin()  # @inner-raw
    outer.replay()
    test = "test_nested_raw_capture_begin_refused"
    (event,) = events
    assert event["api"] == "CUDAGraph.capture_begin"
    assert event["stack"][-1] == frame("@inner-raw", test)
    assert event["outer_stack"][-1] == frame("@outer-for-raw", test)


def test_subclass_and_early_reference_are_guarded(runtime: Runtime) -> None:
    """Subclasses and names bound before install() reach the same guarded entry points."""
    install()
    with cgguard.capture_disabled():
        with pytest.raises(cgguard.CaptureDisabledError):
            with PluginGraph(torch.cuda.CUDAGraph()):
                pass
        with pytest.raises(cgguard.CaptureDisabledError):
            with graph_taken_early(torch.cuda.CUDAGraph()):
                pass


def test_sequential_segments_are_legal(runtime: Runtime, events: list[dict[str, Any]]) -> None:
    """begin, end, begin, end on one thread (a breakable capture's segments) is not nesting."""
    install()
    segments, x = [torch.cuda.CUDAGraph() for _ in range(3)], runtime.tensor()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for segment in segments:
            segment.capture_begin()
            x.add_(1)
            segment.capture_end()
    for segment in segments:
        segment.replay()
    assert events == []
    assert cgguard.status().captures == ()


def test_other_thread_capturing_is_not_nesting(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A capture on thread B while thread A captures is not nested, and B may launch into A's."""
    install()
    a_capturing, b_done = threading.Event(), threading.Event()
    a_stream = torch.cuda.Stream()
    x, y = runtime.tensor(), runtime.tensor()

    def thread_a() -> None:
        with torch.cuda.graph(
            torch.cuda.CUDAGraph(), stream=a_stream, capture_error_mode="thread_local"
        ):
            x.add_(1)
            a_capturing.set()
            assert b_done.wait(timeout=20)

    def thread_b() -> None:
        assert a_capturing.wait(timeout=20)
        try:
            with torch.cuda.stream(a_stream):  # work launched into A's capture from B
                x.add_(1)
            # Begun raw: torch.cuda.graph's own device synchronize while A holds a thread_local
            # capture is one of the behaviours CUDA's documents leave unsettled
            # (docs/cuda-behaviour.md), and this test must hold on a GPU either way.
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(torch.cuda.Stream()):
                graph.capture_begin(capture_error_mode="thread_local")
                y.add_(1)
                graph.capture_end()
        finally:
            b_done.set()

    join_all(run_in_thread(thread_a), run_in_thread(thread_b))
    assert events == []
    assert cgguard.status().captures == ()


def test_body_exception_leaves_no_active_capture(runtime: Runtime) -> None:
    """An exception in the body of torch.cuda.graph ends the capture for cgguard too."""
    install()
    x = runtime.tensor()
    with pytest.raises(KeyError), torch.cuda.graph(torch.cuda.CUDAGraph()):
        x.add_(1)
        raise KeyError("body failed")
    assert cgguard.status().captures == ()
    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # not nested: the first one is over
        x.add_(1)


def test_capture_begin_exception_leaves_no_active_capture(runtime: Runtime) -> None:
    """A capture_begin that torch refuses (the default stream) leaves nothing active."""
    install()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()
    assert cgguard.status().captures == ()
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        runtime.tensor().add_(1)


def test_capture_end_exception_leaves_no_active_capture(runtime: Runtime) -> None:
    """A capture_end that fails (capture invalidated by a synchronize) leaves nothing active."""
    install()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        g.capture_begin()
        with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
            torch.cuda.synchronize()
        with pytest.raises(RuntimeError, match="previous error during capture"):
            g.capture_end()
        assert torch.cuda.is_current_stream_capturing() is False
    assert cgguard.status().captures == ()
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        runtime.tensor().add_(1)


def test_log_mode_reports_and_lets_the_capture_proceed(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """In log mode a capture while disabled is reported, then captured and replayable."""
    install("log")
    g, x = torch.cuda.CUDAGraph(), runtime.tensor()
    with cgguard.capture_disabled():
        with torch.cuda.graph(g):  # @logged-graph
            x.add_(1)
    g.replay()
    (event,) = events
    assert (event["rule"], event["action"], event["level"]) == (
        "capture_disabled",
        "logged",
        "warning",
    )
    assert event["stack"][-1] == frame(
        "@logged-graph", "test_log_mode_reports_and_lets_the_capture_proceed"
    )


def test_log_mode_nested_graph_reports_then_fails_as_cuda_does(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """Log mode reports a nested torch.cuda.graph; CUDA then fails it and the outer capture."""
    install("log")
    x = runtime.tensor()
    with pytest.raises(RuntimeError, match="previous error during capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            x.add_(1)
            with pytest.raises(
                RuntimeError, match="operation not permitted when stream is capturing"
            ):
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    pass
    # torch's own synchronize() in the inner __enter__ breaks the outer capture: it is part of
    # the nested capture reported, not a second violation.
    assert [(e["rule"], e["action"]) for e in events] == [("nested_capture", "logged")]
    assert cgguard.status().captures == ()
    assert torch.cuda.is_current_stream_capturing() is False


def test_threads_see_only_their_own_captures(runtime: Runtime) -> None:
    """Captures begun on two threads are each recorded against their own thread."""
    install()
    both_capturing = threading.Barrier(3)
    release = threading.Event()

    def capture() -> None:
        # Each thread its own stream, and raw captures: torch.cuda.graph's device synchronize
        # while the other thread captures thread_local is not settled (docs/cuda-behaviour.md).
        graph, x = torch.cuda.CUDAGraph(), runtime.tensor()
        with torch.cuda.stream(torch.cuda.Stream()):
            graph.capture_begin(capture_error_mode="thread_local")
            x.add_(1)
            both_capturing.wait(timeout=20)
            assert release.wait(timeout=20)
            graph.capture_end()

    threads = [run_in_thread(capture), run_in_thread(capture)]
    both_capturing.wait(timeout=20)
    owners = sorted(capture.thread_id for capture in cgguard.status().captures)
    assert owners == sorted(t.ident for t in threads if t.ident is not None)
    assert threading.get_ident() not in owners
    release.set()
    join_all(*threads)
    assert cgguard.status().captures == ()


def test_frames_hide_cgguard_and_torch(runtime: Runtime) -> None:
    """No reported frame comes from cgguard's or torch's own files."""
    install()
    with cgguard.capture_disabled(), pytest.raises(cgguard.CaptureDisabledError) as raised:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
    hidden = (str(Path(cgguard.__file__).parent), str(Path(torch.__file__).parent))
    files = [f["file"] for f in raised.value.event["stack"]]
    assert files
    assert not [f for f in files if f.startswith(hidden)]
    assert sys.modules["cgguard"] is cgguard


def begin_in_helper(graph: Any) -> None:
    """A helper that begins a raw capture and returns, as a breakable capture's segments do."""
    graph.capture_begin()  # @helper-begins


def test_outer_stack_of_a_helper_that_returned(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A capture begun in a helper that returned is reported at the lines where it began."""
    install()
    outer, inner, x = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), runtime.tensor()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        begin_in_helper(outer)  # @calls-helper
        x.add_(1)
        with pytest.raises(cgguard.NestedCaptureError) as raised:
            inner.capture_begin()
        outer.capture_end()
    test = "test_outer_stack_of_a_helper_that_returned"
    assert raised.value.event["outer_stack"][-2:] == [
        frame("@calls-helper", test),
        frame("@helper-begins", "begin_in_helper"),
    ]


@contextlib.contextmanager
def capturing(graph: Any) -> Iterator[None]:
    """A library's context manager around torch.cuda.graph: a generator frame."""
    with torch.cuda.graph(graph):  # @generator-captures
        yield


def test_outer_stack_through_a_context_manager(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A capture opened in a @contextmanager keeps its callers in the outer stack."""
    install()
    x = runtime.tensor()
    with capturing(torch.cuda.CUDAGraph()):  # @enters-helper
        x.add_(1)
        with pytest.raises(cgguard.NestedCaptureError) as raised:
            torch.cuda.CUDAGraph().capture_begin()
    stack = [f for f in raised.value.event["outer_stack"] if f["file"] == __file__]
    test = "test_outer_stack_through_a_context_manager"
    assert stack[-2:] == [frame("@enters-helper", test), frame("@generator-captures", "capturing")]


def test_nothing_left_behind_when_enter_makes_no_capture_begin(runtime: Runtime) -> None:
    """A graph whose capture_begin delegates elsewhere leaves no pending entry behind."""
    install()

    class Delegating(torch.cuda.CUDAGraph):  # type: ignore[misc, name-defined]
        def capture_begin(self, *args: Any, **kwargs: Any) -> None:
            self.inner.capture_begin(*args, **kwargs)

        def capture_end(self) -> None:
            self.inner.capture_end()

    graph = Delegating()
    graph.inner = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runtime.tensor().add_(1)
    assert cgguard.status().captures == ()
    assert tracker().entering.capture is None  # nothing half-begun left behind


def open_capture(context: Any) -> None:
    """A helper that enters a capture context and returns, as ExitStack.enter_context does."""
    context.__enter__()  # @helper-enters


def test_outer_stack_of_a_context_entered_by_a_helper(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A torch.cuda.graph entered by a helper that returned is reported where it was entered."""
    install()
    context, x = torch.cuda.graph(torch.cuda.CUDAGraph()), runtime.tensor()
    open_capture(context)  # @calls-opener
    x.add_(1)
    with pytest.raises(cgguard.NestedCaptureError) as raised:
        torch.cuda.CUDAGraph().capture_begin()
    context.__exit__(None, None, None)
    test = "test_outer_stack_of_a_context_entered_by_a_helper"
    assert raised.value.event["outer_stack"][-2:] == [
        frame("@calls-opener", test),
        frame("@helper-enters", "open_capture"),
    ]


@pytest.mark.simulated
@pytest.mark.parametrize("followed", [False, True], ids=["no-flag-followed", "flag-followed"])
def test_capture_begun_while_torch_prepares_another_is_concurrent(
    followed: bool, events: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thread B begins a capture while thread A's torch.cuda.graph is still preparing: reported,
    whether or not another framework's capture flag is followed."""
    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        install("log")
        if followed:
            framework = types.ModuleType("cgg_framework")
            framework.capture_ok = True  # type: ignore[attr-defined]
            monkeypatch.setitem(sys.modules, "cgg_framework", framework)
            cgguard.follow_flag("cgg_framework", "capture_ok")
            assert cgguard.status().followed == ("cgg_framework.capture_ok",)
        in_window, b_began, release = threading.Event(), threading.Event(), threading.Event()
        # torch.cuda.graph.__enter__ calls torch.cuda.empty_cache() between its synchronize and
        # capture_begin in every torch release (torch._C._host_emptyCache not in 2.1).
        empty_cache = torch.cuda.empty_cache

        def slow_empty_cache() -> None:
            if threading.current_thread().name == "A":
                in_window.set()
                assert b_began.wait(timeout=20)
            empty_cache()

        torch.cuda.empty_cache = slow_empty_cache
        b_graph, b_stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()

        def thread_a() -> None:
            with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=torch.cuda.Stream()):
                pass

        def thread_b() -> None:
            assert in_window.wait(timeout=20)
            with torch.cuda.stream(b_stream):
                b_graph.capture_begin(capture_error_mode="thread_local")
            b_began.set()
            # Alive until its capture ends, which it ends itself: a capture whose thread ended
            # is abandoned, and CUDA ends a non-relaxed capture only on the thread that began it.
            assert release.wait(timeout=20)
            with torch.cuda.stream(b_stream):
                b_graph.capture_end()

        a = threading.Thread(target=_keep_error, args=(thread_a,), name="A")
        a.start()
        b = run_in_thread(thread_b)
        try:
            join_all(a)
        finally:
            torch.cuda.empty_cache = empty_cache
        release.set()
        join_all(b)
    assert [(e["rule"], e["api"], e["action"]) for e in events] == [
        ("concurrent_capture", "torch.cuda.graph", "logged")
    ]


def test_capture_end_refused_by_torch_leaves_the_capture_active(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A capture_end torch refuses before CUDA ends the capture (another stream) keeps it active:
    a capture begun on that thread afterwards is still nested."""
    install()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph.capture_begin()  # @refused-end-outer
    # On the current stream, not the capture's: torch refuses before cudaStreamEndCapture.
    with pytest.raises(RuntimeError, match="Capture must end on the same stream it began on"):
        graph.capture_end()
    assert [(c.thread_id, c.api) for c in cgguard.status().captures] == [
        (threading.get_ident(), "CUDAGraph.capture_begin")
    ]
    with pytest.raises(cgguard.NestedCaptureError):
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.CUDAGraph().capture_begin()
    with torch.cuda.stream(stream):
        graph.capture_end()
    assert cgguard.status().captures == ()
    test = "test_capture_end_refused_by_torch_leaves_the_capture_active"
    assert [(e["rule"], e["outer_stack"][-1]) for e in events] == [
        ("nested_capture", frame("@refused-end-outer", test))
    ]


@pytest.mark.simulated
def test_synchronize_made_by_capture_begin_once_capturing_is_reported(
    events: list[dict[str, Any]],
) -> None:
    """A graph whose capture_begin synchronizes once capturing, inside __enter__: reported."""
    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        install("log")

        class Syncing(torch.cuda.CUDAGraph):  # type: ignore[misc, name-defined]
            def capture_begin(self, *args: Any, **kwargs: Any) -> None:
                super().capture_begin(*args, **kwargs)
                torch.cuda.synchronize()  # @syncs-once-capturing

        # Relaxed: CUDA lets a device-wide synchronize through, so the capture goes on.
        with torch.cuda.graph(Syncing(), capture_error_mode="relaxed"):
            pass
    rules = [(e["rule"], e["api"]) for e in events]
    assert rules == [("sync_during_capture", "torch.cuda.synchronize")]
    assert events[0]["stack"][-1] == frame("@syncs-once-capturing", "capture_begin")


@pytest.mark.simulated
def test_capture_made_while_torch_prepares_another_on_one_thread(
    events: list[dict[str, Any]],
) -> None:
    """A capture made by a hook inside torch.cuda.graph's __enter__ leaves the outer one whole."""
    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        install("log")
        # Called by torch.cuda.graph.__enter__ before capture_begin in every torch release.
        empty_cache, hooked = torch.cuda.empty_cache, []

        def capturing_empty_cache() -> None:
            empty_cache()
            if not hooked:
                hooked.append(True)
                with torch.cuda.graph(torch.cuda.CUDAGraph()):  # @hook-captures
                    pass

        torch.cuda.empty_cache = capturing_empty_cache
        try:
            with cgguard.capture_disabled(), torch.cuda.graph(torch.cuda.CUDAGraph()):  # @prepared
                pass
        finally:
            torch.cuda.empty_cache = empty_cache
    # Each capture checked once, as the torch.cuda.graph it is: none again at capture_begin.
    assert [(e["rule"], e["api"], e["stack"][-1]["line"]) for e in events] == [
        ("capture_disabled", "torch.cuda.graph", line_of("@prepared")),
        ("capture_disabled", "torch.cuda.graph", line_of("@hook-captures")),
    ]
    assert cgguard.status().captures == ()
    assert tracker().entering.capture is None  # nothing half-begun left behind


@pytest.mark.simulated
def test_capture_begun_while_another_is_being_reported_is_concurrent(
    events: list[dict[str, Any]],
) -> None:
    """A capture another thread begins while cgguard still reports this one's violation (a slow
    log sink, say) is checked at capture_begin all the same."""
    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        install("log")
        c_graph, c_stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        b_graph, b_stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        b_began, c_began, release = threading.Event(), threading.Event(), threading.Event()
        started: list[threading.Thread] = []
        ids: dict[str, int] = {}

        def thread_c() -> None:  # already capturing, thread-local, when A enters
            ids["c"] = threading.get_ident()
            with torch.cuda.stream(c_stream):
                c_graph.capture_begin(capture_error_mode="thread_local")
            c_began.set()
            # Alive to the end: a thread id is reused as soon as its thread exits. It ends its
            # own capture: CUDA ends a non-relaxed capture only on the thread that began it.
            assert release.wait(timeout=20)
            with torch.cuda.stream(c_stream):
                c_graph.capture_end()

        def thread_b() -> None:  # begins while A's violation is still being reported
            ids["b"] = threading.get_ident()
            with torch.cuda.stream(b_stream):
                b_graph.capture_begin(capture_error_mode="thread_local")
            b_began.set()
            assert release.wait(timeout=20)  # alive until it ends its capture, as C
            with torch.cuda.stream(b_stream):
                b_graph.capture_end()

        def slow_report(event: object) -> None:
            if not started:
                started.append(run_in_thread(thread_b))
                assert b_began.wait(timeout=20)

        c = run_in_thread(thread_c)
        assert c_began.wait(timeout=20)
        _process.PROCESS.listeners.append(slow_report)
        with torch.cuda.graph(torch.cuda.CUDAGraph()):  # global: concurrent with C, then B
            pass
        release.set()
        join_all(c, *started)
    assert [(e["rule"], e["api"], e["other_thread_id"]) for e in events] == [
        ("concurrent_capture", "torch.cuda.graph", ids["c"]),
        ("concurrent_capture", "torch.cuda.graph", ids["b"]),
    ]


@pytest.mark.simulated
def test_capture_end_failing_before_torch_runs_keeps_the_capture(
    events: list[dict[str, Any]],
) -> None:
    """A capture_end that fails before it reaches CUDA (a bad call) leaves the capture active."""
    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        install("log")
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream):
            graph.capture_begin()  # @kept-outer
            with pytest.raises(TypeError):
                graph.capture_end(True)  # type: ignore[call-arg]
            assert torch.cuda.is_current_stream_capturing() is True
            with torch.cuda.stream(torch.cuda.Stream()):
                inner = torch.cuda.CUDAGraph()
                inner.capture_begin()  # logged as nested
                inner.capture_end()
            graph.capture_end()
    test = "test_capture_end_failing_before_torch_runs_keeps_the_capture"
    assert [(e["rule"], e["outer_stack"][-1]) for e in events] == [
        ("nested_capture", frame("@kept-outer", test))
    ]
    assert cgguard.status().captures == ()


@pytest.mark.simulated
def test_a_hook_held_after_uninstall_lets_everything_through(
    events: list[dict[str, Any]],
) -> None:
    """A patched entry point a caller still holds checks nothing once cgguard is uninstalled."""
    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        install()
        # Cached by a library, say: torch's hooked method, or on a CUDA build the stand-in's own.
        begin = torch.cuda.CUDAGraph.capture_begin
        cgguard.uninstall()
        graph = torch.cuda.CUDAGraph()
        with cgguard.capture_disabled(), torch.cuda.stream(torch.cuda.Stream()):
            begin(graph)
            graph.capture_end()
    assert events == []


@pytest.mark.simulated
@pytest.mark.parametrize("start", ["threading", "_thread"])
def test_a_capture_left_by_a_thread_that_ended_is_abandoned_not_nested(
    start: str, events: list[dict[str, Any]]
) -> None:
    """A thread that ends inside its capture (started by threading, or by _thread as C code
    starts threads): the capture is reported once as abandoned and dropped. No later capture is
    nested in it or concurrent with it, not even one on a thread that reuses its id."""
    import _thread

    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        install()
        idents: list[int] = []
        ended = threading.Event()

        def leaves_a_capture() -> None:
            idents.append(threading.get_ident())
            # Thread-local: CUDA holds it against its own thread only, not this one.
            with torch.cuda.stream(torch.cuda.Stream()):
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin(capture_error_mode="thread_local")  # @abandoned
            ended.set()

        if start == "threading":
            gone = threading.Thread(target=leaves_a_capture, name="leaver")
            gone.start()
            gone.join()
        else:
            _thread.start_new_thread(leaves_a_capture, ())
            assert ended.wait(timeout=20)
            # A raw thread cannot be joined: wait for its end, which its capture's mark shows.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and any(
                record[1]() is not None for record in list(tracker().active.values())
            ):
                time.sleep(0.01)
        with torch.cuda.graph(torch.cuda.CUDAGraph()):  # global: concurrent, if it counted
            pass
        reused: list[object] = []

        def begins_on_a_new_thread() -> None:  # often the ended thread's id again
            idents.append(threading.get_ident())
            reused.append(tracker().check(_record.API_CAPTURE_BEGIN, 1, "global", (), None))

        join_all(run_in_thread(begins_on_a_new_thread))
    abandoned = frame("@abandoned", "leaves_a_capture")
    name = "leaver" if start == "threading" else events[0]["thread"]
    assert [(e["rule"], e["thread"], e["thread_id"], e["stack"][-1]) for e in events] == [
        ("abandoned_capture", name, idents[0], abandoned)
    ]
    assert events[0]["message"] == (
        f"Abandoned CUDA graph capture: CUDAGraph.capture_begin at {__file__}:"
        f"{abandoned['line']} (in leaves_a_capture) began a capture on thread {name!r} "
        f"({idents[0]}), which ended while the capture was active. cgguard no longer counts "
        "it; CUDA may still be capturing on its stream."
    )
    assert (len(reused), cgguard.status().captures) == (1, ())
