"""End to end: per-rule actions, concurrent_capture and sync_during_capture on a capture runtime.

Each scenario runs on cgguard's simulated CUDA runtime, and again on a real GPU where one exists.
Tensors, streams, events and graphs are all made before any capture begins, as on a GPU, where
allocating during another thread's global-mode capture is itself an unsafe call.
"""

from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING, Any

import pytest
import torch
from helpers import SourceFile
from torch.cuda import synchronize as synchronize_taken_early  # bound before any install()

import cgguard

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.conftest import Runtime

THIS_FILE = SourceFile(__file__)
line_of, frame = THIS_FILE.line_of, THIS_FILE.frame
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
SOURCES = ["config", "environ"]
ERRORS: dict[str, type[cgguard.CaptureViolation]] = {
    "capture_disabled": cgguard.CaptureDisabledError,
    "nested_capture": cgguard.NestedCaptureError,
    "concurrent_capture": cgguard.ConcurrentCaptureError,
    "sync_during_capture": cgguard.SyncDuringCaptureError,
}
PROHIBITED = "operation not permitted"
INVALIDATED = "previous error during capture"


def where(marker: str, function: str) -> str:
    """A frame as event messages name it: ``file:line (in function)``."""
    return f"{__file__}:{line_of(marker)} (in {function})"


def from_this_file(frames: object) -> list[object]:
    """The frames of a rendered stack that are in this file (pytest's and threading's dropped)."""
    assert isinstance(frames, list)
    return [f for f in frames if f["file"] == __file__]


def summary(events: list[dict[str, Any]]) -> list[tuple[object, object]]:
    """Each event as (rule, action)."""
    return [(e["rule"], e["action"]) for e in events]


def totals() -> dict[str, int]:
    """Violations counted per rule by the installed ledger."""
    return cgguard.status().violations


@pytest.fixture(autouse=True)
def _no_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RANK, LOCAL_RANK or WORLD_SIZE from the caller's environment: events have no ranks."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def install(source: str, mode: str, rules: dict[str, str | None]) -> None:
    """Install cgguard in ``mode`` with per-rule actions set in code or as CGGUARD_* variables.

    A rule whose action is None is left unset. Events go to os.devnull; tests read them with
    capture_violations().
    """
    chosen = {rule: action for rule, action in rules.items() if action is not None}
    if source == "config":
        config = cgguard.Config(mode=mode, rules=chosen, log_file=os.devnull)  # type: ignore[arg-type]
    else:
        environ = {"CGGUARD_MODE": mode, "CGGUARD_LOG_FILE": os.devnull}
        environ.update({f"CGGUARD_RULE_{rule.upper()}": action for rule, action in chosen.items()})
        config = cgguard.Config.from_environ(environ)
    cgguard.install(config)


def against(action: str | None) -> str:
    """The global mode that the rule's own action must override: log for raise, else raise."""
    return "log" if action == "raise" else "raise"


def run_threads(
    barrier: threading.Barrier, targets: dict[str, Callable[[], None]]
) -> dict[str, int]:
    """Run each target on a thread of that name; return their idents; re-raise the first failure.

    A failing thread breaks the barrier, so that the others stop waiting for it.
    """
    errors: list[BaseException] = []

    def run(target: Callable[[], None]) -> None:
        try:
            target()  # @run-target
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = {
        name: threading.Thread(target=run, args=(target,), name=name)
        for name, target in targets.items()
    }
    for thread in threads.values():
        thread.start()
    for thread in threads.values():
        thread.join(timeout=60)
        assert not thread.is_alive(), "a scenario thread hung"
    if errors:
        raise errors[0]
    return {name: thread.ident for name, thread in threads.items() if thread.ident is not None}


# --- per-rule actions: capture_disabled and nested_capture -----------------------------------


def capture_graph(graph: Any, x: Any) -> None:
    """Capture ``x += 1`` into ``graph`` with torch.cuda.graph."""
    with torch.cuda.graph(graph):  # @graph
        x.add_(1)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("action", ["off", "log", "raise"])
