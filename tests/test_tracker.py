"""The capture path: which attempts break which rule, and what a violation produces."""

from __future__ import annotations

import os
import re
import threading
import types
from typing import TYPE_CHECKING, Any

import pytest
from helpers import DISABLED_SENTENCE, SourceFile, thread, tracker

import cgguard
from cgguard import _process
from cgguard._core import hooks
from cgguard._core import syncs as _syncs
from cgguard._core import tracker as _capture
from cgguard._core.probes import NO_TORCH
from cgguard._core.syncs import SyncChecks
from cgguard._core.tracker import Tracker
from cgguard._data.ledger import Run
from cgguard._gate.flags import CaptureFlag, FlagSource
from cgguard._install import CaptureInfo
from cgguard._reporting.reporter import Reporter
from cgguard._rules import record as _record
from cgguard._rules.record import Disabler
from cgguard._support.threads import this_thread

if TYPE_CHECKING:
    from cgguard._rules.record import Record

CAPTURE_DISABLED, NESTED_CAPTURE, CONCURRENT_CAPTURE = (
    "capture_disabled",
    "nested_capture",
    "concurrent_capture",
)

frame = SourceFile(__file__).frame
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def plugin_captures() -> None:  # @plugin
    """Stands in for the user's code that attempts a capture."""


def runner_disables() -> None:  # @runner
    """Stands in for the user's code that disabled capture."""


def outer_begins() -> None:  # @outer
    """Stands in for the user's code that began the outer capture."""


def other_begins() -> None:  # @other
    """Stands in for the user's code that began a capture on another thread."""


def check(api: str, key: int, mode: str, stack: Any) -> Record:
    """A capture attempt checked as torch's hooks check one; its record, if it may begin."""
    record: Record = tracker().check(api, key, mode, stack, None)[0]
    return record


# What capture_disabled is blamed on when cgguard's own flag was set by configuration.
DISABLED = Disabler(None, None)


def sync_entry_point() -> None:
    """Stands in for cgguard's wrapper on a synchronize entry point: it calls check_sync."""
    SyncChecks(tracker()).check(_record.API_SYNCHRONIZE)


def user_synchronizes() -> None:
    """Stands in for the user's code that synchronizes."""
    sync_entry_point()  # @user-sync


def from_this_file(frames: object) -> list[object]:
    """The frames of a rendered stack that are in this file (the rest are pytest's)."""
    assert isinstance(frames, list)
    return [f for f in frames if f["file"] == __file__]


def stack_of(function: object) -> tuple[object, ...]:
    """A snapshot holding just ``function``'s first line (lasti -1 means "not started")."""
    return (function.__code__, -1)  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _no_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RANK, LOCAL_RANK or WORLD_SIZE from the caller's environment: events have no ranks."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def record(thread_id: int, key: int = 1, mode: str = "global") -> Record:
    return (key, thread(thread_id), _record.API_GRAPH, mode, stack_of(outer_begins), None)


def test_a_capture_is_active_from_the_moment_torch_begins_it() -> None:
    """A legal capture_begin is recorded as torch begins it, for this thread, and stays so."""
    cgguard.install()
    graph, seen = object(), []

    def torch_begins(*args: object, **kwargs: object) -> None:
        seen.append(cgguard.status().captures)

    begin = hooks.capture_begin(tracker(), torch_begins)
    begin(graph, capture_error_mode="relaxed")
    began = (CaptureInfo(threading.get_ident(), "CUDAGraph.capture_begin", "relaxed"),)
    assert (seen, cgguard.status().captures) == ([began], began)


