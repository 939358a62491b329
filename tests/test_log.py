"""cgguard._reporting.log: violation events rendered by cgguard's own structlog chain, written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest
import structlog
import structlog.testing

from cgguard._reporting.log import EventLog

if TYPE_CHECKING:
    from collections.abc import Iterator, MutableMapping
    from pathlib import Path


def nested_event() -> dict[str, Any]:
    """A nested-capture violation that was refused, in the documented event schema."""
    return {
        "event": "cgguard.capture_violation",
        "level": "error",
        "rule": "nested_capture",
        "action": "raised",
        "api": "torch.cuda.graph",
        "message": "a CUDA-graph capture began inside another on thread MainThread",
        "count": 1,
        "thread": "MainThread",
        "thread_id": 1,
        "pid": 2,
        "timestamp": "2026-01-01T00:00:00.000000Z",
        "stack": [
            {"file": "serve.py", "line": 10, "function": "<module>", "code": "main()"},
            {"file": "f.py", "line": 3, "function": "fn", "code": "x()"},
        ],
        "outer_stack": [
            {"file": "g.py", "line": 7, "function": "outer", "code": "with torch.cuda.graph(g):"},
        ],
    }


def disabled_event(disabled_stack: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A capture-disabled violation that was only logged, in the documented event schema."""
    return {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": "capture_disabled",
        "action": "logged",
        "api": "torch.cuda.graph.capture_begin",
        "message": "a CUDA-graph capture began while capture was disabled",
        "count": 1,
        "thread": "worker-1",
        "thread_id": 140,
        "pid": 77,
        "timestamp": "2026-01-01T00:00:01.500000Z",
        "stack": [{"file": "f.py", "line": 3, "function": "fn", "code": "x()"}],
        "disabled_stack": disabled_stack,
    }


def concurrent_event() -> dict[str, Any]:
    """A concurrent-capture violation, logged, from rank 1 of a distributed job."""
    return {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": "concurrent_capture",
        "action": "logged",
        "api": "CUDAGraph.capture_begin",
        "message": "a CUDA-graph capture began while thread 140 captures in global mode",
        "count": 1,
        "thread": "worker-2",
        "thread_id": 141,
        "pid": 77,
        "rank": 1,
        "local_rank": 1,
        "world_size": 2,
        "timestamp": "2026-01-01T00:00:02.000000Z",
        "stack": [{"file": "w.py", "line": 5, "function": "second", "code": "g.capture_begin()"}],
        "other_stack": [
            {"file": "w.py", "line": 2, "function": "first", "code": "with torch.cuda.graph(g):"}
        ],
        "other_thread_id": 140,
    }


def sync_event() -> dict[str, Any]:
    """A synchronize-during-capture violation that was refused, at its third time at its site."""
    return {
        "event": "cgguard.capture_violation",
        "level": "error",
        "rule": "sync_during_capture",
        "action": "raised",
        "api": "torch.cuda.synchronize",
        "message": "torch.cuda.synchronize() during this thread's capture",
        "count": 3,
        "thread": "MainThread",
        "thread_id": 1,
        "pid": 2,
        "timestamp": "2026-01-01T00:00:03.000000Z",
        "stack": [
            {"file": "s.py", "line": 8, "function": "step", "code": "torch.cuda.synchronize()"}
        ],
        "capture_stack": [
            {"file": "s.py", "line": 4, "function": "run", "code": "g.capture_begin()"},
        ],
    }


DISABLER = [
    {"file": "h.py", "line": 9, "function": "setup", "code": "cgguard.set_capture_enabled(False)"},
    {"file": "<string>", "line": 1, "function": "<module>", "code": None},
]

EVENTS = [
    pytest.param(nested_event(), id="nested"),
    pytest.param(disabled_event(), id="disabled-at-start"),
    pytest.param(disabled_event(DISABLER), id="disabled-in-code"),
    pytest.param(concurrent_event(), id="concurrent"),
    pytest.param(sync_event(), id="sync"),
]


@pytest.fixture
def reporters() -> Iterator[list[EventLog]]:
    """Reporters a test opens, closed after it."""
    made: list[EventLog] = []
    yield made
    for reporter in made:
        reporter.close()


def json_lines(text: str) -> list[Any]:
    """Each newline-terminated line of ``text``, parsed as JSON."""
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("event", EVENTS)
def test_injected_processors_see_the_event(event: dict[str, Any]) -> None:
    """Injected processors receive exactly the event's fields, plus the level LogCapture adds."""
    capture = structlog.testing.LogCapture()
    EventLog(processors=[capture]).emit(event)
    assert [{**event, "log_level": event["level"]}] == capture.entries


