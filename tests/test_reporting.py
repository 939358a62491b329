"""Production reporting end to end: bounded logging, the exit summary, the JSON report and the
logging target, in one process and across many."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from helpers import DISABLED_SENTENCE, SourceFile, run_seen, tracker

import cgguard
from cgguard import _process
from cgguard._reporting import events as _events
from cgguard._reporting import report_file as _report_file
from cgguard._support import threads as _threads
from cgguard._support import warn as _warn
from cgguard._support.frames import snapshot
from cgguard.testing import capture_violations

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from cgguard._data import schema as _schema
    from cgguard._support.frames import Snapshot
    from cgguard.testing import SimulatedCuda

API = "torch.cuda.graph"
frame = SourceFile(__file__).frame
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")

# The keys of a first (full) capture_disabled event, and of a brief repeat.
FULL_KEYS = {
    "event",
    "level",
    "rule",
    "action",
    "api",
    "message",
    "count",
    "thread",
    "thread_id",
    "pid",
    "timestamp",
    "stack",
    "disabled_stack",
}
BRIEF_KEYS = FULL_KEYS - {"stack", "disabled_stack"} | {"site"}

# Shared by the programs run in subprocesses: each call of violate() is a capture_disabled
# violation whose site is the line that calls it.
PRELUDE = """\
import json
import os
import signal
import sys
import threading

import cgguard
from cgguard import _process
from cgguard._core.probes import NO_TORCH
from cgguard._core.tracker import Tracker
from cgguard._support.frames import snapshot


def check(stack):
    # A capture attempt at ``stack``, checked as torch's hooks check one (torch is not
    # imported here: a capture path of its own, answered by the installation's reporter).
    process = _process.PROCESS
    gate = process.gate
    tracker = Tracker(NO_TORCH, process.installation.reporter, flag=gate.flag, follows=gate.follows)
    tracker.check("torch.cuda.graph", 1, "global", stack, None)


def violate():
    check(snapshot(1)[:2])


print(json.dumps({"pid": os.getpid(), "thread_id": threading.get_ident()}), flush=True)
"""


def where(site: dict[str, Any]) -> str:
    return f"{site['file']}:{site['line']} (in {site['function']})"


def here() -> Snapshot:
    """A one-frame stack: the caller, at the line that calls this."""
    return snapshot(1)[:2]


def violate(stack: Snapshot) -> None:
    tracker().check(API, 1, "global", stack, None)


def disabled_event(
    site: dict[str, Any], count: int, *, action: str = "logged", **context: object
) -> dict[str, Any]:
    """A full capture_disabled event (without its timestamp), capture disabled by config."""
    return {
        "event": "cgguard.capture_violation",
        "level": "error" if action == "raised" else "warning",
        "rule": "capture_disabled",
        "action": action,
        "api": API,
        "message": f"{DISABLED_SENTENCE} {API} at {where(site)} began a capture; capture was "
        "disabled by cgguard's configuration at start.",
        "count": count,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "stack": [site],
        "disabled_stack": None,
        **context,
    }


def nested_event(
    site: dict[str, Any], outer: dict[str, Any], count: int, **context: object
) -> dict[str, Any]:
    """A full nested_capture event (without its timestamp), logged."""
    return {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": "nested_capture",
        "action": "logged",
        "api": API,
        "message": f"Nested CUDA graph capture is not supported: {API} at {where(site)} began a "
        f"capture while this thread's capture begun at {where(outer)} via {API} is still active.",
        "count": count,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "stack": [site],
        "outer_stack": [outer],
        **context,
    }


def brief_event(
    site: dict[str, Any], count: int, *, rule: str = "capture_disabled", **context: object
) -> dict[str, Any]:
    """A brief repeat event (without its timestamp): the count and the site, no stacks."""
    return {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": rule,
        "action": "logged",
        "api": API,
        "message": f"repeated {count} times at {where(site)}",
        "count": count,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "site": site,
        **context,
    }


def summary_event(
    totals: dict[str, int], sites: list[dict[str, Any]], **context: object
) -> dict[str, Any]:
    """The exit summary (without its timestamp)."""
    return {
        "event": "cgguard.summary",
        "level": "warning",
        "pid": os.getpid(),
        "totals": totals,
        "sites": sites,
        **context,
    }


def summary_site(site: dict[str, Any], count: int) -> dict[str, Any]:
    return {
        "rule": "capture_disabled",
        "count": count,
        "file": site["file"],
        "line": site["line"],
        "function": site["function"],
    }


def stamped(event: dict[str, Any], key: str = "timestamp") -> dict[str, Any]:
    """``event`` without its timestamp, once the timestamp is checked to be ISO 8601 UTC."""
    assert TIMESTAMP.fullmatch(event[key]), event[key]
    return {k: v for k, v in event.items() if k != key}


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON log file, parsed (none if the file was never written)."""
    if not path.exists():
        return []
    text = path.read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def report_when(path: Path, totals: dict[str, int], timeout: float = 5.0) -> dict[str, Any]:
    """The report once it holds ``totals``: cgguard's own thread writes it within a second."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            document = read_report(path)
        except (OSError, ValueError):
            document = {}
        if document.get("totals") == totals or time.monotonic() > deadline:
            return document
        time.sleep(0.02)


def read_report(path: Path) -> dict[str, Any]:
    """A JSON report, without its ``written_at`` (checked to be ISO 8601 UTC) and without its
    census's sections, whose seconds vary (tests/test_census.py checks them)."""
    document = stamped(json.loads(path.read_text()), "written_at")
    document.pop("captures", None)
    document.pop("cudagraph_skips", None)
    return document


def report_document(
    config: dict[str, Any],
    totals: dict[str, int],
    violations: list[dict[str, Any]],
    **context: object,
) -> dict[str, Any]:
    """The JSON report the spec describes (without ``written_at``)."""
    return {
        "schema": 2,
        "cgguard": cgguard.__version__,
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "config": config,
        "totals": totals,
        "violations": violations,
        "exempted_totals": {},
        "exempted": [],
        **context,
    }