def test_disabled_event_is_the_documented_schema(events: list[dict[str, object]]) -> None:
    """A refused attempt while disabled produces exactly the documented event, and raises it."""
    cgguard.install()
    _process.PROCESS.gate.flag.set(False, stack_of(runner_disables))
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        check(_record.API_GRAPH, 1, "global", stack_of(plugin_captures))
    (event,) = events
    assert TIMESTAMP.fullmatch(str(event["timestamp"]))
    where_plugin = f"{__file__}:{frame('@plugin', 'plugin_captures')['line']} (in plugin_captures)"
    where_runner = f"{__file__}:{frame('@runner', 'runner_disables')['line']} (in runner_disables)"
    message = (
        f"{DISABLED_SENTENCE} torch.cuda.graph at {where_plugin} began a capture; capture was "
        f"disabled at {where_runner}."
    )
    expected = {
        "event": "cgguard.capture_violation",
        "level": "error",
        "rule": "capture_disabled",
        "action": "raised",
        "api": "torch.cuda.graph",
        "message": message,
        "count": 1,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "timestamp": event["timestamp"],
        "stack": [frame("@plugin", "plugin_captures")],
        "disabled_stack": [frame("@runner", "runner_disables")],
    }
    assert (expected, list(expected)) == (event, list(event))
    assert str(raised.value) == message
    assert raised.value.event is event
    assert raised.value.rule == "capture_disabled"


def test_disabled_by_configuration_has_null_stack(events: list[dict[str, object]]) -> None:
    """Capture disabled by the configuration at start: disabled_stack is null and says so."""
    cgguard.install(cgguard.Config(mode="log", capture="disabled"))
    check(_record.API_GRAPH, 1, "global", stack_of(plugin_captures))
    (event,) = events
    assert (event["action"], event["level"], event["disabled_stack"]) == ("logged", "warning", None)
    assert str(event["message"]).endswith(
        "capture was disabled by cgguard's configuration at start."
    )


def test_nested_event_is_the_documented_schema(events: list[dict[str, object]]) -> None:
    """A nested attempt produces exactly the documented event with the outer capture's stack."""
    cgguard.install(cgguard.Config(mode="log"))
    outer = (
        5,
        this_thread(),
        _record.API_CAPTURE_BEGIN,
        "global",
        stack_of(outer_begins),
        None,
    )
    tracker().active[outer[0]] = outer
    got = check(_record.API_GRAPH, 6, "global", stack_of(plugin_captures))
    assert got[0] == 6
    (event,) = events
    where_plugin = f"{__file__}:{frame('@plugin', 'plugin_captures')['line']} (in plugin_captures)"
    where_outer = f"{__file__}:{frame('@outer', 'outer_begins')['line']} (in outer_begins)"
    expected = {
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
        "count": 1,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "timestamp": event["timestamp"],
        "stack": [frame("@plugin", "plugin_captures")],
        "outer_stack": [frame("@outer", "outer_begins")],
    }
    assert (expected, list(expected)) == (event, list(event))
    assert TIMESTAMP.fullmatch(str(event["timestamp"]))


def test_concurrent_event_is_the_documented_schema(events: list[dict[str, object]]) -> None:
    """A capture begun while another thread captures globally: the event names both captures."""
    cgguard.install()
    other = (5, thread(12345), _record.API_GRAPH, "global", stack_of(other_begins), None)
    tracker().active[other[0]] = other
    got = check(_record.API_CAPTURE_BEGIN, 6, "thread_local", stack_of(plugin_captures))
    assert got[0] == 6
    (event,) = events
    where_plugin = f"{__file__}:{frame('@plugin', 'plugin_captures')['line']} (in plugin_captures)"
    where_other = f"{__file__}:{frame('@other', 'other_begins')['line']} (in other_begins)"
    expected = {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": "concurrent_capture",
        "action": "logged",
        "api": "CUDAGraph.capture_begin",
        "message": (
            f"Concurrent CUDA graph capture: CUDAGraph.capture_begin at {where_plugin} began a "
            f"capture while thread 12345 has a capture begun at {where_other} via "
            "torch.cuda.graph, and one of them uses capture_error_mode 'global', in which one "
            "thread's unsafe call invalidates the other's capture."
        ),
        "count": 1,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "timestamp": event["timestamp"],
        "stack": [frame("@plugin", "plugin_captures")],
        "other_stack": [frame("@other", "other_begins")],
        "other_thread_id": 12345,
    }
    assert (expected, list(expected)[:12]) == (event, list(event)[:12])
    assert TIMESTAMP.fullmatch(str(event["timestamp"]))