@pytest.mark.parametrize("event", EVENTS)
def test_json_is_one_line_of_the_event(
    event: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON rendering writes one stderr line that parses back to the event, keys in schema order."""
    EventLog(log_format="json").emit(event)
    out, err = capsys.readouterr()
    (parsed,) = json_lines(err)
    assert ("", event, list(event)) == (out, parsed, list(parsed))


def test_json_starts_with_event_key(capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON line's first key is "event", whatever order the fields came in."""
    event = nested_event()
    shuffled = dict(reversed(list(event.items())))
    EventLog(log_format="json").emit(shuffled)
    (parsed,) = json_lines(capsys.readouterr().err)
    assert (event, "event") == (parsed, next(iter(parsed)))


def test_default_format_is_json_when_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With no format chosen and stderr not a terminal, events are JSON lines."""
    EventLog().emit(nested_event())
    assert [nested_event()] == json_lines(capsys.readouterr().err)


@pytest.mark.usefixtures("capsys")
def test_emit_leaves_the_callers_event_unchanged() -> None:
    """Rendering works on a copy: the event passed in is the same after emit()."""
    event = nested_event()
    EventLog(log_format="console").emit(event)
    EventLog(log_format="json").emit(event)
    assert nested_event() == event


CONSOLE_BLOCKS = [
    pytest.param(
        nested_event(),
        "The capture was attempted at (most recent call last):\n"
        '  File "serve.py", line 10, in <module>\n'
        "    main()\n"
        '  File "f.py", line 3, in fn\n'
        "    x()\n"
        "\n"
        "The outer capture began at (most recent call last):\n"
        '  File "g.py", line 7, in outer\n'
        "    with torch.cuda.graph(g):\n",
        id="nested",
    ),
    pytest.param(
        disabled_event(),
        "The capture was attempted at (most recent call last):\n"
        '  File "f.py", line 3, in fn\n'
        "    x()\n"
        "\n"
        "Capture was disabled at (most recent call last):\n"
        "  (by configuration at start)\n",
        id="disabled-at-start",
    ),
    pytest.param(
        disabled_event(DISABLER),
        "The capture was attempted at (most recent call last):\n"
        '  File "f.py", line 3, in fn\n'
        "    x()\n"
        "\n"
        "Capture was disabled at (most recent call last):\n"
        '  File "h.py", line 9, in setup\n'
        "    cgguard.set_capture_enabled(False)\n"
        '  File "<string>", line 1, in <module>\n',
        id="disabled-in-code",
    ),
    pytest.param(
        concurrent_event(),
        "The capture was attempted at (most recent call last):\n"
        '  File "w.py", line 5, in second\n'
        "    g.capture_begin()\n"
        "\n"
        "The other thread's capture began at (most recent call last):\n"
        '  File "w.py", line 2, in first\n'
        "    with torch.cuda.graph(g):\n",
        id="concurrent",
    ),
    pytest.param(
        sync_event(),
        "The synchronize or query was made at (most recent call last):\n"
        '  File "s.py", line 8, in step\n'
        "    torch.cuda.synchronize()\n"
        "\n"
        "The capture began at (most recent call last):\n"
        '  File "s.py", line 4, in run\n'
        "    g.capture_begin()\n",
        id="sync",
    ),
]


@pytest.mark.parametrize(("event", "block"), CONSOLE_BLOCKS)
def test_console_folds_stacks_into_a_traceback_block(
    event: dict[str, Any], block: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Console rendering prints the event line, then its stacks as one traceback-like block."""
    EventLog(log_format="console").emit(event)
    out, err = capsys.readouterr()
    _, rest = err.split("\n", 1)
    assert ("", block) == (out, rest)


def test_console_escapes_what_a_terminal_acts_on(capsys: pytest.CaptureFixture[str]) -> None:
    """Console rendering shows a field or a frame holding control characters or bidi
    overrides escaped: the field quoted as repr() writes it, the frame's text escaped."""
    event = nested_event()
    event.update(thread="T\x1b]0;owned\x07", message="began\x1b[8m hidden", rank="\u202e1")
    del event["outer_stack"]
    event["stack"] = [{"file": "\x1b[2Jgen.py", "line": 1, "function": "f", "code": "x()\x07"}]
    EventLog(log_format="console").emit(event)
    assert capsys.readouterr().err == (
        "2026-01-01T00:00:00.000000Z [error    ] cgguard.capture_violation      action=raised "
        "api=torch.cuda.graph count=1 message='began\\x1b[8m hidden' pid=2 rank='\\u202e1' "
        "rule=nested_capture thread='T\\x1b]0;owned\\x07' thread_id=1\n"
        "The capture was attempted at (most recent call last):\n"
        '  File "\\x1b[2Jgen.py", line 1, in f\n'
        "    x()\\x07\n"
    )


def test_console_has_no_colors_when_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Console rendering to a stderr that is not a terminal has no ANSI escape codes."""
    EventLog(log_format="console").emit(nested_event())
    assert "\x1b" not in capsys.readouterr().err


def test_log_file_appends_one_line_per_event(
    tmp_path: Path, reporters: list[EventLog], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each event appends exactly one line to the log file, after what it held; stderr is quiet."""
    path = tmp_path / "events.log"
    path.write_text('{"earlier": true}\n')
    reporter = EventLog(log_format="json", log_file=str(path))
    reporters.append(reporter)
    reporter.emit(nested_event())
    reporter.emit(disabled_event())
    expected = [{"earlier": True}, nested_event(), disabled_event()]
    assert expected == json_lines(path.read_text())
    assert capsys.readouterr() == ("", "")


def test_log_file_is_created_when_missing(tmp_path: Path, reporters: list[EventLog]) -> None:
    """A log file that does not exist yet is created, holding the event."""
    path = tmp_path / "new.log"
    reporter = EventLog(log_format="json", log_file=str(path))
    reporters.append(reporter)
    reporter.emit(nested_event())
    assert [nested_event()] == json_lines(path.read_text())


def test_two_reporters_share_a_log_file_in_turn(tmp_path: Path, reporters: list[EventLog]) -> None:
    """Two reporters on one file (two processes) append in turn: nothing is overwritten."""
    path = str(tmp_path / "shared.log")
    first = EventLog(log_format="json", log_file=path)
    second = EventLog(log_format="json", log_file=path)
    reporters.extend([first, second])
    first.emit(nested_event())
    second.emit(disabled_event())
    first.emit(disabled_event(DISABLER))
    second.emit(nested_event())
    expected = [nested_event(), disabled_event(), disabled_event(DISABLER), nested_event()]
    assert expected == json_lines((tmp_path / "shared.log").read_text())


def test_two_reporters_writing_at_once_never_interleave(
    tmp_path: Path, reporters: list[EventLog]
) -> None:
    """Long lines written at once by two reporters on one file land whole, none lost."""
    path = str(tmp_path / "busy.log")

    def event(writer: int, n: int) -> dict[str, Any]:
        return {**nested_event(), "pid": writer, "thread_id": n, "message": f"{writer}" * 20_000}

    def write_all(reporter: EventLog, writer: int) -> None:
        for n in range(100):
            reporter.emit(event(writer, n))

    pair = [EventLog(log_format="json", log_file=path) for _ in range(2)]
    reporters.extend(pair)
    threads = [threading.Thread(target=write_all, args=(r, w)) for w, r in enumerate(pair)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a writer hung"
    written = json_lines((tmp_path / "busy.log").read_text())
    expected = [event(w, n) for w in range(2) for n in range(100)]
    assert expected == sorted(written, key=lambda e: (e["pid"], e["thread_id"]))


def _fds_on(path: Path) -> list[int]:
    """This process's open file descriptors on ``path``."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if target == str(path):
            fds.append(int(name))
    return fds


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_close_releases_the_log_file(tmp_path: Path) -> None:
    """The log file is held open from the first event until close()."""
    path = tmp_path / "held.log"
    reporter = EventLog(log_format="json", log_file=str(path))
    reporter.emit(nested_event())
    held = _fds_on(path)
    reporter.close()
    assert (len(held), _fds_on(path)) == (1, [])


def test_unopenable_log_file_falls_back_to_stderr(
    tmp_path: Path, reporters: list[EventLog], capsys: pytest.CaptureFixture[str]
) -> None:
    """A log file that cannot be opened is said once on stderr, and events go to stderr."""
    path = str(tmp_path / "missing" / "events.log")
    reporter = EventLog(log_format="json", log_file=path)
    reporters.append(reporter)
    reporter.emit(nested_event())
    reporter.emit(disabled_event())
    out, err = capsys.readouterr()
    warning, *events = err.splitlines()
    expected_warning = (
        f"cgguard: cannot write to log file {path!r} "
        "(No such file or directory); events go to stderr"
    )
    assert ("", expected_warning) == (out, warning)
    assert [nested_event(), disabled_event()] == [json.loads(line) for line in events]


def test_failing_processor_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """A processor that raises makes emit() say one warning on stderr instead of raising."""

    def broken(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
        raise RuntimeError("processor failed")

    reporter = EventLog(processors=[broken])
    reporter.emit(nested_event())
    reporter.emit(nested_event())
    expected_err = "cgguard: could not report a violation: RuntimeError('processor failed')\n"
    assert ("", expected_err) == capsys.readouterr()


@pytest.fixture
def host_structlog() -> Iterator[None]:
    """The host program's structlog configuration, restored after the test."""
    configured = structlog.is_configured()
    saved = structlog.get_config()
    yield
    structlog.reset_defaults()
    if configured:
        structlog.configure(**saved)


@pytest.mark.usefixtures("host_structlog")
def test_host_structlog_configuration_is_neither_read_nor_changed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The host's structlog processors never see cgguard's events, and its config is unchanged."""
    seen: list[dict[str, Any]] = []

    def host_processor(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
        seen.append(dict(event_dict))
        raise RuntimeError("the host's processor ran")

    structlog.configure(processors=[host_processor])
    # Lists copied: a processor appended in place would otherwise show in both.
    before = {k: list(v) if isinstance(v, list) else v for k, v in structlog.get_config().items()}
    EventLog(log_format="console").emit(nested_event())
    EventLog(log_format="json").emit(nested_event())
    after = structlog.get_config()
    json_line = capsys.readouterr().err.splitlines()[-1]
    assert (nested_event(), []) == (json.loads(json_line), seen)
    assert before == after


@pytest.mark.subprocess
def test_structlog_is_imported_at_the_first_emit() -> None:
    """Importing cgguard._reporting.log does not import structlog; the first emit does."""
    script = (
        "import sys, cgguard._reporting.log\n"
        "print('structlog' in sys.modules)\n"
        "cgguard._reporting.log.EventLog(log_format='json')"
        ".emit({'event': 'e', 'level': 'error'})\n"
        "print('structlog' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    expected = ("False\nTrue\n", '{"event": "e", "level": "error"}\n')
    assert expected == (result.stdout, result.stderr)


def test_a_short_write_is_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """write(2) writing fewer bytes than asked (a disk nearly full): the line is finished."""
    import cgguard._reporting.log as log_module

    real_write = os.write

    def short_write(fd: int, data: bytes) -> int:
        return real_write(fd, bytes(data[:7]))  # at most 7 bytes at a time

    path = tmp_path / "events.jsonl"
    log = EventLog("json", str(path))
    monkeypatch.setattr(log_module.os, "write", short_write)
    log.emit(nested_event())
    monkeypatch.undo()
    log.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [nested_event()]


def test_a_write_that_cannot_finish_warns_and_goes_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """write(2) that writes nothing: one warning naming the file, and the event on stderr."""
    import cgguard._reporting.log as log_module

    path = tmp_path / "events.jsonl"
    log = EventLog("json", str(path))
    monkeypatch.setattr(log_module.os, "write", lambda fd, data: 0)
    log.emit(nested_event())
    monkeypatch.undo()
    log.close()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"cgguard: cannot write to log file {str(path)!r} (wrote 0 of ")
    assert err[0].endswith("); events go to stderr")
    assert json.loads(err[1]) == nested_event()


def test_a_relative_log_file_is_resolved_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative log file names one file, even if the program changes directory first."""
    monkeypatch.chdir(tmp_path)
    log = EventLog("json", "events.jsonl")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    log.emit(nested_event())
    log.close()
    assert (tmp_path / "events.jsonl").is_file()
    assert os.listdir(tmp_path / "elsewhere") == []


def test_a_line_cut_by_a_full_disk_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Part of a line written, then no room: the part is ended with a newline, so that the next
    process's line in a shared file still parses."""
    import errno

    import cgguard._reporting.log as log_module

    real_write = os.write
    calls: list[int] = []

    def filling_write(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:10]))
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, bytes(data))  # the newline that ends the cut line

    path = tmp_path / "events.jsonl"
    log = EventLog("json", str(path))
    monkeypatch.setattr(log_module.os, "write", filling_write)
    log.emit(nested_event())
    monkeypatch.undo()
    log.close()
    with path.open("a") as shared:
        shared.write('{"next": "process"}\n')
    lines = path.read_text().splitlines()
    assert (len(lines[0]), json.loads(lines[1])) == (10, {"next": "process"})
    assert "No space left on device" in capsys.readouterr().err