def config_section(**values: object) -> dict[str, Any]:
    """A report's ``config``: every Config field, defaults unless given."""
    return {
        "mode": "raise",
        "rules": {},
        "log_format": None,
        "log_file": None,
        "log_target": None,
        "report": None,
        "capture": None,
        "simulate_cuda": False,
        "vllm_bridge": True,
        "exempt": [],
        "exempt_file": None,
        "windows": [],
        "profiles": "log",
        "inspect": False,
        "inspect_first": None,
        "census": True,
        "census_replays": False,
        "metrics": None,
        "log_level": "debug",
        "manifest": True,
        "rank_check": False,
        **values,
    }


def child_environ(**extra: str) -> dict[str, str]:
    """This environment without any CGGUARD_* or rank variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")} | extra
    for name in RANK_VARIABLES:
        if name not in extra:
            env.pop(name, None)
    return env


def run_program(
    path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(path), *args],
        env=env if env is not None else child_environ(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write_program(folder: Path, name: str, body: str) -> tuple[Path, SourceFile]:
    """A program file (named so it shadows no module), and its marked lines."""
    path = folder / name
    path.write_text(body)
    return path, SourceFile(path)


@pytest.fixture(autouse=True)
def _quiet_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """No rank variables unless a test sets them; warn_once remembers nothing said before."""
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_warn, "_said", set())


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def cgguard_records() -> Iterator[list[logging.LogRecord]]:
    """The records the standard library logger "cgguard" handles; the logger restored after."""
    logger = logging.getLogger("cgguard")
    handler = _Records()
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    logger.addHandler(handler)
    yield handler.records
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


# --- bounded logging ------------------------------------------------------------------------


def test_repeats_at_one_site_are_logged_briefly_at_powers_of_two(tmp_path: Path) -> None:
    """20 violations at one site: the log has the first in full, then brief lines at 2, 4, 8, 16."""
    log = tmp_path / "events.jsonl"
    cgguard.install(cgguard.Config(mode="log", log_file=str(log), capture="disabled"))
    with capture_violations() as seen:
        for _ in range(20):
            violate(here())  # storm
    site = frame("storm", "test_repeats_at_one_site_are_logged_briefly_at_powers_of_two")
    logged = read_events(log)
    assert [set(event) for event in logged] == [FULL_KEYS] + [BRIEF_KEYS] * 4
    assert [stamped(event) for event in logged] == [
        disabled_event(site, 1),
        brief_event(site, 2),
        brief_event(site, 4),
        brief_event(site, 8),
        brief_event(site, 16),
    ]
    # Listeners see every violation, each in full.
    assert [stamped(event) for event in seen] == [disabled_event(site, n) for n in range(1, 21)]


def test_each_site_gets_its_own_first_full_event(tmp_path: Path) -> None:
    """Two call sites interleaved: each is reported in full once, and counted on its own."""
    log = tmp_path / "events.jsonl"
    cgguard.install(cgguard.Config(mode="log", log_file=str(log), capture="disabled"))
    for _ in range(3):
        violate(here())  # site-a
        violate(here())  # site-b
    function = "test_each_site_gets_its_own_first_full_event"
    a, b = frame("site-a", function), frame("site-b", function)
    assert [stamped(event) for event in read_events(log)] == [
        disabled_event(a, 1),
        disabled_event(b, 1),
        brief_event(a, 2),
        brief_event(b, 2),
    ]


def test_another_rule_at_the_same_line_is_another_site(tmp_path: Path) -> None:
    """One line breaking two rules at once: each rule has its own first full event and count."""
    log = tmp_path / "events.jsonl"
    cgguard.install(cgguard.Config(mode="log", log_file=str(log), capture="disabled"))
    outer_stack = here()  # outer
    tracker().active[7] = (7, _threads.this_thread(), API, "global", outer_stack, None)
    for _ in range(2):
        violate(here())  # two-rules
    function = "test_another_rule_at_the_same_line_is_another_site"
    site, outer = frame("two-rules", function), frame("outer", function)
    assert [stamped(event) for event in read_events(log)] == [
        disabled_event(site, 1),
        nested_event(site, outer, 1),
        brief_event(site, 2),
        brief_event(site, 2, rule="nested_capture"),
    ]
    assert cgguard.status().violations == {"capture_disabled": 2, "nested_capture": 2}


def test_raise_mode_always_raises_with_the_full_event(tmp_path: Path) -> None:
    """In raise mode every refusal at one site carries the full event, repeats included."""
    log = tmp_path / "events.jsonl"
    cgguard.install(cgguard.Config(mode="raise", log_file=str(log), capture="disabled"))
    raised = []
    for _ in range(3):
        with pytest.raises(cgguard.CaptureDisabledError) as caught:
            violate(here())  # raising
        raised.append(stamped(caught.value.event))
    site = frame("raising", "test_raise_mode_always_raises_with_the_full_event")
    assert raised == [disabled_event(site, n, action="raised") for n in (1, 2, 3)]
    assert [stamped(event) for event in read_events(log)] == [
        disabled_event(site, 1, action="raised"),
        brief_event(site, 2) | {"level": "error", "action": "raised"},
    ]


@pytest.mark.simulated
def test_a_capture_storm_on_the_simulated_runtime_is_bounded(
    tmp_path: Path, simulated_cuda_runtime: SimulatedCuda
) -> None:
    """torch.cuda.graph in a loop while disabled: one full line, brief ones at 2, 4, 8, 16."""
    import torch

    log = tmp_path / "events.jsonl"
    cgguard.install(cgguard.Config(mode="log", log_file=str(log)))
    cgguard.set_capture_enabled(False)
    with capture_violations() as seen:
        for _ in range(20):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):  # simulated-storm
                pass
    site = frame("simulated-storm", "test_a_capture_storm_on_the_simulated_runtime_is_bounded")
    logged = read_events(log)
    assert [(set(e), e["count"]) for e in logged] == [(FULL_KEYS, 1)] + [
        (BRIEF_KEYS, n) for n in (2, 4, 8, 16)
    ]
    assert logged[0]["stack"][-1] == site
    assert [e["site"] for e in logged[1:]] == [site] * 4
    full: list[dict[str, Any]] = seen
    assert [(set(e), e["count"], e["stack"][-1]) for e in full] == [
        (FULL_KEYS, n, site) for n in range(1, 21)
    ]


def test_a_repeat_during_the_first_report_still_names_its_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repeat counted while another thread still renders the site's first event names the site."""
    log = tmp_path / "events.jsonl"
    cgguard.install(cgguard.Config(mode="log", log_file=str(log), capture="disabled"))
    rendering, repeated = threading.Event(), threading.Event()
    render = _events.violation

    def slow_render(*args: Any, **kwargs: Any) -> _schema.ViolationEvent:
        rendering.set()
        repeated.wait(timeout=2)
        return render(*args, **kwargs)

    monkeypatch.setattr(_events, "violation", slow_render)
    stack = here()  # racing
    first = threading.Thread(target=violate, args=(stack,))
    first.start()
    assert rendering.wait(timeout=10)
    violate(stack)  # counted 2 while the first is still being rendered
    repeated.set()
    first.join(timeout=10)
    site = frame("racing", "test_a_repeat_during_the_first_report_still_names_its_site")
    (brief,) = [event for event in read_events(log) if event["count"] == 2]
    assert stamped(brief) == brief_event(site, 2)