def test_sync_event_is_the_documented_schema(events: list[dict[str, object]]) -> None:
    """A synchronize on a capturing thread: the event says where that thread's capture began."""
    cgguard.install()
    mine = (
        5,
        this_thread(),
        _record.API_CAPTURE_BEGIN,
        "global",
        stack_of(outer_begins),
        None,
    )
    tracker().active[mine[0]] = mine
    user_synchronizes()  # @sync-schema
    (event,) = events
    where_user = (
        f"{__file__}:{frame('@user-sync', 'user_synchronizes')['line']} (in user_synchronizes)"
    )
    where_outer = f"{__file__}:{frame('@outer', 'outer_begins')['line']} (in outer_begins)"
    expected = {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": "sync_during_capture",
        "action": "logged",
        "api": "torch.cuda.synchronize",
        "message": (
            f"Synchronize during CUDA graph capture: torch.cuda.synchronize at {where_user} "
            f"synchronizes while this thread's capture begun at {where_outer} via "
            "CUDAGraph.capture_begin is active; CUDA fails it ('operation not permitted when "
            "stream is capturing') and invalidates the capture."
        ),
        "count": 1,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "timestamp": event["timestamp"],
        "stack": [
            frame("@sync-schema", "test_sync_event_is_the_documented_schema"),
            frame("@user-sync", "user_synchronizes"),
        ],
        "capture_stack": [frame("@outer", "outer_begins")],
        "capture_thread_id": threading.get_ident(),
    }
    # The stack starts at the caller of the entry point: the user's line is the innermost.
    shown = {**event, "stack": from_this_file(event["stack"])}
    assert (expected, list(expected)) == (shown, list(event))
    assert TIMESTAMP.fullmatch(str(event["timestamp"]))


def test_sync_on_a_thread_not_capturing_reports_nothing(events: list[dict[str, object]]) -> None:
    """A synchronize while only another thread captures: no event, nothing counted."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}))
    other = (5, thread(12345), _record.API_GRAPH, "thread_local", stack_of(other_begins), None)
    tracker().active[other[0]] = other
    user_synchronizes()
    assert (events, cgguard.status().violations) == ([], {})


def test_ranks_come_before_the_timestamp(
    monkeypatch: pytest.MonkeyPatch, events: list[dict[str, object]]
) -> None:
    """RANK, LOCAL_RANK and WORLD_SIZE set: rank, local_rank, world_size, as numbers, after pid."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    _process.PROCESS.gate.flag.set(False, stack_of(runner_disables))
    check(_record.API_GRAPH, 1, "global", stack_of(plugin_captures))
    (event,) = events
    head = ["event", "level", "rule", "action", "api", "message", "count", "thread", "thread_id"]
    expected = (
        [*head, "pid", "rank", "local_rank", "world_size", "timestamp"],
        (os.getpid(), 3, 1, 8),
    )
    keys = list(event)
    assert expected == (
        keys[: keys.index("timestamp") + 1],
        (event["pid"], event["rank"], event["local_rank"], event["world_size"]),
    )


def test_only_the_ranks_set_are_reported(
    monkeypatch: pytest.MonkeyPatch, events: list[dict[str, object]]
) -> None:
    """Only RANK set: the event has rank and neither local_rank nor world_size."""
    monkeypatch.setenv("RANK", "0")
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    _process.PROCESS.gate.flag.set(False, None)
    check(_record.API_GRAPH, 1, "global", stack_of(plugin_captures))
    (event,) = events
    keys = list(event)
    expected = (["pid", "rank", "timestamp"], 0)
    assert expected == (keys[keys.index("pid") : keys.index("timestamp") + 1], event["rank"])