def test_capture_disabled_takes_its_own_action(
    runtime: Runtime, events: list[dict[str, Any]], source: str, action: str
) -> None:
    """capture_disabled set (code or env) against the mode: off silent, log logs, raise raises."""
    install(source, against(action), {"capture_disabled": action})
    graph, x = torch.cuda.CUDAGraph(), runtime.tensor()
    with cgguard.capture_disabled():
        if action == "raise":
            with pytest.raises(cgguard.CaptureDisabledError):
                capture_graph(graph, x)
        else:
            capture_graph(graph, x)
    if action != "raise":
        graph.replay()  # the capture went on
    at = frame("@graph", "capture_graph")
    expected = {
        "off": ([], {}, ()),
        "log": ([("capture_disabled", "logged", at)], {"capture_disabled": 1}, ()),
        "raise": ([("capture_disabled", "raised", at)], {"capture_disabled": 1}, ()),
    }[action]
    got = [(e["rule"], e["action"], e["stack"][-1]) for e in events]
    assert expected == (got, totals(), cgguard.status().captures)
    assert torch.cuda.is_current_stream_capturing() is False


def capture_inner(graph: Any, stream: Any, x: Any) -> None:
    """Capture ``x += 1`` into ``graph`` with a raw relaxed capture on ``stream``."""
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="relaxed")  # @inner-begin
        x.add_(1)
        graph.capture_end()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("action", ["off", "log", "raise"])
def test_nested_capture_takes_its_own_action(
    runtime: Runtime, events: list[dict[str, Any]], source: str, action: str
) -> None:
    """nested_capture set against the mode: off begins it unreported, log reports, raise refuses."""
    install(source, against(action), {"nested_capture": action})
    outer, inner = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    outer_stream, inner_stream, x = torch.cuda.Stream(), torch.cuda.Stream(), runtime.tensor()
    # Relaxed captures: CUDA allows a second capture on this thread, on another stream.
    with torch.cuda.stream(outer_stream):
        outer.capture_begin(capture_error_mode="relaxed")  # @outer-begin
        x.add_(1)
        if action == "raise":
            with pytest.raises(cgguard.NestedCaptureError):
                capture_inner(inner, inner_stream, x)
            assert torch.cuda.current_stream() == outer_stream
        else:
            capture_inner(inner, inner_stream, x)
        outer.capture_end()
    outer.replay()
    if action != "raise":
        inner.replay()
    test = "test_nested_capture_takes_its_own_action"
    reported = [
        ("nested_capture", "logged" if action == "log" else "raised", frame("@outer-begin", test))
    ]
    got = [(e["rule"], e["action"], e["outer_stack"][-1]) for e in events]
    assert got == ([] if action == "off" else reported)
    assert totals() == ({} if action == "off" else {"nested_capture": 1})
    if runtime.simulation:
        begun = [c for c in runtime.simulation.calls if c.name == "capture_begin"]
        assert len(begun) == (1 if action == "raise" else 2)
    assert cgguard.status().captures == ()


# --- concurrent_capture --------------------------------------------------------------------


def capture_on_two_threads(
    runtime: Runtime, mode_a: str, mode_b: str
) -> tuple[dict[str, int], list[cgguard.ConcurrentCaptureError]]:
    """Thread cgg-a begins a raw capture in mode_a; then cgg-b begins one in mode_b.

    Each thread captures on its own stream. The global-mode capture, if any, ends first: the
    other's capture_end then runs with no global capture in the process. Returns the threads'
    idents and the ConcurrentCaptureError that refused cgg-b's capture, if one did.
    """
    barrier = threading.Barrier(2, timeout=20)
    graph_a, graph_b = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    stream_a, stream_b = torch.cuda.Stream(), torch.cuda.Stream()
    x, y = runtime.tensor(), runtime.tensor()
    a_ends_first = mode_a == "global" or mode_b != "global"
    refused: list[cgguard.ConcurrentCaptureError] = []

    def thread_a() -> None:
        with torch.cuda.stream(stream_a):
            graph_a.capture_begin(capture_error_mode=mode_a)  # @a-begins
            x.add_(1)
            barrier.wait()  # 1: a is capturing
            barrier.wait()  # 2: b has begun, or was refused
            if a_ends_first:
                graph_a.capture_end()
            barrier.wait()  # 3: the first capture has ended
            if not a_ends_first:
                graph_a.capture_end()

    def thread_b() -> None:
        barrier.wait()  # 1
        with torch.cuda.stream(stream_b):
            try:
                graph_b.capture_begin(capture_error_mode=mode_b)  # @b-begins
            except cgguard.ConcurrentCaptureError as exc:
                refused.append(exc)
            else:
                y.add_(1)
            barrier.wait()  # 2
            if not a_ends_first and not refused:
                graph_b.capture_end()
            barrier.wait()  # 3
            if a_ends_first and not refused:
                graph_b.capture_end()

    idents = run_threads(barrier, {"cgg-a": thread_a, "cgg-b": thread_b})
    graph_a.replay()
    if not refused:
        graph_b.replay()
    return idents, refused