def test_a_storm_of_ten_thousand_keeps_one_site_and_fourteen_lines(tmp_path: Path) -> None:
    """10,000 violations at one site: one ledger site, log lines at counts 1, 2, 4, ..., 8192."""
    log = tmp_path / "events.jsonl"
    cgguard.install(cgguard.Config(mode="log", log_file=str(log), capture="disabled"))
    for _ in range(10_000):
        violate(here())  # big-storm
    assert len(run_seen().ledger.sites()) == 1
    assert cgguard.status().violations == {"capture_disabled": 10_000}
    assert [event["count"] for event in read_events(log)] == [2**n for n in range(14)]


# --- exit summary and the report at exit ----------------------------------------------------

SUMMARY_PROGRAM = (
    PRELUDE
    + """
cgguard.install(
    cgguard.Config(mode="log", log_file=sys.argv[1], report=sys.argv[2], capture="disabled")
)
for _ in range(3):
    violate()  # summary-a
violate()  # summary-b
"""
)


@pytest.mark.subprocess
def test_exit_summary_and_final_report(tmp_path: Path) -> None:
    """At normal exit: the summary is the log's last line, the report holds the final counts."""
    program, source = write_program(tmp_path, "violating_program.py", SUMMARY_PROGRAM)
    log, folder = tmp_path / "events.jsonl", tmp_path / "reports"
    folder.mkdir()
    template = str(folder / "r-{pid}.json")
    env = child_environ(RANK="3", LOCAL_RANK="1", WORLD_SIZE="8")
    result = run_program(program, str(log), template, env=env)
    assert (result.returncode, result.stderr) == (0, "")
    child = json.loads(result.stdout)
    context = {**child, "rank": 3, "local_rank": 1, "world_size": 8}
    a = source.frame("summary-a", "<module>")
    b = source.frame("summary-b", "<module>")
    assert [stamped(event) for event in read_events(log)] == [
        disabled_event(a, 1, **context),
        brief_event(a, 2, **context),
        disabled_event(b, 1, **context),
        summary_event(
            {"capture_disabled": 4},
            [summary_site(a, 3), summary_site(b, 1)],
            pid=child["pid"],
            rank=3,
            local_rank=1,
            world_size=8,
        ),
    ]
    assert os.listdir(folder) == [f"r-{child['pid']}.json"]
    report = read_report(folder / f"r-{child['pid']}.json")
    report["violations"] = [v | {"first": stamped(v["first"])} for v in report["violations"]]
    assert report == report_document(
        config_section(mode="log", log_file=str(log), report=template, capture="disabled"),
        {"capture_disabled": 4},
        [
            {"rule": "capture_disabled", "count": 3, "first": disabled_event(a, 1, **context)},
            {"rule": "capture_disabled", "count": 1, "first": disabled_event(b, 1, **context)},
        ],
        pid=child["pid"],
        rank=3,
        local_rank=1,
        world_size=8,
        # A rank's capture manifest (docs/ranks.md): no capture reached torch here.
        manifest={
            "identity": {"rank": 3, "local_rank": 1, "world_size": 8},
            "captures": [],
            "per_site": {},
            "later": 0,
        },
    )


QUIET_PROGRAM = (
    PRELUDE
    + """
cgguard.install(cgguard.Config(mode="log", log_file=sys.argv[1], report=sys.argv[2]))
"""
)


@pytest.mark.subprocess
def test_no_summary_without_a_violation(tmp_path: Path) -> None:
    """A run without a violation logs nothing at exit; its report says so."""
    program, _ = write_program(tmp_path, "quiet_program.py", QUIET_PROGRAM)
    log, report = tmp_path / "events.jsonl", tmp_path / "report.json"
    result = run_program(program, str(log), str(report))
    assert (result.returncode, result.stderr) == (0, "")
    child = json.loads(result.stdout)
    assert read_events(log) == []
    document = read_report(report)
    # A path without {pid} names its run, so that the run's processes do not erase each other.
    assert re.fullmatch("[0-9a-f]{16}", document.pop("job"))
    assert document == report_document(
        config_section(mode="log", log_file=str(log), report=str(report)),
        {},
        [],
        pid=child["pid"],
    )


# --- the JSON report while running ----------------------------------------------------------