def test_count_is_per_site(events: list[dict[str, object]]) -> None:
    """Each event's count is its count at its site: the rule at one place in the user's code."""
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    _process.PROCESS.gate.flag.set(False, None)
    for stack in (plugin_captures, plugin_captures, other_begins, plugin_captures):
        check(_record.API_GRAPH, 1, "global", stack_of(stack))
    mine = record(threading.get_ident())
    tracker().active[mine[0]] = mine
    for _ in range(2):
        user_synchronizes()
    got = [(e["rule"], e["stack"][-1], e["count"]) for e in events]  # type: ignore[index]
    plugin, other = frame("@plugin", "plugin_captures"), frame("@other", "other_begins")
    user = frame("@user-sync", "user_synchronizes")
    assert got == [
        ("capture_disabled", plugin, 1),
        ("capture_disabled", plugin, 2),
        ("capture_disabled", other, 1),
        ("capture_disabled", plugin, 3),
        ("sync_during_capture", user, 1),
        ("sync_during_capture", user, 2),
    ]
    assert cgguard.status().violations == {"capture_disabled": 4, "sync_during_capture": 2}


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        ("concurrent_capture", cgguard.ConcurrentCaptureError),
        ("sync_during_capture", cgguard.SyncDuringCaptureError),
    ],
)
def test_diagnostics_log_in_raise_mode_unless_set_to_raise(
    rule: str, error: type[cgguard.CaptureViolation], events: list[dict[str, object]]
) -> None:
    """concurrent_capture and sync_during_capture log under mode raise; set to raise, they raise."""
    here = threading.get_ident()
    cause = record(here if rule == "sync_during_capture" else 12345)
    cause_stack = "capture_stack" if rule == "sync_during_capture" else "other_stack"

    def attempt() -> None:
        if rule == "sync_during_capture":
            user_synchronizes()
        else:
            check(_record.API_CAPTURE_BEGIN, 2, "global", stack_of(plugin_captures))

    cgguard.install(cgguard.Config(mode="raise", log_file=os.devnull))
    tracker().active[cause[0]] = cause
    attempt()
    cgguard.install(cgguard.Config(mode="log", rules={rule: "raise"}, log_file=os.devnull))
    with pytest.raises(error) as raised:
        attempt()
    got = [(e["rule"], e["action"], e["level"], e[cause_stack]) for e in events]
    outer = [frame("@outer", "outer_begins")]
    assert got == [(rule, "logged", "warning", outer), (rule, "raised", "error", outer)]
    assert (raised.value.event, raised.value.rule) == (events[1], rule)


@pytest.mark.parametrize("mode", ["raise", "log"])
def test_rule_off_is_silent_and_uncounted(mode: str, events: list[dict[str, object]]) -> None:
    """Every rule off: a capture breaking them all goes through; no event, nothing counted."""
    rules = dict.fromkeys(
        ["capture_disabled", "nested_capture", "concurrent_capture", "sync_during_capture"], "off"
    )
    cgguard.install(cgguard.Config(mode=mode, rules=rules))  # type: ignore[arg-type]
    mine, other = record(threading.get_ident(), 1), record(12345, 2)
    tracker().active.update({1: mine, 2: other})
    _process.PROCESS.gate.flag.set(False, None)
    got = check(_record.API_GRAPH, 3, "global", stack_of(plugin_captures))
    user_synchronizes()
    assert (got[0], events, cgguard.status().violations) == (3, [], {})


def test_each_rule_takes_its_own_action(events: list[dict[str, object]]) -> None:
    """Mode log, nested set to raise, disabled off: only nested is reported, and it raises."""
    config = cgguard.Config(
        mode="log", rules={"nested_capture": "raise", "capture_disabled": "off"}
    )
    cgguard.install(config)
    mine, other = record(threading.get_ident(), 1), record(12345, 2)
    tracker().active.update({1: mine, 2: other})
    _process.PROCESS.gate.flag.set(False, None)
    with pytest.raises(cgguard.NestedCaptureError) as raised:
        check(_record.API_GRAPH, 3, "global", stack_of(plugin_captures))
    assert [(e["rule"], e["action"]) for e in events] == [
        ("nested_capture", "raised"),
        ("concurrent_capture", "logged"),
    ]
    assert raised.value.event is events[0]


