"""The rules as plain Python: which attempts break which rule, and what a violation produces."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import cgguard
from cgguard import _guard, _state, _warn
from cgguard._guard import CAPTURE_DISABLED, NESTED_CAPTURE, CaptureRecord, find_violations
from cgguard.testing import capture_violations

if TYPE_CHECKING:
    from collections.abc import Iterator

SOURCE = Path(__file__).read_text().splitlines()
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def plugin_captures() -> None:  # @plugin
    """Stands in for the user's code that attempts a capture."""


def runner_disables() -> None:  # @runner
    """Stands in for the user's code that disabled capture."""


def outer_begins() -> None:  # @outer
    """Stands in for the user's code that began the outer capture."""


def stack_of(function: object) -> tuple[object, ...]:
    """A snapshot holding just ``function``'s first line (lasti -1 means "not started")."""
    return (function.__code__, -1)  # type: ignore[attr-defined]


def frame(marker: str, function: str) -> dict[str, object]:
    (line,) = [n for n, text in enumerate(SOURCE, 1) if text.endswith(f"# {marker}")]
    return {"file": __file__, "line": line, "function": function, "code": SOURCE[line - 1].strip()}


@pytest.fixture
def events() -> Iterator[list[dict[str, object]]]:
    with capture_violations() as seen:
        yield seen


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_warn, "_said", set())


def record(thread_id: int, key: int = 1) -> CaptureRecord:
    return CaptureRecord(key, thread_id, _guard.API_GRAPH, "global", stack_of(outer_begins))


def test_nothing_broken_when_enabled_and_idle() -> None:
    """Capture enabled and nothing active: no rule is broken."""
    assert find_violations(True, 7, []) == []


def test_disabled_breaks_capture_disabled() -> None:
    """Capture disabled: the capture_disabled rule, with no record behind it."""
    assert find_violations(False, 7, []) == [(CAPTURE_DISABLED, None)]


def test_active_capture_on_same_thread_is_nested() -> None:
    """A capture active on the same thread: nested_capture, naming that capture."""
    mine = record(7)
    assert find_violations(True, 7, [record(8, 2), mine]) == [(NESTED_CAPTURE, mine)]


def test_active_capture_on_other_thread_is_legal() -> None:
    """A capture active only on other threads breaks no rule of these two."""
    assert find_violations(True, 7, [record(8), record(9, 2)]) == []


def test_both_rules_reported_in_order() -> None:
    """Disabled and nested at once: both, the process-wide rule first."""
    mine = record(7)
    assert find_violations(False, 7, [mine]) == [(CAPTURE_DISABLED, None), (NESTED_CAPTURE, mine)]


def test_check_begin_returns_the_record_to_activate() -> None:
    """A legal attempt comes back as a record for this thread, marked opening on request."""
    cgguard.install()
    stack = stack_of(plugin_captures)
    got = _guard.check_begin(_guard.API_CAPTURE_BEGIN, 42, "relaxed", stack, opening=True)
    assert (got.key, got.thread_id, got.api, got.mode, got.stack, got.opening) == (
        42,
        threading.get_ident(),
        "CUDAGraph.capture_begin",
        "relaxed",
        stack,
        True,
    )
    assert _state.active == {}


def test_disabled_event_is_the_documented_schema(events: list[dict[str, object]]) -> None:
    """A refused attempt while disabled produces exactly the README's event, and raises it."""
    cgguard.install()
    _state.set_flag(False, stack_of(runner_disables))
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        _guard.check_begin(_guard.API_GRAPH, 1, "global", stack_of(plugin_captures))
    (event,) = events
    assert TIMESTAMP.fullmatch(str(event["timestamp"]))
    where_plugin = f"{__file__}:{frame('@plugin', 'plugin_captures')['line']} (in plugin_captures)"
    where_runner = f"{__file__}:{frame('@runner', 'runner_disables')['line']} (in runner_disables)"
    message = (
        "CUDA graph capturing detected at an inappropriate time. This operation is currently "
        f"disabled. torch.cuda.graph at {where_plugin} began a capture; capture was disabled at "
        f"{where_runner}."
    )
    assert event == {
        "event": "cgguard.capture_violation",
        "level": "error",
        "rule": "capture_disabled",
        "action": "raised",
        "api": "torch.cuda.graph",
        "message": message,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "timestamp": event["timestamp"],
        "stack": [frame("@plugin", "plugin_captures")],
        "disabled_stack": [frame("@runner", "runner_disables")],
    }
    assert str(raised.value) == message
    assert raised.value.event is event
    assert raised.value.rule == "capture_disabled"