def test_report_is_kept_current_as_distinct_violations_appear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report is rewritten at each new site, before exit, and at uninstall; ranks as ints."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ranks: dict[str, Any] = {"rank": 2, "local_rank": 0, "world_size": 4}
    log, folder = tmp_path / "events.jsonl", tmp_path / "reports"
    folder.mkdir()
    template = str(folder / "r-{pid}.json")
    report = folder / f"r-{os.getpid()}.json"
    cgguard.install(
        cgguard.Config(
            mode="log",
            log_file=str(log),
            report=template,
            capture="disabled",
            rules={"sync_during_capture": "off"},
        )
    )
    config = config_section(
        mode="log",
        log_file=str(log),
        report=template,
        capture="disabled",
        rules={"sync_during_capture": "off"},
    )
    function = "test_report_is_kept_current_as_distinct_violations_appear"
    a, b = frame("report-a", function), frame("report-b", function)
    # A rank's capture manifest (docs/ranks.md): no capture reached torch here.
    manifest = {"identity": ranks, "captures": [], "per_site": {}, "later": 0}
    first_a, first_b = disabled_event(a, 1, **ranks), disabled_event(b, 1, **ranks)
    seen = []

    def current(totals: int) -> dict[str, Any]:
        document = report_when(report, {"capture_disabled": totals})
        document["violations"] = [
            v | {"first": stamped(v["first"])} for v in document["violations"]
        ]
        return document

    for n in range(3):
        violate(here())  # report-a
        if n == 0:
            seen.append(current(1))
    for n in range(2):
        violate(here())  # report-b
        if n == 0:
            seen.append(current(4))
    cgguard.uninstall()
    seen.append(current(5))
    assert seen == [
        report_document(
            config,
            {"capture_disabled": 1},
            [{"rule": "capture_disabled", "count": 1, "first": first_a}],
            **ranks,
            manifest=manifest,
        ),
        report_document(
            config,
            {"capture_disabled": 4},
            [
                {"rule": "capture_disabled", "count": 3, "first": first_a},
                {"rule": "capture_disabled", "count": 1, "first": first_b},
            ],
            **ranks,
            manifest=manifest,
        ),
        report_document(
            config,
            {"capture_disabled": 5},
            [
                {"rule": "capture_disabled", "count": 3, "first": first_a},
                {"rule": "capture_disabled", "count": 2, "first": first_b},
            ],
            **ranks,
            manifest=manifest,
        ),
    ]
    # The events carry the ranks too; the rewrites left no temporary file behind.
    assert [stamped(event) for event in read_events(log)] == [
        first_a,
        brief_event(a, 2, **ranks),
        first_b,
        brief_event(b, 2, **ranks),
    ]
    assert os.listdir(folder) == [report.name]


def test_report_never_goes_back_to_an_older_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads finding new sites at once: the report ends up holding both sites."""
    report = tmp_path / "report.json"
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=str(report), capture="disabled")
    )
    built, written = threading.Event(), threading.Event()
    build = _report_file.document

    def slow_document(*args: Any) -> _schema.ReportDocument:
        document = build(*args)
        if threading.current_thread() is not threading.main_thread():
            built.set()
            written.wait(timeout=2)
        return document

    monkeypatch.setattr(_report_file, "document", slow_document)
    other = threading.Thread(target=violate, args=(here(),))  # race-a
    other.start()
    assert built.wait(timeout=10)
    violate(here())  # race-b
    written.set()
    other.join(timeout=10)
    function = "test_report_never_goes_back_to_an_older_state"
    document = read_report(report)
    assert (document["totals"], [v["first"]["stack"] for v in document["violations"]]) == (
        {"capture_disabled": 2},
        [[frame("race-a", function)], [frame("race-b", function)]],
    )


KILLED_PROGRAM = (
    PRELUDE
    + """
cgguard.install(
    cgguard.Config(mode="log", log_file=sys.argv[1], report=sys.argv[2], capture="disabled")
)
violate()  # killed
os.kill(os.getpid(), signal.SIGTERM)
"""
)


@pytest.mark.subprocess
def test_a_worker_killed_by_sigterm_leaves_its_report(tmp_path: Path) -> None:
    """No exit handler runs on SIGTERM, yet the report written at the violation is there."""
    program, source = write_program(tmp_path, "killed_program.py", KILLED_PROGRAM)
    log, folder = tmp_path / "events.jsonl", tmp_path / "reports"
    folder.mkdir()
    template = str(folder / "r-{pid}.json")
    result = run_program(program, str(log), template)
    assert (result.returncode, result.stderr) == (-signal.SIGTERM, "")
    child = json.loads(result.stdout)
    first = disabled_event(source.frame("killed", "<module>"), 1)
    first.update(child)
    # No summary in the log: the exit handler did not run.
    assert [stamped(event) for event in read_events(log)] == [first]
    assert os.listdir(folder) == [f"r-{child['pid']}.json"]
    report = read_report(folder / f"r-{child['pid']}.json")
    report["violations"] = [v | {"first": stamped(v["first"])} for v in report["violations"]]
    assert report == report_document(
        config_section(mode="log", log_file=str(log), report=template, capture="disabled"),
        {"capture_disabled": 1},
        [{"rule": "capture_disabled", "count": 1, "first": first}],
        pid=child["pid"],
    )


FORK_PROGRAM = (
    PRELUDE
    + """
import multiprocessing


def child():
    violate()  # forked-child


if __name__ == "__main__":
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=sys.argv[1], capture="disabled")
    )
    violate()  # forking-parent
    worker = multiprocessing.get_context("fork").Process(target=child)
    worker.start()
    worker.join()
    print(json.dumps(worker.pid))
"""
)


@pytest.mark.subprocess
def test_a_forked_worker_reports_only_its_own_violations(tmp_path: Path) -> None:
    """A worker forked after the parent's violation reports its own violation, not the parent's."""
    program, source = write_program(tmp_path, "forking_program.py", FORK_PROGRAM)
    folder = tmp_path / "reports"
    folder.mkdir()
    result = run_program(program, str(folder / "r-{pid}.json"))
    assert (result.returncode, result.stderr) == (0, "")
    worker = json.loads(result.stdout.splitlines()[-1])
    report = read_report(folder / f"r-{worker}.json")
    site = source.frame("forked-child", "child")
    assert (
        report["totals"],
        [(v["count"], v["first"]["stack"][-1]) for v in report["violations"]],
    ) == (
        {"capture_disabled": 1},
        [(1, site)],
    )


# --- many processes -------------------------------------------------------------------------

WORKERS_PROGRAM = (
    PRELUDE
    + """
import multiprocessing


def work(log, report):
    cgguard.install(cgguard.Config(mode="log", log_file=log, report=report, capture="disabled"))
    for _ in range(50):
        violate()  # worker-a
    for _ in range(20):
        violate()  # worker-b
    for _ in range(5):
        violate()  # worker-c


if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=work, args=sys.argv[1:3]) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps([worker.pid for worker in workers]))
    sys.exit(max(worker.exitcode for worker in workers))