def summary_event() -> dict[str, Any]:
    """An exit summary with two violating sites and one exempted, in the documented schema."""
    return {
        "event": "cgguard.summary",
        "level": "warning",
        "pid": 5,
        "timestamp": "2026-01-01T00:00:02.000000Z",
        "totals": {"nested_capture": 3, "capture_disabled": 1},
        "sites": [
            {"rule": "nested_capture", "count": 3, "file": "m.py", "line": 4, "function": "f"},
            {"rule": "capture_disabled", "count": 1, "file": None, "line": None, "function": None},
        ],
        "exempted_totals": {"sync_during_capture": 2},
        "exempted_sites": [
            {
                "rule": "sync_during_capture",
                "count": 2,
                "file": "k.py",
                "line": 9,
                "function": "warm",
                "exemption": "sync_during_capture=k",
            }
        ],
    }


def test_console_summary_is_lines_per_site_not_a_dict(capsys: pytest.CaptureFixture[str]) -> None:
    """The exit summary on the console is a line of totals and a line per site, as the census
    is shown; the JSON line keeps the fields."""
    EventLog(log_format="console").emit(summary_event())
    assert capsys.readouterr().err == (
        "2026-01-01T00:00:02.000000Z [warning  ] cgguard.summary                "
        "message='4 violations at 2 sites: nested_capture 3, capture_disabled 1; "
        "2 exempted captures' pid=5\n"
        "violations by site:\n"
        "  m.py:4 (in f): nested_capture 3\n"
        "  an unknown site: capture_disabled 1\n"
        "exempted captures by site:\n"
        "  k.py:9 (in warm): sync_during_capture 2 (exemption 'sync_during_capture=k')\n"
    )
    EventLog(log_format="json").emit(summary_event())
    assert json.loads(capsys.readouterr().err) == summary_event()