def test_disabled_by_configuration_has_null_stack(events: list[dict[str, object]]) -> None:
    """Capture disabled by the configuration at start: disabled_stack is null and says so."""
    cgguard.install(cgguard.Config(mode="log", capture="disabled"))
    _guard.check_begin(_guard.API_GRAPH, 1, "global", stack_of(plugin_captures))
    (event,) = events
    assert (event["action"], event["level"], event["disabled_stack"]) == ("logged", "warning", None)
    assert str(event["message"]).endswith(
        "capture was disabled by cgguard's configuration at start."
    )


def test_nested_event_is_the_documented_schema(events: list[dict[str, object]]) -> None:
    """A nested attempt produces exactly the README's event with the outer capture's stack."""
    cgguard.install(cgguard.Config(mode="log"))
    outer = CaptureRecord(
        5, threading.get_ident(), _guard.API_CAPTURE_BEGIN, "global", stack_of(outer_begins)
    )
    _state.active[outer.key] = outer
    got = _guard.check_begin(_guard.API_GRAPH, 6, "global", stack_of(plugin_captures))
    assert got.key == 6
    (event,) = events
    where_plugin = f"{__file__}:{frame('@plugin', 'plugin_captures')['line']} (in plugin_captures)"
    where_outer = f"{__file__}:{frame('@outer', 'outer_begins')['line']} (in outer_begins)"
    assert event == {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": "nested_capture",
        "action": "logged",
        "api": "torch.cuda.graph",
        "message": (
            f"Nested CUDA graph capture is not supported: torch.cuda.graph at {where_plugin} "
            f"began a capture while this thread's capture begun at {where_outer} via "
            "CUDAGraph.capture_begin is still active."
        ),
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "timestamp": event["timestamp"],
        "stack": [frame("@plugin", "plugin_captures")],
        "outer_stack": [frame("@outer", "outer_begins")],
    }


def test_raise_mode_raises_the_first_and_reports_all(events: list[dict[str, object]]) -> None:
    """Both rules broken in raise mode: both reported, the first one raised."""
    cgguard.install()
    mine = record(threading.get_ident())
    _state.active[mine.key] = mine
    _state.set_flag(False, None)
    with pytest.raises(cgguard.CaptureDisabledError):
        _guard.check_begin(_guard.API_GRAPH, 2, "global", stack_of(plugin_captures))
    assert [(e["rule"], e["action"]) for e in events] == [
        ("capture_disabled", "raised"),
        ("nested_capture", "raised"),
    ]


def test_violations_are_runtime_errors() -> None:
    """Existing ``except RuntimeError`` handlers keep catching cgguard's refusals."""
    assert issubclass(cgguard.CaptureDisabledError, cgguard.CaptureViolation)
    assert issubclass(cgguard.NestedCaptureError, cgguard.CaptureViolation)
    assert issubclass(cgguard.CaptureViolation, RuntimeError)
    assert issubclass(cgguard.CaptureViolation, cgguard.CgguardError)


def test_internal_error_lets_the_capture_through(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug inside the guard is one stderr line and an unchecked capture, never a crash."""
    cgguard.install()
    _state.set_flag(False, None)

    def broken(*args: object) -> None:
        raise LookupError("guard bug")

    monkeypatch.setattr(_guard, "find_violations", broken)
    for key in (1, 2):
        assert _guard.check_begin(_guard.API_GRAPH, key, "global", ()).key == key
    assert capsys.readouterr().err == (
        "cgguard: internal error while checking a capture, not checked: LookupError('guard bug')\n"
    )


def test_failing_listener_does_not_stop_the_report(
    capsys: pytest.CaptureFixture[str], events: list[dict[str, object]]
) -> None:
    """A listener that raises is reported once; other listeners and the raise still happen."""
    cgguard.install(cgguard.Config(log_file=os.devnull))

    def bad(event: dict[str, object]) -> None:
        raise ValueError("listener bug")

    _state.listeners.insert(0, bad)
    _state.set_flag(False, None)
    with pytest.raises(cgguard.CaptureDisabledError):
        _guard.check_begin(_guard.API_GRAPH, 1, "global", ())
    assert len(events) == 1
    assert capsys.readouterr().err == (
        "cgguard: a violation listener failed: ValueError('listener bug')\n"
    )