"""
)

# One worker's log lines: site a (50) at 1..32, b (20) at 1..16, c (5) at 1, 2, 4; the summary.
WORKER_LINES = (
    [("cgguard.capture_violation", n) for n in (1, 2, 4, 8, 16, 32)]
    + [("cgguard.capture_violation", n) for n in (1, 2, 4, 8, 16)]
    + [("cgguard.capture_violation", n) for n in (1, 2, 4)]
    + [("cgguard.summary", None)]
)


@pytest.mark.subprocess
def test_spawned_workers_share_one_log_file_and_each_write_a_report(tmp_path: Path) -> None:
    """4 spawn workers, one log file: whole JSON lines only, 15 per worker, one report each."""
    program, source = write_program(tmp_path, "workers_program.py", WORKERS_PROGRAM)
    log, folder = tmp_path / "events.jsonl", tmp_path / "reports"
    folder.mkdir()
    result = run_program(program, str(log), str(folder / "r-{pid}.json"))
    assert (result.returncode, result.stderr) == (0, "")
    pids = json.loads(result.stdout.splitlines()[-1])
    events = read_events(log)  # every line parses as JSON
    assert len(events) == 4 * len(WORKER_LINES) == 60
    assert sorted({event["pid"] for event in events}) == sorted(pids)
    a, b, c = (source.frame(marker, "work") for marker in ("worker-a", "worker-b", "worker-c"))
    for pid in pids:
        own = [event for event in events if event["pid"] == pid]
        assert [(event["event"], event.get("count")) for event in own] == WORKER_LINES
        assert stamped(own[-1]) == summary_event(
            {"capture_disabled": 75},
            [summary_site(a, 50), summary_site(b, 20), summary_site(c, 5)],
            pid=pid,
        )
    assert sorted(os.listdir(folder)) == sorted(f"r-{pid}.json" for pid in pids)
    for pid in pids:
        report = read_report(folder / f"r-{pid}.json")
        assert (
            report["pid"],
            report["totals"],
            [(v["count"], v["first"]["stack"][-1]) for v in report["violations"]],
        ) == (pid, {"capture_disabled": 75}, [(50, a), (20, b), (5, c)])


RUNNER_PROGRAM = """\
import json
import multiprocessing
import sys


def work():
    import torch

    import cgguard

    cgguard.set_capture_enabled(False)
    for _ in range(10):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):  # runner-site
            pass


if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=work) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps([worker.pid for worker in workers]))
    sys.exit(max(worker.exitcode for worker in workers))
"""


@pytest.mark.subprocess
@pytest.mark.simulated
def test_the_runner_reports_every_spawned_worker(tmp_path: Path) -> None:
    """cgguard run --mode log --report --log-file: each spawn worker logs and reports its own."""
    program, source = write_program(tmp_path, "runner_program.py", RUNNER_PROGRAM)
    log, folder = tmp_path / "events.jsonl", tmp_path / "reports"
    folder.mkdir()
    template = str(folder / "r-{pid}.json")
    command = [sys.executable, "-m", "cgguard", "run", "--mode", "log", "--report", template]
    command += ["--log-file", str(log), "--simulate-cuda", str(program)]
    result = subprocess.run(
        command, env=child_environ(), capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    pids = json.loads(result.stdout)
    site = source.frame("runner-site", "work")
    events = read_events(log)
    # Per worker: 10 violations at one site (logged at 1, 2, 4, 8), the summary and the
    # census of its 10 captures, which log mode let go ahead.
    assert len(events) == 4 * 6
    for pid in pids:
        own = [event for event in events if event["pid"] == pid]
        assert [(event["event"], event.get("count")) for event in own] == [
            ("cgguard.capture_violation", n) for n in (1, 2, 4, 8)
        ] + [("cgguard.summary", None), ("cgguard.census", None)]
        assert own[0]["stack"][-1] == site
        assert stamped(own[-2]) == summary_event(
            {"capture_disabled": 10}, [summary_site(site, 10)], pid=pid
        )
        totals = own[-1]["totals"]
        assert (totals["captures"], totals["sites"], totals["outcomes"]["ended"]) == (10, 1, 10)
    assert sorted(os.listdir(folder)) == sorted(f"r-{pid}.json" for pid in pids)
    for pid in pids:
        report = read_report(folder / f"r-{pid}.json")
        assert (
            report["pid"],
            report["config"]["report"],
            report["totals"],
            [(v["count"], v["first"]["stack"][-1]) for v in report["violations"]],
        ) == (pid, template, {"capture_disabled": 10}, [(10, site)])


# --- the logging target ---------------------------------------------------------------------


def test_logging_target_logs_a_logged_violation_at_warning(
    cgguard_records: list[logging.LogRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    """log_target="logging": one WARNING record, JSON message, record.cgguard the full event."""
    cgguard.install(cgguard.Config(mode="log", log_target="logging", capture="disabled"))
    with capture_violations() as seen:
        violate(here())  # logging-log
    site = frame("logging-log", "test_logging_target_logs_a_logged_violation_at_warning")
    (record,) = cgguard_records
    assert (record.name, record.levelno) == ("cgguard", logging.WARNING)
    assert stamped(json.loads(record.getMessage())) == disabled_event(site, 1)
    assert record.cgguard == seen[0]  # type: ignore[attr-defined]
    assert stamped(seen[0]) == disabled_event(site, 1)
    assert capsys.readouterr() == ("", "")


def test_logging_target_logs_a_raised_violation_at_error(
    cgguard_records: list[logging.LogRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    """log_target="logging" in raise mode: one ERROR record holding the exception's event."""
    cgguard.install(cgguard.Config(mode="raise", log_target="logging", capture="disabled"))
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        violate(here())  # logging-raise
    site = frame("logging-raise", "test_logging_target_logs_a_raised_violation_at_error")
    (record,) = cgguard_records
    assert (record.name, record.levelno) == ("cgguard", logging.ERROR)
    assert stamped(json.loads(record.getMessage())) == disabled_event(site, 1, action="raised")
    assert record.cgguard == raised.value.event  # type: ignore[attr-defined]
    assert capsys.readouterr() == ("", "")


LOGGING_PROGRAM = (
    PRELUDE
    + """
import logging

logging.basicConfig(stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
cgguard.install(cgguard.Config.from_environ())
violate()  # logging-program
"""
)