def test_raise_mode_raises_the_first_and_reports_all(events: list[dict[str, object]]) -> None:
    """Both rules broken in raise mode: both reported, the first one raised."""
    cgguard.install()
    mine = record(threading.get_ident())
    tracker().active[mine[0]] = mine
    _process.PROCESS.gate.flag.set(False, None)
    with pytest.raises(cgguard.CaptureDisabledError):
        check(_record.API_GRAPH, 2, "global", stack_of(plugin_captures))
    assert [(e["rule"], e["action"]) for e in events] == [
        ("capture_disabled", "raised"),
        ("nested_capture", "raised"),
    ]


def test_violations_are_runtime_errors() -> None:
    """Existing ``except RuntimeError`` handlers keep catching cgguard's refusals."""
    assert issubclass(cgguard.CaptureDisabledError, cgguard.CaptureViolation)
    assert issubclass(cgguard.NestedCaptureError, cgguard.CaptureViolation)
    assert issubclass(cgguard.ConcurrentCaptureError, cgguard.CaptureViolation)
    assert issubclass(cgguard.SyncDuringCaptureError, cgguard.CaptureViolation)
    assert issubclass(cgguard.CaptureViolation, RuntimeError)
    assert issubclass(cgguard.CaptureViolation, cgguard.CgguardError)


def test_each_error_names_its_rule() -> None:
    """Each violation class carries the name of the rule it stands for."""
    classes = (
        cgguard.CaptureDisabledError,
        cgguard.NestedCaptureError,
        cgguard.ConcurrentCaptureError,
        cgguard.SyncDuringCaptureError,
    )
    expected = ["capture_disabled", "nested_capture", "concurrent_capture", "sync_during_capture"]
    assert expected == [cls.rule for cls in classes]


def test_internal_error_lets_the_capture_through(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug inside the guard is one stderr line and an unchecked capture, never a crash."""
    cgguard.install()
    _process.PROCESS.gate.flag.set(False, None)

    def broken(*args: object) -> None:
        raise LookupError("guard bug")

    monkeypatch.setattr(_capture, "disabled_by", broken)
    # Both ways a check goes: nothing capturing and nothing followed, then a flag followed.
    assert check(_record.API_GRAPH, 1, "global", ())[0] == 1
    _process.PROCESS.gate.follows.append(FlagSource(types.ModuleType("cgg_followed"), "on"))
    assert check(_record.API_GRAPH, 2, "global", ())[0] == 2
    assert capsys.readouterr().err == (
        "cgguard: internal error while checking a capture, not checked: LookupError('guard bug')\n"
    )


def test_internal_error_lets_the_synchronize_through(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug inside the synchronize check is one stderr line, never a crash or a refusal."""
    cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}))
    mine = record(threading.get_ident())
    tracker().active[mine[0]] = mine

    def broken(*args: object, **kwargs: object) -> None:
        raise LookupError("sync guard bug")

    monkeypatch.setattr(_syncs, "find_sync_violation", broken)
    for _ in range(2):
        user_synchronizes()
    assert capsys.readouterr().err == (
        "cgguard: internal error while checking a synchronize, not checked: "
        "LookupError('sync guard bug')\n"
    )


def test_failing_listener_does_not_stop_the_report(
    capsys: pytest.CaptureFixture[str], events: list[dict[str, object]]
) -> None:
    """A listener that raises is reported once; other listeners and the raise still happen."""
    cgguard.install(cgguard.Config(log_file=os.devnull))

    def bad(event: dict[str, object]) -> None:
        raise ValueError("listener bug")

    _process.PROCESS.listeners.insert(0, bad)
    _process.PROCESS.gate.flag.set(False, None)
    with pytest.raises(cgguard.CaptureDisabledError):
        check(_record.API_GRAPH, 1, "global", ())
    assert len(events) == 1
    assert capsys.readouterr().err == (
        "cgguard: a violation listener failed: ValueError('listener bug')\n"
    )