@pytest.mark.parametrize(
    ("environ", "tty", "expected"),
    [
        ({}, True, True),
        ({}, False, False),
        ({"NO_COLOR": "1"}, True, False),
        ({"NO_COLOR": ""}, True, True),  # empty is unset (no-color.org)
        ({"FORCE_COLOR": "1"}, False, True),
        ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False, False),
        ({"TERM": "dumb"}, True, False),
        ({"TERM": "dumb", "FORCE_COLOR": "yes"}, True, True),
        ({"PYTHON_COLORS": "1", "NO_COLOR": "1"}, False, True),
        ({"PYTHON_COLORS": "0", "FORCE_COLOR": "1"}, True, False),
        ({"PYTHON_COLORS": "yes", "NO_COLOR": "1"}, True, False),  # not 0 or 1: not read
    ],
)
def test_colors_follow_no_color_and_force_color(
    environ: dict[str, str], tty: bool, expected: bool
) -> None:
    """PYTHON_COLORS first, then NO_COLOR, then FORCE_COLOR, then TERM=dumb, then whether
    stderr is a terminal."""
    from cgguard._reporting.log import wants_colors

    class Stream:
        def isatty(self) -> bool:
            return tty

    assert wants_colors(Stream(), environ) is expected


def test_force_color_colours_console_events_off_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FORCE_COLOR gives a captured stderr ANSI colours; NO_COLOR takes them away again."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    EventLog(log_format="console").emit(nested_event())
    assert "\x1b[" in capsys.readouterr().err
    monkeypatch.setenv("NO_COLOR", "1")
    EventLog(log_format="console").emit(nested_event())
    assert "\x1b" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("level", "written"),
    [
        ("debug", ["debug", "info", "warning", "error"]),
        ("info", ["info", "warning", "error"]),
        ("warning", ["warning", "error"]),
        ("error", ["error"]),
    ],
)
def test_log_level_leaves_out_less_severe_events(
    level: str, written: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An event below the log level is not written; the rest are, whole and in order."""
    log = EventLog(log_format="json", level=level)
    for each in ("debug", "info", "warning", "error"):
        log.emit({**nested_event(), "level": each})
    lines = capsys.readouterr().err.splitlines()
    assert [json.loads(line)["level"] for line in lines] == written
    assert log.anew().level == level