@pytest.mark.subprocess
def test_logging_target_from_the_environment_carries_the_summary(tmp_path: Path) -> None:
    """CGGUARD_LOG_TARGET=logging: the violation and the exit summary go to logging at WARNING."""
    program, source = write_program(tmp_path, "logging_program.py", LOGGING_PROGRAM)
    env = child_environ(
        CGGUARD_MODE="log", CGGUARD_LOG_TARGET="logging", CGGUARD_CAPTURE="disabled"
    )
    result = run_program(program, env=env)
    assert (result.returncode, result.stderr) == (0, "")
    pid_line, *lines = result.stdout.splitlines()
    child = json.loads(pid_line)
    site = source.frame("logging-program", "<module>")
    records = [line.split(" ", 2) for line in lines]
    assert [(name, level, stamped(json.loads(message))) for name, level, message in records] == [
        ("cgguard", "WARNING", disabled_event(site, 1, **child)),
        (
            "cgguard",
            "WARNING",
            summary_event({"capture_disabled": 1}, [summary_site(site, 1)], pid=child["pid"]),
        ),
    ]


# --- a report that never damages anything, and stays true ----------------------------------


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_report_path_that_is_not_a_regular_file_is_left_alone(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO or a symlink at the report path is never replaced: one warning, no write."""
    path, target = tmp_path / "report.json", tmp_path / "elsewhere.txt"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        target.write_text("the link's target\n")
        path.symlink_to(target)
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=str(path), capture="disabled")
    )
    violate(here())
    cgguard.uninstall()
    kept = path.is_fifo() if kind == "fifo" else path.is_symlink()
    assert (kept, sorted(p.name for p in tmp_path.iterdir())) == (
        True,
        sorted({"report.json", *(["elsewhere.txt"] if kind == "symlink" else [])}),
    )
    if kind == "symlink":
        assert target.read_text() == "the link's target\n"
    assert capsys.readouterr().err == (
        f"cgguard: not writing the report {str(path)!r}: it is not a regular file\n"
    )


def test_a_relative_report_path_is_resolved_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative report path names one file, wherever the program moves afterwards."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report="r.json", capture="disabled")
    )
    violate(here())
    monkeypatch.chdir(second)
    violate(here())  # another site, written after the move
    cgguard.uninstall()
    assert (os.listdir(first), os.listdir(second)) == (["r.json"], [])
    assert read_report(first / "r.json")["totals"] == {"capture_disabled": 2}


def test_counts_reach_the_report_within_a_second(tmp_path: Path) -> None:
    """Repeats at a known site are on disk within a second, with no exit and no new site."""
    report = tmp_path / "report.json"
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=str(report), capture="disabled")
    )
    stack = here()
    for _ in range(50):
        violate(stack)
    # Half a second is the promise; the margin is for a loaded machine. Nothing else happens
    # here that could write the report: no new site, no exit, no uninstall.
    document = report_when(report, {"capture_disabled": 50}, timeout=10)
    assert (document["totals"], document["violations"][0]["count"]) == (
        {"capture_disabled": 50},
        50,
    )


def test_the_capturing_thread_stops_writing_once_the_report_is_large(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the first sites, new sites are written by cgguard's own thread: the capturing
    thread's cost for a new site does not grow with the sites already seen."""
    # A smaller threshold than the real one, for speed: the behaviour is the same.
    WRITTEN_AT_ONCE = 16  # noqa: N806 - stands for the module's constant
    monkeypatch.setattr(_report_file, "WRITTEN_AT_ONCE", WRITTEN_AT_ONCE)
    report = tmp_path / "report.json"
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=str(report), capture="disabled")
    )
    built_here: list[int] = []
    build = _report_file.document

    def counted(*args: Any) -> _schema.ReportDocument:
        if threading.current_thread() is threading.main_thread():
            built_here.append(1)
        return build(*args)

    monkeypatch.setattr(_report_file, "document", counted)
    sites = WRITTEN_AT_ONCE * 4
    code = here()[0]
    for n in range(sites):
        violate((code, 2 * n))  # a site per instruction of this function
    assert len(built_here) == WRITTEN_AT_ONCE
    assert report_when(report, {"capture_disabled": sites})["totals"] == {"capture_disabled": sites}


def test_a_process_without_violations_keeps_its_run_s_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report holding the violations of another process of the same run (a path without
    {pid}) is not replaced by an empty one at exit or uninstall."""
    from cgguard._reporting.report_file import OWNER

    report = tmp_path / "report.json"
    held = {"pid": 1, "job": "0123abcd", "totals": {"nested_capture": 3}, "violations": [{}]}
    report.write_text(json.dumps(held))
    monkeypatch.setenv(OWNER, f"1:0123abcd:{report}")  # as process 1 of that run left it
    cgguard.install(cgguard.Config(log_file=os.devnull, report=str(report)))
    cgguard.uninstall()
    assert json.loads(report.read_text()) == held
    assert "write the same file" in capsys.readouterr().err


def test_the_report_is_written_at_install(tmp_path: Path) -> None:
    """A process guarded with a report has one on disk from the start, before any violation or
    exit handler: a worker ended without exit handlers still shows that it was guarded."""
    template = str(tmp_path / "r-{pid}.json")
    cgguard.install(cgguard.Config(log_file=os.devnull, report=template))
    assert read_report(tmp_path / f"r-{os.getpid()}.json") == report_document(
        config_section(log_file=os.devnull, report=template), {}, []
    )


def test_a_later_run_replaces_an_earlier_run_s_report(tmp_path: Path) -> None:
    """A report left by an earlier run is replaced, even by a run without violations."""
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"pid": 1, "job": "0123abcd", "violations": [{}]}))
    cgguard.install(cgguard.Config(log_file=os.devnull, report=str(report)))
    cgguard.uninstall()
    document = read_report(report)
    assert (document["pid"], document["violations"], document["job"] != "0123abcd") == (
        os.getpid(),
        [],
        True,
    )


REEXEC_PROGRAM = (
    PRELUDE
    + """
cgguard.install(cgguard.Config(mode="log", log_file=os.devnull, report=sys.argv[1]))
if len(sys.argv) == 2:
    cgguard.set_capture_enabled(False)
    violate()  # before-exec
    cgguard.uninstall()
    os.execv(sys.executable, [sys.executable, __file__, sys.argv[1], "again"])