def test_sync_during_a_relaxed_capture_says_only_what_cuda_documents(
    events: list[dict[str, object]],
) -> None:
    """Whether relaxed mode fails a device synchronize is not settled: the message claims
    neither, and says what is certain."""
    cgguard.install()
    mine = (
        5,
        this_thread(),
        _record.API_CAPTURE_BEGIN,
        "relaxed",
        stack_of(outer_begins),
        None,
    )
    tracker().active[mine[0]] = mine
    user_synchronizes()
    (event,) = events
    where_user = (
        f"{__file__}:{frame('@user-sync', 'user_synchronizes')['line']} (in user_synchronizes)"
    )
    where_outer = f"{__file__}:{frame('@outer', 'outer_begins')['line']} (in outer_begins)"
    assert event["message"] == (
        f"Synchronize during CUDA graph capture: torch.cuda.synchronize at {where_user} "
        f"synchronizes while this thread's capture begun at {where_outer} via "
        "CUDAGraph.capture_begin is active; in capture_error_mode 'relaxed' CUDA fails it if "
        "it waits on the capturing stream or on an event recorded in the capture, and where it "
        "goes through it does not wait for the captured work, which has not run."
    )


def test_a_report_that_cannot_be_built_still_refuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], events: list[object]
) -> None:
    """Refusal is decided before reporting: a failure while building the event still raises."""
    from cgguard._reporting import events as _events

    def broken(*args: object, **kwargs: object) -> object:
        raise LookupError("report bug")

    monkeypatch.setattr(_events, "violation", broken)
    cgguard.install(cgguard.Config(log_file=os.devnull))
    _process.PROCESS.gate.flag.set(False, None)
    for _ in range(2):
        with pytest.raises(cgguard.CaptureDisabledError) as raised:
            check(_record.API_GRAPH, 1, "global", stack_of(plugin_captures))
    message = (
        "capture_disabled: torch.cuda.graph refused (cgguard could not build the report: "
        "LookupError('report bug'))"
    )
    assert (str(raised.value), dict(raised.value.event), events) == (
        message,
        {"rule": "capture_disabled", "api": "torch.cuda.graph"},
        [],
    )
    assert capsys.readouterr().err == (
        "cgguard: internal error while reporting a violation: LookupError('report bug')\n"
    )


def test_a_report_that_cannot_be_built_lets_a_logged_violation_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In log mode the same failure is a warning and the capture goes on."""
    from cgguard._reporting import events as _events

    def broken(*args: object, **kwargs: object) -> object:
        raise LookupError("report bug")

    monkeypatch.setattr(_events, "violation", broken)
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    _process.PROCESS.gate.flag.set(False, None)
    assert check(_record.API_GRAPH, 9, "global", ())[0] == 9


@pytest.mark.parametrize(("raw", "kept"), [("²", "²"), ("0x3", "0x3"), ("7", 7)])
def test_a_rank_that_is_not_a_plain_number_is_kept_as_text(
    raw: str, kept: object, monkeypatch: pytest.MonkeyPatch, events: list[dict[str, object]]
) -> None:
    """RANK="²" (a digit to str.isdigit(), not to int()) is reported as it is; the refusal holds."""
    monkeypatch.setenv("RANK", raw)
    cgguard.install(cgguard.Config(log_file=os.devnull))
    _process.PROCESS.gate.flag.set(False, None)
    with pytest.raises(cgguard.CaptureDisabledError):
        check(_record.API_GRAPH, 1, "global", stack_of(plugin_captures))
    assert [event["rank"] for event in events] == [kept]


def test_a_followed_flag_that_cannot_be_read_allows_with_one_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A followed flag whose read raises counts as allowing, with one line naming it."""
    import types

    class Broken(types.ModuleType):
        @property
        def capture_ok(self) -> bool:
            raise OSError("flag unreadable")

    cgguard.install(cgguard.Config(log_file=os.devnull))
    tracker().follows.append(FlagSource(Broken("cgg_broken"), "capture_ok"))
    assert cgguard.is_capture_enabled() is True
    mine = record(threading.get_ident())
    tracker().active[mine[0]] = mine
    with pytest.raises(cgguard.NestedCaptureError):
        check(_record.API_GRAPH, 2, "global", stack_of(plugin_captures))
    assert capsys.readouterr().err == (
        "cgguard: cannot read cgg_broken.capture_ok, not followed: OSError('flag unreadable')\n"
    )