def test_concurrent_capture_is_reported_with_both_stacks(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """B begins a capture while A captures in global mode: logged (by default), both stacks."""
    cgguard.install(cgguard.Config(log_file=os.devnull))
    idents, refused = capture_on_two_threads(runtime, "global", "thread_local")
    assert refused == []
    (event,) = events
    assert TIMESTAMP.fullmatch(str(event["timestamp"]))
    a, b = idents["cgg-a"], idents["cgg-b"]
    run = frame("@run-target", "run")
    expected = {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": "concurrent_capture",
        "action": "logged",
        "api": "CUDAGraph.capture_begin",
        "message": (
            f"Concurrent CUDA graph capture: CUDAGraph.capture_begin at "
            f"{where('@b-begins', 'thread_b')} began a capture while thread {a} has a capture "
            f"begun at {where('@a-begins', 'thread_a')} via CUDAGraph.capture_begin, and one of "
            "them uses capture_error_mode 'global', in which one thread's unsafe call "
            "invalidates the other's capture."
        ),
        "count": 1,
        "thread": "cgg-b",
        "thread_id": b,
        "pid": os.getpid(),
        "timestamp": event["timestamp"],
        "stack": [run, frame("@b-begins", "thread_b")],
        "other_stack": [run, frame("@a-begins", "thread_a")],
        "other_thread_id": a,
    }
    shown = {
        **event,
        "stack": from_this_file(event["stack"]),
        "other_stack": from_this_file(event["other_stack"]),
    }
    assert expected == shown
    assert (cgguard.status().captures, totals()) == ((), {"concurrent_capture": 1})


@pytest.mark.parametrize(
    ("mode_a", "mode_b", "reported"),
    [
        ("global", "thread_local", True),
        ("global", "relaxed", True),
        ("thread_local", "global", True),
        ("relaxed", "global", True),
        ("thread_local", "thread_local", False),
        ("thread_local", "relaxed", False),
        ("relaxed", "relaxed", False),
    ],
)
def test_concurrent_capture_needs_a_global_mode(
    runtime: Runtime, events: list[dict[str, Any]], mode_a: str, mode_b: str, reported: bool
) -> None:
    """Two threads capturing at once are a violation only if either capture is in global mode."""
    cgguard.install(cgguard.Config(log_file=os.devnull))
    idents, refused = capture_on_two_threads(runtime, mode_a, mode_b)
    got = [(e["rule"], e["thread_id"], e.get("other_thread_id")) for e in events]
    expected = [("concurrent_capture", idents["cgg-b"], idents["cgg-a"])] if reported else []
    assert (expected, []) == (got, refused)
    assert cgguard.status().captures == ()


def test_concurrent_capture_names_a_torch_cuda_graph_as_the_other(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """The other capture made by torch.cuda.graph (global): the event names its with-line."""
    cgguard.install(cgguard.Config(log_file=os.devnull))
    barrier = threading.Barrier(2, timeout=20)
    graph_a, graph_b = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    stream_a, stream_b = torch.cuda.Stream(), torch.cuda.Stream()
    x, y = runtime.tensor(), runtime.tensor()

    def thread_a() -> None:
        with torch.cuda.graph(graph_a, stream=stream_a):  # @a-graph
            x.add_(1)
            barrier.wait()  # 1: a is capturing
            barrier.wait()  # 2: b has begun
        barrier.wait()  # 3: a's global capture has ended

    def thread_b() -> None:
        barrier.wait()  # 1
        # Raw and relaxed: torch.cuda.graph would synchronize, illegal during a global capture.
        with torch.cuda.stream(stream_b):
            graph_b.capture_begin(capture_error_mode="relaxed")  # @b-relaxed
            y.add_(1)
            barrier.wait()  # 2
            barrier.wait()  # 3
            graph_b.capture_end()

    idents = run_threads(barrier, {"cgg-a": thread_a, "cgg-b": thread_b})
    graph_a.replay()
    graph_b.replay()
    got = [
        (e["rule"], e["action"], e["other_thread_id"], e["stack"][-1], e["other_stack"][-1])
        for e in events
    ]
    expected = [
        (
            "concurrent_capture",
            "logged",
            idents["cgg-a"],
            frame("@b-relaxed", "thread_b"),
            frame("@a-graph", "thread_a"),
        )
    ]
    assert expected == got
    assert "via torch.cuda.graph, and one of them" in str(events[0]["message"])


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("action", ["off", "log", "raise", None])
def test_concurrent_capture_takes_its_own_action(
    runtime: Runtime, events: list[dict[str, Any]], source: str, action: str | None
) -> None:
    """concurrent_capture: logs unless set; off is silent; raise refuses the second capture."""
    install(source, against(action), {"concurrent_capture": action})
    idents, refused = capture_on_two_threads(runtime, "global", "thread_local")
    got = [(e["rule"], e["action"], e["thread_id"]) for e in events]
    b = idents["cgg-b"]
    expected = {
        "off": ([], [], {}),
        "log": ([("concurrent_capture", "logged", b)], [], {"concurrent_capture": 1}),
        None: ([("concurrent_capture", "logged", b)], [], {"concurrent_capture": 1}),
        "raise": (
            [("concurrent_capture", "raised", b)],
            [cgguard.ConcurrentCaptureError],
            {"concurrent_capture": 1},
        ),
    }[action]
    assert expected == (got, [type(e) for e in refused], totals())
    if refused:
        assert refused[0].event is events[0]
    if runtime.simulation:
        begun = [c.thread for c in runtime.simulation.calls if c.name == "capture_begin"]
        assert begun == (["cgg-a"] if action == "raise" else ["cgg-a", "cgg-b"])
    assert cgguard.status().captures == ()


# --- sync_during_capture -------------------------------------------------------------------


def sync_device(stream: Any, event: Any) -> None:
    """torch.cuda.synchronize(), looked up on torch.cuda at the call."""
    torch.cuda.synchronize()  # @sync-device


def sync_early(stream: Any, event: Any) -> None:
    """torch.cuda.synchronize, bound by ``from torch.cuda import synchronize`` at import."""
    synchronize_taken_early()  # @sync-early


def sync_stream(stream: Any, event: Any) -> None:
    """Stream.synchronize() on the stream being captured."""
    stream.synchronize()  # @sync-stream


def sync_event(stream: Any, event: Any) -> None:
    """Event.synchronize() on an event recorded in the capture."""
    event.record()
    event.synchronize()  # @sync-event


SYNCS = [
    pytest.param(
        sync_device, "torch.cuda.synchronize", "@sync-device", id="torch.cuda.synchronize"
    ),
    pytest.param(sync_early, "torch.cuda.synchronize", "@sync-early", id="bound-before-install"),
    pytest.param(sync_stream, "Stream.synchronize", "@sync-stream", id="Stream.synchronize"),
    pytest.param(sync_event, "Event.synchronize", "@sync-event", id="Event.synchronize"),
]


def synchronize_calls(runtime: Runtime, since: int) -> list[str]:
    """The names of the simulated runtime's synchronize calls after the first ``since`` calls."""
    assert runtime.simulation is not None
    return [c.name for c in runtime.simulation.calls[since:] if "synchronize" in c.name]


@pytest.mark.parametrize(("sync", "api", "marker"), SYNCS)
def test_sync_during_capture_is_logged_then_cuda_fails_it(
    runtime: Runtime,
    events: list[dict[str, Any]],
    sync: Callable[[Any, Any], None],
    api: str,
    marker: str,
) -> None:
    """A synchronize on a capturing thread is logged with the capture's stack, then CUDA fails."""
    cgguard.install(cgguard.Config(log_file=os.devnull))  # mode raise: the diagnostic still logs
    graph, x = torch.cuda.CUDAGraph(), runtime.tensor()
    stream, cuda_event = torch.cuda.Stream(), torch.cuda.Event()
    with torch.cuda.stream(stream):
        graph.capture_begin()  # @sync-capture
        x.add_(1)
        with pytest.raises(RuntimeError, match=PROHIBITED) as raised:
            sync(stream, cuda_event)  # @sync-call
        # Log mode reports; CUDA then fails the call and the capture, as without cgguard.
        assert not isinstance(raised.value, cgguard.CaptureViolation)
        with pytest.raises(RuntimeError, match=INVALIDATED):
            graph.capture_end()
    (event,) = events
    assert TIMESTAMP.fullmatch(str(event["timestamp"]))
    test = "test_sync_during_capture_is_logged_then_cuda_fails_it"
    expected = {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": "sync_during_capture",
        "action": "logged",
        "api": api,
        "message": (
            f"Synchronize during CUDA graph capture: {api} at {where(marker, sync.__name__)} "
            f"synchronizes while this thread's capture begun at {where('@sync-capture', test)} "
            "via CUDAGraph.capture_begin is active; CUDA fails it ('operation not permitted when "
            "stream is capturing') and invalidates the capture."
        ),
        "count": 1,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "timestamp": event["timestamp"],
        "stack": [frame("@sync-call", test), frame(marker, sync.__name__)],
        "capture_stack": [frame("@sync-capture", test)],
        "capture_thread_id": threading.get_ident(),
    }
    shown = {
        **event,
        "stack": from_this_file(event["stack"]),
        "capture_stack": from_this_file(event["capture_stack"]),
    }
    assert expected == shown
    assert (cgguard.status().captures, totals()) == ((), {"sync_during_capture": 1})


@pytest.mark.parametrize(("sync", "api", "marker"), SYNCS)
def test_sync_during_capture_refused_before_cuda_in_raise_mode(
    runtime: Runtime,
    events: list[dict[str, Any]],
    sync: Callable[[Any, Any], None],
    api: str,
    marker: str,
) -> None:
    """sync_during_capture set to raise: refused before CUDA is called; the capture stays valid."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    graph, x = torch.cuda.CUDAGraph(), runtime.tensor()
    stream, cuda_event = torch.cuda.Stream(), torch.cuda.Event()
    with torch.cuda.stream(stream):
        graph.capture_begin()  # @raise-capture
        x.add_(1)
        since = len(runtime.simulation.calls) if runtime.simulation else 0
        with pytest.raises(cgguard.SyncDuringCaptureError) as raised:
            sync(stream, cuda_event)
        if runtime.simulation:
            assert synchronize_calls(runtime, since) == []
        assert torch.cuda.is_current_stream_capturing() is True
        graph.capture_end()  # the capture was not invalidated
    graph.replay()
    test = "test_sync_during_capture_refused_before_cuda_in_raise_mode"
    got = [
        (e["rule"], e["action"], e["api"], e["stack"][-1], e["capture_stack"][-1]) for e in events
    ]
    expected = [
        (
            "sync_during_capture",
            "raised",
            api,
            frame(marker, sync.__name__),
            frame("@raise-capture", test),
        )
    ]
    assert expected == got
    assert raised.value.event is events[0]
    assert (cgguard.status().captures, totals()) == ((), {"sync_during_capture": 1})


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("action", ["off", "log", "raise", None])
def test_sync_during_capture_takes_its_own_action(
    runtime: Runtime, events: list[dict[str, Any]], source: str, action: str | None
) -> None:
    """sync_during_capture: logs unless set; off is silent; raise refuses; CUDA fails the rest."""
    install(source, against(action), {"sync_during_capture": action})
    graph, x, stream = torch.cuda.CUDAGraph(), runtime.tensor(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        x.add_(1)
        if action == "raise":
            with pytest.raises(cgguard.SyncDuringCaptureError):
                torch.cuda.synchronize()
            graph.capture_end()
        else:
            with pytest.raises(RuntimeError, match=PROHIBITED) as raised:
                torch.cuda.synchronize()
            assert not isinstance(raised.value, cgguard.CaptureViolation)
            with pytest.raises(RuntimeError, match=INVALIDATED):
                graph.capture_end()
    if action == "raise":
        graph.replay()
    expected = {
        "off": ([], {}),
        "log": ([("sync_during_capture", "logged")], {"sync_during_capture": 1}),
        None: ([("sync_during_capture", "logged")], {"sync_during_capture": 1}),
        "raise": ([("sync_during_capture", "raised")], {"sync_during_capture": 1}),
    }[action]
    assert expected == (summary(events), totals())
    assert cgguard.status().captures == ()


def test_graphs_own_synchronize_is_not_a_violation(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """torch.cuda.graph synchronizes before its capture_begin: no violation, even set to raise."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    graph, x = torch.cuda.CUDAGraph(), runtime.tensor()
    with torch.cuda.graph(graph):
        x.add_(1)
    graph.replay()
    if runtime.simulation:
        assert synchronize_calls(runtime, 0) == ["synchronize"]  # torch's own, which went through
    assert (events, cgguard.status().captures, totals()) == ([], (), {})


def test_sync_off_the_capturing_thread_is_not_a_violation(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A synchronize on a thread not capturing, while another captures thread_local: CUDA
    documents no prohibition, so cgguard reports nothing. Whether CUDA lets a device-wide
    synchronize through then is not settled (docs/cuda-behaviour.md): the test holds either way.
    """
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}, log_file=os.devnull))
    barrier = threading.Barrier(2, timeout=20)
    graph, stream, x = torch.cuda.CUDAGraph(), torch.cuda.Stream(), runtime.tensor()
    cuda_said: list[BaseException] = []

    def capturer() -> None:
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            x.add_(1)
            barrier.wait()  # 1: capturing
            barrier.wait()  # 2: the other thread has synchronized
            try:
                graph.capture_end()
            except RuntimeError as exc:
                cuda_said.append(exc)

    def synchronizer() -> None:
        barrier.wait()  # 1
        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:
            cuda_said.append(exc)
        barrier.wait()  # 2

    run_threads(barrier, {"cgg-capturer": capturer, "cgg-synchronizer": synchronizer})
    assert not any(isinstance(e, cgguard.CaptureViolation) for e in cuda_said)
    if runtime.simulation:
        assert cuda_said == []  # the simulation's pick: it goes through
        graph.replay()
    assert (events, cgguard.status().captures, totals()) == ([], (), {})


def test_nested_graph_refused_by_its_own_synchronize_keeps_the_outer(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """nested off, sync raise: a nested graph's synchronize is refused and the outer survives."""
    rules = {"nested_capture": "off", "sync_during_capture": "raise"}
    cgguard.install(cgguard.Config(rules=rules, log_file=os.devnull))  # type: ignore[arg-type]
    outer, inner, x = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), runtime.tensor()
    with torch.cuda.graph(outer):  # @outer-graph
        x.add_(1)
        stream = torch.cuda.current_stream()
        since = len(runtime.simulation.calls) if runtime.simulation else 0
        with pytest.raises(cgguard.SyncDuringCaptureError):
            with torch.cuda.graph(inner):  # @inner-graph
                pytest.fail("the body of a refused capture ran")
        if runtime.simulation:
            assert runtime.simulation.calls[since:] == []
        assert (torch.cuda.current_stream(), torch.cuda.is_current_stream_capturing()) == (
            stream,
            True,
        )
    outer.replay()
    test = "test_nested_graph_refused_by_its_own_synchronize_keeps_the_outer"
    got = [(e["rule"], e["api"], e["stack"][-1], e["capture_stack"][-1]) for e in events]
    expected = [
        (
            "sync_during_capture",
            "torch.cuda.synchronize",
            frame("@inner-graph", test),
            frame("@outer-graph", test),
        )
    ]
    assert expected == got
    assert (cgguard.status().captures, totals()) == ((), {"sync_during_capture": 1})