"""
)


@pytest.mark.subprocess
def test_a_program_that_re_executes_itself_keeps_its_report(tmp_path: Path) -> None:
    """Same pid, same run, a new image without violations: the report keeps the violation."""
    program, _ = write_program(tmp_path, "reexec_program.py", REEXEC_PROGRAM)
    report = tmp_path / "report.json"
    result = run_program(program, str(report))
    assert (result.returncode, result.stderr) == (0, "")
    assert read_report(report)["totals"] == {"capture_disabled": 1}


KILLED_AFTER_REPEATS = (
    PRELUDE
    + """
import time

cgguard.install(
    cgguard.Config(mode="log", log_file=os.devnull, report=sys.argv[1], capture="disabled")
)
for _ in range(50):
    violate()  # repeated
# Until cgguard's own thread has written the counts (half a second is the promise; ten is the
# limit on a loaded machine), then killed without any exit handler.
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        with open(sys.argv[1]) as report:
            if json.load(report)["totals"] == {"capture_disabled": 50}:
                break
    except (OSError, ValueError):
        pass
    time.sleep(0.02)
os.kill(os.getpid(), signal.SIGTERM)
"""
)


@pytest.mark.subprocess
def test_a_killed_worker_s_report_holds_its_counts(tmp_path: Path) -> None:
    """50 violations, then SIGTERM with no exit handler: the report holds all 50, written by
    cgguard's own thread while the program ran, not just the first."""
    program, _ = write_program(tmp_path, "repeating_program.py", KILLED_AFTER_REPEATS)
    report = tmp_path / "report.json"
    result = run_program(program, str(report))
    assert (result.returncode, result.stderr) == (-signal.SIGTERM, "")
    document = read_report(report)
    assert (document["totals"], [v["count"] for v in document["violations"]]) == (
        {"capture_disabled": 50},
        [50],
    )


def test_identical_helpers_in_two_files_are_two_sites(tmp_path: Path) -> None:
    """The same helper vendored by two packages: code objects equal by content, yet two sites,
    each under its own file."""
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull, capture="disabled"))
    source = "def helper(violate, snapshot):\n    violate(snapshot(0)[:2])\n"
    helpers = []
    for package in ("vendor_a", "vendor_b"):
        namespace: dict[str, Any] = {}
        filename = str(tmp_path / package / "helper.py")
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - two copies of one helper
        helpers.append((filename, namespace["helper"]))
    assert helpers[0][1].__code__ == helpers[1][1].__code__  # why a site is keyed by identity
    for _, helper in helpers:
        helper(violate, snapshot)
    assert [
        (s.count, s.code.co_filename if s.code else None) for s in run_seen().ledger.sites()
    ] == [
        (1, helpers[0][0]),
        (1, helpers[1][0]),
    ]


def test_switching_to_a_new_report_path_writes_it_at_once(tmp_path: Path) -> None:
    """install(Config(report=B)) after violations reported to A: B holds them at once."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=str(first), capture="disabled")
    )
    violate(here())
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=str(second), capture="disabled")
    )
    assert read_report(second)["totals"] == {"capture_disabled": 1}


def test_no_thread_to_be_had_writes_the_report_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where no thread can be started (a container's process limit), the report is written by
    the capturing thread, one line says so, and uninstall() still works."""
    from cgguard._reporting import report_file as report_module

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(report_module, "WRITTEN_AT_ONCE", 0)
    monkeypatch.setattr(threading.Thread, "start", no_thread)
    report = tmp_path / "report.json"
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=str(report), capture="disabled")
    )
    violate(here())
    assert read_report(report)["totals"] == {"capture_disabled": 1}
    violate(here())
    cgguard.uninstall()
    assert read_report(report)["totals"] == {"capture_disabled": 2}
    assert capsys.readouterr().err == (
        "cgguard: the report is written in place: can't start new thread\n"
    )


MANY_SITES_WORKER = (
    PRELUDE
    + """
import multiprocessing

from cgguard._reporting import report_file as _report_file


def child():
    for _ in range(40):
        violate()  # one site, counted forty times
    code, end = child.__code__, len(child.__code__.co_code)
    # Thirty sites more, past what the capturing thread writes itself: offsets past the end of
    # child's own instructions, so that none is the violate() call's on any Python's bytecode.
    for n in range(30):
        check((code, end + 2 * n))


if __name__ == "__main__":
    _report_file.WRITTEN_AT_ONCE = 4
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=sys.argv[1], capture="disabled")
    )
    worker = multiprocessing.get_context("fork").Process(target=child)
    worker.start()
    worker.join()
    print(json.dumps(worker.pid))
"""
)


@pytest.mark.subprocess
def test_a_multiprocessing_worker_s_report_is_complete_when_it_ends(tmp_path: Path) -> None:
    """A multiprocessing worker ends with os._exit, past every exit handler: its report is
    written a last time by multiprocessing's own finalizers, every site and count in it."""
    program, _ = write_program(tmp_path, "many_sites_worker.py", MANY_SITES_WORKER)
    folder = tmp_path / "reports"
    folder.mkdir()
    result = run_program(program, str(folder / "r-{pid}.json"))
    assert (result.returncode, result.stderr) == (0, "")
    worker = json.loads(result.stdout.splitlines()[-1])
    document = read_report(folder / f"r-{worker}.json")
    assert (document["totals"], len(document["violations"])) == ({"capture_disabled": 70}, 31)


# --- the report's text ----------------------------------------------------------------------

KERNEL = "def kernel(violate, snapshot):\n    violate(snapshot(0)[:2])\n"


def exempted_event(site: dict[str, Any], exemption: str, **context: object) -> dict[str, Any]:
    """The first capture_exempted event at ``site`` (without its timestamp), capture disabled
    by config."""
    return {
        "event": "cgguard.capture_exempted",
        "level": "debug",
        "rule": "capture_disabled",
        "action": "exempted",
        "api": API,
        "message": f"capture_disabled exempted by {exemption} (matched {where(site)}): "
        f"{API} at {where(site)}",
        "exemption": exemption,
        "matched": site,
        "count": 1,
        "thread": "MainThread",
        "thread_id": threading.get_ident(),
        "pid": os.getpid(),
        "stack": [site],
        **context,
    }