def test_a_capture_path_built_alone_shares_nothing_with_the_process() -> None:
    """A tracker with its own flag and a reporter with its own listeners decide and report
    without any installation."""
    seen: list[object] = []
    flag = CaptureFlag()
    run = Run()
    reporter = Reporter(cgguard.Config(mode="log"), run, listeners=[seen.append])
    alone = Tracker(NO_TORCH, reporter, flag=flag, follows=[])
    flag.set(False, stack_of(runner_disables))
    record = alone.check(_record.API_GRAPH, 1, "global", stack_of(plugin_captures), None)[0]
    assert (record[0], [e["rule"] for e in seen], run.ledger.totals()) == (  # type: ignore[index]
        1,
        ["capture_disabled"],
        {"capture_disabled": 1},
    )
    assert (
        cgguard.is_installed(),
        cgguard.is_capture_enabled(),
        _process.PROCESS.gate.flag.enabled,
    ) == (
        False,
        True,
        True,
    )


def test_a_synchronize_hook_with_no_caller_frame_warns_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A synchronize hook run straight from C (no Python caller) cannot take a stack: one line,
    and the synchronize runs."""
    import _thread

    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    mine = record(threading.get_ident())
    tracker().active[mine[0]] = mine
    # Whichever thread synchronizes is taken as capturing: the raw thread's id is not known
    # before it runs.
    monkeypatch.setattr(_syncs, "find_sync_violation", lambda thread, active, **_: mine)
    done = threading.Event()
    sync = SyncChecks(tracker()).make_device_sync(done.set)
    _thread.start_new_thread(sync, ())  # sync is the thread's first and only Python frame
    assert done.wait(timeout=20)
    assert capsys.readouterr().err == (
        "cgguard: internal error while checking a synchronize, not checked: "
        "ValueError('call stack is not deep enough')\n"
    )


def test_each_kind_of_internal_error_gets_its_own_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failing check, a failing synchronize check and a failing report: three lines, not one."""
    from cgguard._reporting import events as _events

    def broken(name: str) -> Any:
        def fail(*args: object, **kwargs: object) -> None:
            raise LookupError(name)

        return fail

    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    mine = record(threading.get_ident())
    tracker().active[mine[0]] = mine
    monkeypatch.setattr(_capture, "find_violations", broken("check"))
    monkeypatch.setattr(_syncs, "find_sync_violation", broken("sync"))
    monkeypatch.setattr(_events, "violation", broken("report"))
    check(_record.API_GRAPH, 2, "global", ())
    user_synchronizes()
    monkeypatch.undo()
    monkeypatch.setattr(_events, "violation", broken("report"))
    check(_record.API_GRAPH, 3, "global", stack_of(plugin_captures))
    assert capsys.readouterr().err.splitlines() == [
        "cgguard: internal error while checking a capture, not checked: LookupError('check')",
        "cgguard: internal error while checking a synchronize, not checked: LookupError('sync')",
        "cgguard: internal error while reporting a violation: LookupError('report')",
    ]


def test_a_relaxed_capture_outlives_its_thread(events: list[dict[str, object]]) -> None:
    """A relaxed capture whose thread ended is not abandoned: CUDA lets another thread end it.
    A thread-local one is, once."""
    refs: list[Any] = []
    ended = threading.Thread(target=lambda: refs.append(this_thread()))
    ended.start()
    ended.join()
    assert refs[0]() is None  # the thread's mark went with it
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
    stack = stack_of(outer_begins)
    tracker().active[1] = (1, refs[0], _record.API_CAPTURE_BEGIN, "relaxed", stack, None)
    tracker().active[2] = (2, refs[0], _record.API_CAPTURE_BEGIN, "thread_local", stack, None)
    for _ in range(2):
        tracker().sweep()
    assert (sorted(tracker().active), [e["rule"] for e in events]) == ([1], ["abandoned_capture"])