def test_the_report_file_is_json_of_its_document_at_every_write(tmp_path: Path) -> None:
    """At each write, the report's text is exactly what json.dumps(..., indent=2) writes of
    the document the spec describes: counts current, sites first seen first, exempted too,
    strings escaped (a file name with a quote, a backslash and non-ASCII letters)."""
    folder = tmp_path / 'vendör "q" \\ x'
    folder.mkdir()
    (folder / "kernel.py").write_text(KERNEL)
    namespace: dict[str, Any] = {}
    exec(compile(KERNEL, str(folder / "kernel.py"), "exec"), namespace)  # noqa: S102 - fixed
    kernel = namespace["kernel"]
    exemption = "capture_disabled=*/vendör*/kernel.py"
    report = tmp_path / "report.json"
    cgguard.install(
        cgguard.Config(
            mode="log",
            log_file=os.devnull,
            report=str(report),
            capture="disabled",
            exempt=[exemption],
        )
    )
    config = config_section(
        mode="log", log_file=os.devnull, report=str(report), capture="disabled", exempt=[exemption]
    )
    function = "test_the_report_file_is_json_of_its_document_at_every_write"
    a, b, c = (frame(f"text-{name}", function) for name in "abc")
    k = {"file": str(folder / "kernel.py"), "line": 2, "function": "kernel"}
    k["code"] = "violate(snapshot(0)[:2])"
    seen = []

    def written() -> dict[str, Any]:
        """The report as on disk now, checked to be json.dumps's text of what it holds."""
        text = report.read_text()
        held = json.loads(text)
        assert text == json.dumps(held, indent=2) + "\n"
        document = stamped(held, "written_at")
        assert re.fullmatch("[0-9a-f]{16}", document.pop("job"))
        document.pop("captures")  # the census's, checked in tests/test_census.py
        document.pop("cudagraph_skips")
        for key in ("violations", "exempted"):
            document[key] = [v | {"first": stamped(v["first"])} for v in document[key]]
        return document

    for _ in range(2):
        violate(here())  # text-a
    violate(here())  # text-b
    seen.append(written())
    kernel(violate, snapshot)
    at_c = here()  # text-c
    violate(at_c)
    seen.append(written())
    violate(at_c)  # a count only, written by cgguard's own thread or at uninstall
    cgguard.uninstall()
    seen.append(written())
    exempted = [{"rule": "capture_disabled", "count": 1, "exemption": exemption}]
    exempted[0]["first"] = exempted_event(k, exemption)
    assert seen == [
        report_document(
            config,
            {"capture_disabled": 3},
            [
                {"rule": "capture_disabled", "count": 2, "first": disabled_event(a, 1)},
                {"rule": "capture_disabled", "count": 1, "first": disabled_event(b, 1)},
            ],
        ),
        report_document(
            config,
            {"capture_disabled": 4},
            [
                {"rule": "capture_disabled", "count": 2, "first": disabled_event(a, 1)},
                {"rule": "capture_disabled", "count": 1, "first": disabled_event(b, 1)},
                {"rule": "capture_disabled", "count": 1, "first": disabled_event(c, 1)},
            ],
            exempted_totals={"capture_disabled": 1},
            exempted=exempted,
        ),
        report_document(
            config,
            {"capture_disabled": 5},
            [
                {"rule": "capture_disabled", "count": 2, "first": disabled_event(a, 1)},
                {"rule": "capture_disabled", "count": 1, "first": disabled_event(b, 1)},
                {"rule": "capture_disabled", "count": 2, "first": disabled_event(c, 1)},
            ],
            exempted_totals={"capture_disabled": 1},
            exempted=exempted,
        ),
    ]


def test_a_new_site_costs_the_report_the_same_however_many_came_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new site's write encodes that site, not every site before it again: the 60th new
    site costs the report as much JSON encoding as the 10th, give or take a few digits."""
    # Every new site written at once, on this thread: each write is one new site's.
    monkeypatch.setattr(_report_file, "WRITTEN_AT_ONCE", 1_000)
    report = tmp_path / "report.json"
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=str(report), capture="disabled")
    )
    encoded = [0]  # characters of JSON encoded with an indent: the report's, not the log's
    encode = json.JSONEncoder.encode

    def counted(self: json.JSONEncoder, value: object) -> str:
        text = encode(self, value)
        if self.indent is not None:
            encoded[0] += len(text)
        return text

    monkeypatch.setattr(json.JSONEncoder, "encode", counted)
    code = here()[0]
    per_site = []
    for n in range(60):
        before = encoded[0]
        violate((code, 2 * n))  # a site per instruction of this function
        per_site.append(encoded[0] - before)
    cgguard.uninstall()
    assert len(read_report(report)["violations"]) == 60
    # Each write encodes the new site's entry and the document's few other values.
    assert min(per_site) > 500
    assert max(per_site[10:]) - min(per_site[:10]) < 100, per_site


def test_the_writing_thread_rests_after_a_write_and_uninstall_ends_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a write, cgguard's own thread rests before it writes a new site (here a minute
    long), and uninstall() ends the rest at once: the thread is gone, the report complete."""
    monkeypatch.setattr(_report_file, "WRITTEN_AT_ONCE", 0)  # every new site to the thread
    monkeypatch.setattr(_report_file, "INTERVAL", 60.0)
    monkeypatch.setattr(_report_file, "REST", 10**9)  # any write's rest: the whole INTERVAL
    report = tmp_path / "report.json"
    cgguard.install(
        cgguard.Config(mode="log", log_file=os.devnull, report=str(report), capture="disabled")
    )
    assert _process.PROCESS.installation is not None
    writer = _process.PROCESS.installation.reporter.report
    assert writer is not None
    code = here()[0]
    violate((code, 0))
    totals = [report_when(report, {"capture_disabled": 1})["totals"]]
    violate((code, 2))
    time.sleep(0.5)  # time enough to write, were the thread not resting
    totals.append(read_report(report)["totals"])
    thread = writer._thread
    assert thread is not None
    cgguard.uninstall()
    totals.append(read_report(report)["totals"])
    assert (totals, thread.is_alive()) == (
        [{"capture_disabled": 1}, {"capture_disabled": 1}, {"capture_disabled": 2}],
        False,
    )
