"""``cgguard report``: a job's reports merged per rule and site, and one line per process; bad
paths refused with one line and status 2."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
from helpers import SourceFile, clean_environ

from cgguard._commands.main import main
from cgguard._commands.report import merge, render_json

if TYPE_CHECKING:
    from pathlib import Path

DISABLED = (
    "CUDA graph capturing detected at an inappropriate time. This operation is currently disabled."
)


def frame(file: str, line: int, function: str, code: str) -> dict[str, Any]:
    return {"file": file, "line": line, "function": function, "code": code}


TRAIN = frame("/job/train.py", 40, "step", "with torch.cuda.graph(g):")
OFF = frame("/job/train.py", 12, "serve", "cgguard.set_capture_enabled(False)")
INNER = frame("/job/fused.py", 7, "fuse", "with torch.cuda.graph(h):")
OUTER = frame("/job/train.py", 39, "step", "with torch.cuda.graph(g):")
MAIN = frame("/job/train.py", 90, "<module>", "main()")


def disabled_event(pid: int, rank: int, timestamp: str) -> dict[str, Any]:
    return {
        "event": "cgguard.capture_violation",
        "level": "warning",
        "rule": "capture_disabled",
        "action": "logged",
        "api": "torch.cuda.graph",
        "message": f"{DISABLED} torch.cuda.graph at /job/train.py:40 (in step) began a capture; "
        "capture was disabled at /job/train.py:12 (in serve).",
        "count": 1,
        "thread": "MainThread",
        "thread_id": 140000000000001,
        "pid": pid,
        "rank": rank,
        "timestamp": timestamp,
        "stack": [MAIN, TRAIN],
        "disabled_stack": [MAIN, OFF],
    }


def nested_event(pid: int, rank: int, timestamp: str) -> dict[str, Any]:
    return {
        "event": "cgguard.capture_violation",
        "level": "error",
        "rule": "nested_capture",
        "action": "raised",
        "api": "torch.cuda.graph",
        "message": "Nested CUDA graph capture is not supported: torch.cuda.graph at "
        "/job/fused.py:7 (in fuse) began a capture while this thread's capture begun at "
        "/job/train.py:39 (in step) via torch.cuda.graph is still active.",
        "count": 1,
        "thread": "MainThread",
        "thread_id": 140000000000002,
        "pid": pid,
        "rank": rank,
        "timestamp": timestamp,
        "stack": [MAIN, INNER],
        "outer_stack": [MAIN, OUTER],
    }


def document(
    pid: int, violations: list[dict[str, Any]], host: str | None = "node-a", **keys: Any
) -> dict[str, Any]:
    """A report as cgguard writes it, with its ranks or other ``keys``; ``host=None`` for one
    written before reports had it."""
    totals: dict[str, int] = {}
    for violation in violations:
        totals[violation["rule"]] = totals.get(violation["rule"], 0) + violation["count"]
    head: dict[str, Any] = {"cgguard": "0.1.0", "python": "3.11.9", "torch": "2.13.0"}
    if host is not None:
        head["host"] = host
    return {
        **head,
        "pid": pid,
        "written_at": "2026-12-01T05:00:09.000000Z",
        "config": {"mode": "log"},
        "totals": totals,
        "violations": violations,
        **keys,
    }


def write(folder: Path, name: str, content: dict[str, Any] | str) -> Path:
    path = folder / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A four-process job on two hosts: ranks 0 and 1 violate, rank 2 and the launcher do not."""
    folder = tmp_path / "reports"
    folder.mkdir()
    rank0 = document(
        101,
        [
            {
                "rule": "capture_disabled",
                "count": 3,
                "first": disabled_event(101, 0, "2026-12-01T05:00:02.000000Z"),
            },
            {
                "rule": "nested_capture",
                "count": 1,
                "first": nested_event(101, 0, "2026-12-01T05:00:03.000000Z"),
            },
        ],
        rank=0,
        local_rank=0,
        world_size=3,
    )
    rank1 = document(
        201,
        [
            {
                "rule": "capture_disabled",
                "count": 2,
                # Earlier than rank 0's: its stacks are the ones shown.
                "first": disabled_event(201, 1, "2026-12-01T05:00:01.000000Z"),
            }
        ],
        host="node-b",
        rank=1,
        local_rank=0,
        world_size=3,
    )
    rank2 = document(202, [], host="node-b", rank=2, local_rank=1, world_size=3)
    launcher = document(100, [], host=None)
    for name, content in (
        ("r-101.json", rank0),
        ("r-201.json", rank1),
        ("r-202.json", rank2),
        ("r-100.json", launcher),
    ):
        write(folder, name, content)
    return folder


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["report", *args])
    out, err = capsys.readouterr()
    return status, out, err


def expected_json(folder: Path) -> dict[str, Any]:
    return {
        "reports": 4,
        "hosts": ["node-a", "node-b", None],
        "jobs": [],
        "written": {"first": "2026-12-01T05:00:09.000000Z", "last": "2026-12-01T05:00:09.000000Z"},
        "totals": {"capture_disabled": 5, "nested_capture": 1},
        "actions": {"raised": 1, "logged": 5},
        "violations": [
            {
                "rule": "capture_disabled",
                "api": "torch.cuda.graph",
                "site": TRAIN,
                "count": 5,
                "actions": {"raised": 0, "logged": 5},
                "processes": [
                    {"host": "node-a", "pid": 101, "rank": 0, "count": 3},
                    {"host": "node-b", "pid": 201, "rank": 1, "count": 2},
                ],
                "first": disabled_event(201, 1, "2026-12-01T05:00:01.000000Z"),
            },
            {
                "rule": "nested_capture",
                "api": "torch.cuda.graph",
                "site": INNER,
                "count": 1,
                "actions": {"raised": 1, "logged": 0},
                "processes": [{"host": "node-a", "pid": 101, "rank": 0, "count": 1}],
                "first": nested_event(101, 0, "2026-12-01T05:00:03.000000Z"),
            },
        ],
        "exempted_totals": {},
        "exempted": [],
        # No report of this job holds a census.
        "captures": [],
        "cudagraph_skips": [],
        "slowest_capturing": None,
        # No report holds a capture manifest: no rank to compare (docs/ranks.md).
        "ranks": None,
        "processes": [
            {
                "host": "node-a",
                "pid": 101,
                "rank": 0,
                "local_rank": 0,
                "world_size": 3,
                "job": None,
                "violations": 4,
                "totals": {"capture_disabled": 3, "nested_capture": 1},
                "actions": {"raised": 1, "logged": 3},
                "exempted": 0,
                "exempted_totals": {},
                "report": str(folder / "r-101.json"),
                "written_at": "2026-12-01T05:00:09.000000Z",
            },
            {
                "host": "node-b",
                "pid": 201,
                "rank": 1,
                "local_rank": 0,
                "world_size": 3,
                "job": None,
                "violations": 2,
                "totals": {"capture_disabled": 2},
                "actions": {"raised": 0, "logged": 2},
                "exempted": 0,
                "exempted_totals": {},
                "report": str(folder / "r-201.json"),
                "written_at": "2026-12-01T05:00:09.000000Z",
            },
            {
                "host": "node-b",
                "pid": 202,
                "rank": 2,
                "local_rank": 1,
                "world_size": 3,
                "job": None,
                "violations": 0,
                "totals": {},
                "actions": {"raised": 0, "logged": 0},
                "exempted": 0,
                "exempted_totals": {},
                "report": str(folder / "r-202.json"),
                "written_at": "2026-12-01T05:00:09.000000Z",
            },
            {
                "host": None,
                "pid": 100,
                "rank": None,
                "local_rank": None,
                "world_size": None,
                "job": None,
                "violations": 0,
                "totals": {},
                "actions": {"raised": 0, "logged": 0},
                "exempted": 0,
                "exempted_totals": {},
                "report": str(folder / "r-100.json"),
                "written_at": "2026-12-01T05:00:09.000000Z",
            },
        ],
        "skipped": [],
        "same_process": [],
    }


def test_json_merges_sites_across_processes_and_lists_every_process(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per rule and site: the sum, each process's count, the earliest first event; every
    process, those without a violation and an old report without a host included."""
    status, out, err = run(capsys, "--format", "json", str(job))
    assert (status, json.loads(out), err) == (1, expected_json(job), "")


def test_text_names_sites_processes_and_stacks(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The text view: a headline, each site with its processes and first stacks, then one line
    per process."""
    status, out, err = run(capsys, str(job))
    assert (status, err) == (1, "")
    assert out.splitlines() == [
        "cgguard report: 4 processes on 3 hosts: 6 violations at 2 sites (1 raised, 5 logged)",
        "reports written at 2026-12-01T05:00:09.000000Z",
        "",
        "capture_disabled at /job/train.py:40 (in step): 5 in 2 processes (5 logged)",
        "  node-a pid 101 rank 0: 3",
        "  node-b pid 201 rank 1: 2",
        f"  {DISABLED} torch.cuda.graph at /job/train.py:40 (in step) began a capture; capture "
        "was disabled at /job/train.py:12 (in serve).",
        "  The capture was attempted at (most recent call last):",
        '    File "/job/train.py", line 90, in <module>',
        "      main()",
        '    File "/job/train.py", line 40, in step',
        "      with torch.cuda.graph(g):",
        "",
        "  Capture was disabled at (most recent call last):",
        '    File "/job/train.py", line 90, in <module>',
        "      main()",
        '    File "/job/train.py", line 12, in serve',
        "      cgguard.set_capture_enabled(False)",
        "",
        "nested_capture at /job/fused.py:7 (in fuse): 1 in 1 process (1 raised)",
        "  node-a pid 101 rank 0: 1",
        "  Nested CUDA graph capture is not supported: torch.cuda.graph at /job/fused.py:7 "
        "(in fuse) began a capture while this thread's capture begun at /job/train.py:39 "
        "(in step) via torch.cuda.graph is still active.",
        "  The capture was attempted at (most recent call last):",
        '    File "/job/train.py", line 90, in <module>',
        "      main()",
        '    File "/job/fused.py", line 7, in fuse',
        "      with torch.cuda.graph(h):",
        "",
        "  The outer capture began at (most recent call last):",
        '    File "/job/train.py", line 90, in <module>',
        "      main()",
        '    File "/job/train.py", line 39, in step',
        "      with torch.cuda.graph(g):",
        "",
        "processes:",
        "  node-a pid 101  rank 0 local_rank 0 world_size 3  capture_disabled 3, "
        f"nested_capture 1 (1 raised, 3 logged)  {job / 'r-101.json'}",
        f"  node-b pid 201  rank 1 local_rank 0 world_size 3  capture_disabled 2 (2 logged)  "
        f"{job / 'r-201.json'}",
        f"  node-b pid 202  rank 2 local_rank 1 world_size 3  no violation  {job / 'r-202.json'}",
        f"  unknown host pid 100  no violation  {job / 'r-100.json'}",
    ]


def table(lines: list[str], heading: str) -> list[list[str]]:
    """The rows of the Markdown table under ``heading``, split on unescaped bars."""
    start = lines.index(heading) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells, cell, escaped = [], "", False
        for char in line.strip()[1:-1]:
            if escaped:
                cell, escaped = cell + char, False
            elif char == "\\":
                escaped = True
            elif char == "|":
                cells.append(cell.strip())
                cell = ""
            else:
                cell += char
        rows.append([*cells, cell.strip()])
    return rows


def test_markdown_tables_parse(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Markdown: a violations table, each site's message and stacks fenced, a processes
    table."""
    write(job, "r-303.json", document(303, [], host="node|c", rank=3))
    status, out, err = run(capsys, "--format", "Markdown", str(job))
    assert (status, err) == (1, "")
    lines = out.splitlines()
    assert lines[:3] == [
        "# cgguard report",
        "",
        "5 processes on 4 hosts: 6 violations at 2 sites (1 raised, 5 logged).",
    ]
    assert table(lines, "## Violations") == [
        ["rule", "site", "count", "raised", "logged", "processes"],
        ["---"] * 6,
        [
            "capture_disabled",
            "/job/train.py:40 (in step)",
            "5",
            "0",
            "5",
            "node-a pid 101 rank 0 (3), node-b pid 201 rank 1 (2)",
        ],
        [
            "nested_capture",
            "/job/fused.py:7 (in fuse)",
            "1",
            "1",
            "0",
            "node-a pid 101 rank 0 (1)",
        ],
    ]
    assert table(lines, "## Processes") == [
        [
            "host",
            "pid",
            "rank",
            "local_rank",
            "world_size",
            "violations",
            "raised",
            "logged",
            "exempted",
            "report",
        ],
        ["---"] * 10,
        ["node-a", "101", "0", "0", "3", "4", "1", "3", "0", str(job / "r-101.json")],
        ["node-b", "201", "1", "0", "3", "2", "0", "2", "0", str(job / "r-201.json")],
        ["node-b", "202", "2", "1", "3", "0", "0", "0", "0", str(job / "r-202.json")],
        ["node|c", "303", "3", "", "", "0", "0", "0", "0", str(job / "r-303.json")],
        ["unknown host", "100", "", "", "", "0", "0", "0", "0", str(job / "r-100.json")],
    ]
    section = lines.index("### nested\\_capture at /job/fused.py:7 (in fuse)")
    assert lines[section + 2 : section + 14] == [
        "```text",
        "Nested CUDA graph capture is not supported: torch.cuda.graph at /job/fused.py:7 "
        "(in fuse) began a capture while this thread's capture begun at /job/train.py:39 "
        "(in step) via torch.cuda.graph is still active.",
        "The capture was attempted at (most recent call last):",
        '  File "/job/train.py", line 90, in <module>',
        "    main()",
        '  File "/job/fused.py", line 7, in fuse',
        "    with torch.cuda.graph(h):",
        "",
        "The outer capture began at (most recent call last):",
        '  File "/job/train.py", line 90, in <module>',
        "    main()",
        '  File "/job/train.py", line 39, in step',
    ]


def test_no_violation_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job whose processes saw no violation passes the gate, and says which were guarded."""
    write(tmp_path, "a.json", document(7, [], rank=0))
    write(tmp_path, "b.json", document(8, [], rank=1))
    status, out, err = run(capsys, "--format", "TEXT", str(tmp_path))
    assert (status, out, err) == (
        0,
        "cgguard report: 2 processes on 1 host: no violation\n"
        "reports written at 2026-12-01T05:00:09.000000Z\n\nprocesses:\n"
        f"  node-a pid 7  rank 0  no violation  {tmp_path / 'a.json'}\n"
        f"  node-a pid 8  rank 1  no violation  {tmp_path / 'b.json'}\n",
        "",
    )


def test_files_folders_and_globs_each_read_once(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file named directly, through its folder and through a glob counts once."""
    pattern = str(job.parent / "*" / "r-20?.json")
    status, out, _ = run(capsys, "--format", "json", str(job / "r-101.json"), pattern, str(job))
    merged = json.loads(out)
    assert (status, merged["reports"], [p["pid"] for p in merged["processes"]]) == (
        1,
        4,
        [101, 201, 202, 100],
    )


def test_a_glob_selects_its_matches_only(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A glob reads what it matches, a recursive ** included."""
    status, out, _ = run(capsys, "--format", "json", str(job.parent / "**" / "r-20*.json"))
    merged = json.loads(out)
    assert (status, [p["pid"] for p in merged["processes"]], merged["totals"]) == (
        1,
        [201, 202],
        {"capture_disabled": 2},
    )


REPORT = document(9, [])


def violating(**first: Any) -> dict[str, Any]:
    """A report of one violation whose first event is changed by ``first`` (None: removed)."""
    event = disabled_event(9, 0, "2026-12-01T05:00:01.000000Z")
    event.update(first)
    event = {key: value for key, value in event.items() if value is not None}
    return document(9, [{"rule": "capture_disabled", "count": 1, "first": event}])


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(
            "{",
            "not JSON (Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1))",
            id="not JSON",
        ),
        pytest.param("[]", "an object expected, found a list", id="a list"),
        pytest.param({"pid": 1}, 'no "cgguard"', id="no version"),
        pytest.param(
            {**REPORT, "pid": "9"}, "pid: a whole number expected, found text", id="pid as text"
        ),
        pytest.param(
            {**REPORT, "host": 3}, "host: text expected, found a whole number", id="host a number"
        ),
        pytest.param(
            {**REPORT, "rank": [0]},
            "rank: a whole number or text expected, found a list",
            id="rank",
        ),
        pytest.param(
            {**REPORT, "python": 3}, "python: text expected, found a whole number", id="python"
        ),
        pytest.param(
            {**REPORT, "totals": {"x": "1"}},
            "totals['x']: a whole number of 0 or more expected, found text",
            id="totals",
        ),
        pytest.param(
            {**REPORT, "totals": {"x": -2}},
            "totals['x']: a whole number of 0 or more expected, found -2",
            id="negative total",
        ),
        pytest.param(
            {**REPORT, "violations": {}},
            "violations: a list expected, found an object",
            id="violations",
        ),
        pytest.param(
            {**REPORT, "violations": [{"rule": "capture_disabled", "count": 0, "first": {}}]},
            "violations[0].count: a whole number of 1 or more expected, found 0",
            id="count zero",
        ),
        pytest.param(
            {**REPORT, "violations": [{"rule": "capture_disabled", "count": 1, "first": {}}]},
            'violations[0].first: no "event"',
            id="not an event",
        ),
        pytest.param(
            violating(thread=None), 'violations[0].first: no "thread"', id="event without thread"
        ),
        pytest.param(
            violating(stack=[{"file": "a.py", "line": 1, "function": "f"}]),
            'violations[0].first.stack[0]: no "code"',
            id="frame without code",
        ),
        pytest.param(
            violating(disabled_stack=[1]),
            "violations[0].first.disabled_stack[0]: an object expected, found a whole number",
            id="cause not frames",
        ),
        pytest.param(
            {**REPORT, "schema": "1"},
            "schema: a whole number of 1 or more expected, found text",
            id="schema as text",
        ),
        pytest.param(
            {**REPORT, "schema": 3},
            "of report schema 3, which this cgguard cannot read (it reads schema 2)",
            id="a later schema",
        ),
    ],
)
def test_a_file_that_is_not_a_report_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Any, reason: str
) -> None:
    """Not JSON, or not the report's schema: status 2 and one line naming the file."""
    good = write(tmp_path, "good.json", document(1, []))
    bad = write(tmp_path, "bad.json", content)
    assert run(capsys, str(good), str(bad)) == (
        2,
        "",
        f"cgguard report: '{bad}': not a cgguard report: {reason}\n",
    )


def test_paths_that_name_no_report_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Missing, unreadable, an empty folder, a glob matching nothing, text that is not UTF-8."""
    empty = tmp_path / "empty"
    empty.mkdir()
    unreadable = tmp_path / "full" / "dir.json"  # a folder named like a report
    unreadable.mkdir(parents=True)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{")
    cases = {
        str(tmp_path / "missing.json"): "no such file or folder",
        str(empty): "a folder with no cgguard report (*.json)",
        str(tmp_path / "nothing-*.json"): "no file matches this pattern",
        str(binary): "not a cgguard report: not UTF-8 text",
    }
    for path, reason in cases.items():
        assert run(capsys, path) == (2, "", f"cgguard report: '{path}': {reason}\n"), path
    assert run(capsys, str(unreadable.parent)) == (
        2,
        "",
        f"cgguard report: '{unreadable}': not a regular file (a folder)\n",
    )


def test_a_bad_format_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """--format takes text, json or markdown; anything else stops with status 2."""
    with pytest.raises(SystemExit) as stopped:
        main(["report", "--format", "yaml", "x.json"])
    err = capsys.readouterr().err
    assert (stopped.value.code, err.splitlines()[-1]) == (
        2,
        "cgguard report: error: argument --format: invalid choice: 'yaml' "
        "(choose from 'text', 'json', 'markdown', 'html')",
    )


def future_event(stack: list[dict[str, Any]]) -> dict[str, Any]:
    """The first event of a rule a newer cgguard knows and this one does not."""
    event = disabled_event(5, 0, "2026-12-01T05:00:01.000000Z")
    del event["disabled_stack"]
    event.update(rule="future_rule", message="m", stack=stack)
    return event


def test_a_rule_unknown_here_is_merged_with_its_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report from a newer cgguard, with a rule this one does not know, still merges."""
    event = future_event([TRAIN])
    write(tmp_path, "r.json", document(5, [{"rule": "future_rule", "count": 2, "first": event}]))
    status, out, _ = run(capsys, str(tmp_path))
    assert (status, out.splitlines()[3:9]) == (
        1,
        [
            "future_rule at /job/train.py:40 (in step): 2 in 1 process (2 logged)",
            "  node-a pid 5: 2",
            "  m",
            "  The call was made at (most recent call last):",
            '    File "/job/train.py", line 40, in step',
            "      with torch.cuda.graph(g):",
        ],
    )


TORCHRUN_PROGRAM = """\
import json
import os

import torch
import torch.distributed as dist

import cgguard

dist.init_process_group("gloo")
rank = dist.get_rank()
print(json.dumps({"rank": rank, "pid": os.getpid()}), flush=True)
if rank == 1:
    cgguard.set_capture_enabled(False)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # rank-1-only
        pass
total = torch.ones(1)
dist.all_reduce(total)
assert total.item() == 2
dist.destroy_process_group()
"""


@pytest.mark.subprocess
@pytest.mark.simulated
def test_a_torchrun_job_merges_into_one_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """cgguard run torchrun --nproc-per-node 2 (gloo, CPU): rank 1 violates, rank 0 does not;
    the merged report names rank 1's site and lists both ranks and the launcher."""
    program = tmp_path / "ranked_program.py"
    program.write_text(TORCHRUN_PROGRAM)
    folder = tmp_path / "reports"
    folder.mkdir()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    command = [sys.executable, "-m", "cgguard", "run", "--simulate-cuda", "--mode", "log"]
    command += ["--report", str(folder / "r-{pid}.json"), "--log-file", str(tmp_path / "log")]
    command += [torchrun, "--standalone", "--nproc-per-node", "2", str(program)]
    result = subprocess.run(
        command, env=clean_environ(), capture_output=True, text=True, timeout=240, check=False
    )
    assert result.returncode == 0, result.stderr
    # The two ranks share torchrun's stdout: their lines may interleave, so each object is
    # found on its own rather than read a line at a time.
    said = [json.loads(text) for text in re.findall(r"\{[^{}]*\}", result.stdout)]
    pids = {line["rank"]: line["pid"] for line in said}
    status, out, err = run(capsys, "--format", "json", str(folder))
    merged = json.loads(out)
    host = socket.gethostname()
    assert (status, err) == (1, "")
    # The launcher is guarded too: torchrun imports torch. It has no rank.
    assert [
        (p["host"], p["rank"], p["world_size"], p["violations"]) for p in merged["processes"]
    ] == [
        (host, 0, 2, 0),
        (host, 1, 2, 1),
        (host, None, None, 0),
    ]
    assert [p["pid"] for p in merged["processes"][:2]] == [pids[0], pids[1]]
    site = SourceFile(program).frame("rank-1-only", "<module>")
    (violation,) = merged["violations"]
    assert (
        violation["rule"],
        violation["site"],
        violation["count"],
        violation["processes"],
        violation["first"]["stack"][-1],
    ) == (
        "capture_disabled",
        site,
        1,
        [{"host": host, "pid": pids[1], "rank": 1, "count": 1}],
        site,
    )


def test_a_fence_in_the_code_does_not_end_the_markdown_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stack line of backticks gets a longer fence around it."""
    odd = frame("/job/doc.py", 3, "f", "```")
    event = future_event([odd])
    write(tmp_path, "r.json", document(5, [{"rule": "future_rule", "count": 1, "first": event}]))
    _, out, _ = run(capsys, "--format", "markdown", str(tmp_path))
    lines = out.splitlines()
    start = lines.index("````text")
    assert lines[start : start + 6] == [
        "````text",
        "m",
        "The call was made at (most recent call last):",
        '  File "/job/doc.py", line 3, in f',
        "    ```",
        "````",
    ]


AUTOTUNE = {
    "file": "/venv/torch/_inductor/runtime/benchmarking.py",
    "line": 373,
    "function": "benchmark_gpu_with_cuda_graph",
    "code": "with torch.cuda.graph(cuda_graph):",
}
INDUCTOR = "capture_disabled=torch._inductor."


def exempted_entry(count: int) -> dict[str, Any]:
    """A report's entry for captures an exemption let through, as cgguard writes it."""
    return {
        "rule": "capture_disabled",
        "count": count,
        "exemption": INDUCTOR,
        "first": {
            "event": "cgguard.capture_exempted",
            "level": "debug",
            "rule": "capture_disabled",
            "action": "exempted",
            "api": "torch.cuda.graph",
            "message": "exempted",
            "exemption": INDUCTOR,
            "matched": AUTOTUNE,
            "count": 1,
            "thread": "MainThread",
            "thread_id": 140000000000003,
            "pid": 101,
            "timestamp": "2026-12-01T05:00:04.000000Z",
            "stack": [MAIN, AUTOTUNE],
        },
    }


def test_exempted_captures_are_counted_per_site_and_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What exemptions let through is merged too: no violation, so status 0, and never hidden."""
    for pid, rank, count in ((101, 0, 3), (201, 1, 2)):
        report = document(pid, [], rank=rank)
        report["exempted_totals"] = {"capture_disabled": count}
        report["exempted"] = [exempted_entry(count)]
        write(tmp_path, f"r-{pid}.json", report)
    status, out, err = run(capsys, "--format", "json", str(tmp_path))
    merged = json.loads(out)
    assert (status, err) == (0, "")
    assert merged["totals"] == {}
    assert merged["exempted_totals"] == {"capture_disabled": 5}
    assert merged["exempted"] == [
        {
            "rule": "capture_disabled",
            "exemption": INDUCTOR,
            "site": AUTOTUNE,
            "count": 5,
            "processes": [
                {"host": "node-a", "pid": 101, "rank": 0, "count": 3},
                {"host": "node-a", "pid": 201, "rank": 1, "count": 2},
            ],
        }
    ]
    assert [(p["pid"], p["exempted"], p["exempted_totals"]) for p in merged["processes"]] == [
        (101, 3, {"capture_disabled": 3}),
        (201, 2, {"capture_disabled": 2}),
    ]
    status, out, _ = run(capsys, str(tmp_path))
    lines = out.splitlines()
    assert status == 0
    assert lines[0] == "cgguard report: 2 processes on 1 host: no violation; 5 exempted"
    where = "/venv/torch/_inductor/runtime/benchmarking.py:373 (in benchmark_gpu_with_cuda_graph)"
    assert lines[lines.index("exempted:") + 1] == (
        f"  capture_disabled at {where}: 5 exempted by {INDUCTOR}, in "
        "node-a pid 101 rank 0 (3), node-a pid 201 rank 1 (2)"
    )
    assert (
        f"  node-a pid 101  rank 0  no violation (3 exempted)  {tmp_path / 'r-101.json'}" in lines
    )
    status, out, _ = run(capsys, "--format", "markdown", str(tmp_path))
    assert table(out.splitlines(), "## Exempted")[2] == [
        "capture_disabled",
        where,
        INDUCTOR,
        "5",
        "node-a pid 101 rank 0 (3), node-a pid 201 rank 1 (2)",
    ]


def test_an_exempted_entry_without_its_exemption_is_not_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken exempted section is refused like a broken violation, naming the path."""
    report = document(101, [])
    entry = exempted_entry(1)
    del entry["exemption"]
    report["exempted"] = [entry]
    path = write(tmp_path, "r.json", report)
    status, out, err = run(capsys, str(path))
    assert (status, out, err) == (
        2,
        "",
        f"cgguard report: '{path}': not a cgguard report: exempted[0]: no \"exemption\"\n",
    )


# What a name made by exec, or a report from another machine, may hold: a window title, a
# clear screen, hidden text, a bidi override.
TITLE, CLEAR, HIDE, BIDI = "\x1b]0;owned\x07", "\x1b[2J", "\x1b[8m", "\u202e"
HOSTILE_FRAME = frame(f"/job/{CLEAR}gen.py", 3, f"st{BIDI}ep", f"run(){HIDE}")


def hostile_report(tmp_path: Path) -> Path:
    """A report whose every name holds what a terminal acts on, in a file named so too."""
    event = disabled_event(7, 0, "2026-12-01T05:00:01.000000Z")
    event.update(
        message=f"began{HIDE} all clear",
        stack=[HOSTILE_FRAME],
        disabled_stack=[frame("/job/a.py", 1, f"off{TITLE}", "x\ny")],
    )
    report = document(7, [{"rule": "capture_disabled", "count": 2, "first": event}])
    report.update(host=f"node{TITLE}", rank=f"{HIDE}0")
    report["exempted_totals"] = {"capture_disabled": 1}
    entry = exempted_entry(1)
    entry["exemption"] = entry["first"]["exemption"] = f"capture_disabled=x{CLEAR}"
    entry["first"]["stack"] = [HOSTILE_FRAME]
    report["exempted"] = [entry]
    return write(tmp_path, f"r{TITLE}.json", report)


def test_text_escapes_what_a_terminal_acts_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every name from a report (host, rank, file, function, code, message, exemption, the
    report's own path) is shown with its control characters and bidi overrides escaped."""
    path = hostile_report(tmp_path)
    status, out, err = run(capsys, str(path))
    shown_path = str(path).replace(TITLE, "\\x1b]0;owned\\x07")
    assert (status, err) == (1, "")
    assert out.split("\n") == [
        "cgguard report: 1 process on 1 host: 2 violations at 1 site (2 logged); 1 exempted",
        "reports written at 2026-12-01T05:00:09.000000Z",
        "",
        "capture_disabled at /job/\\x1b[2Jgen.py:3 (in st\\u202eep): 2 in 1 process (2 logged)",
        "  node\\x1b]0;owned\\x07 pid 7 rank \\x1b[8m0: 2",
        "  began\\x1b[8m all clear",
        "  The capture was attempted at (most recent call last):",
        '    File "/job/\\x1b[2Jgen.py", line 3, in st\\u202eep',
        "      run()\\x1b[8m",
        "",
        "  Capture was disabled at (most recent call last):",
        '    File "/job/a.py", line 1, in off\\x1b]0;owned\\x07',
        "      x\\ny",
        "",
        "exempted:",
        "  capture_disabled at /job/\\x1b[2Jgen.py:3 (in st\\u202eep): 1 exempted by "
        "capture_disabled=x\\x1b[2J, in node\\x1b]0;owned\\x07 pid 7 rank \\x1b[8m0 (1)",
        "",
        "processes:",
        "  node\\x1b]0;owned\\x07 pid 7  rank \\x1b[8m0  capture_disabled 2 "
        f"(2 logged; 1 exempted)  {shown_path}",
        "",
    ]


def test_markdown_keeps_names_literal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Markdown: names from a report cannot end a cell, a heading or the code block, nor make
    a link, raw HTML or a heading of their own; \\r no more than \\n."""
    event = disabled_event(7, 0, "2026-12-01T05:00:01.000000Z")
    del event["disabled_stack"]
    event.update(
        message="done\r\n# all clear\n```",
        stack=[frame("/job/[all clear](https://x).py", 3, "f\r## all clear", "\r```\n# ok")],
    )
    report = document(7, [{"rule": "capture_disabled", "count": 1, "first": event}])
    report["host"] = "evil|<b>x</b>"
    write(tmp_path, "r.json", report)
    status, out, _ = run(capsys, "--format", "markdown", str(tmp_path))
    where = "/job/\\[all clear\\](https://x).py:3 (in f\\\\r\\#\\# all clear)"
    report_cell = str(tmp_path / "r.json").replace("_", "\\_")
    assert (status, out.split("\n")) == (
        1,
        [
            "# cgguard report",
            "",
            "1 process on 1 host: 1 violation at 1 site (1 logged).",
            "",
            "- reports written at 2026-12-01T05:00:09.000000Z",
            "",
            "## Violations",
            "",
            "| rule | site | count | raised | logged | processes |",
            "| --- | --- | --- | --- | --- | --- |",
            f"| capture\\_disabled | {where} | 1 | 0 | 1 | evil\\|\\<b\\>x\\</b\\> pid 7 (1) |",
            "",
            f"### capture\\_disabled at {where}",
            "",
            "```text",
            "done\\r\\n# all clear\\n```",
            "The capture was attempted at (most recent call last):",
            '  File "/job/[all clear](https://x).py", line 3, in f\\r## all clear',
            "    \\r```\\n# ok",
            "```",
            "",
            "## Processes",
            "",
            "| host | pid | rank | local\\_rank | world\\_size | violations | raised | logged "
            "| exempted | report |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| evil\\|\\<b\\>x\\</b\\> | 7 |  |  |  | 1 | 0 | 1 | 0 | {report_cell} |",
            "",
        ],
    )


def test_keys_added_later_and_sections_missing_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report of schema 1 with sections and keys this cgguard does not know (a census, a
    key in an event or a frame), and one without the host or the exempted sections, merge."""
    event = disabled_event(7, 0, "2026-12-01T05:00:01.000000Z")
    event["stack"] = [MAIN, {**TRAIN, "column": 9}]
    event["later"] = {"nested": [1]}
    newer = document(7, [{"rule": "capture_disabled", "count": 2, "first": event}])
    newer.update(schema=1, captures={"torch.cuda.graph": 4}, cudagraph_skips=[{"reason": "cpu"}])
    older = document(8, [], host=None)
    write(tmp_path, "newer.json", newer)
    write(tmp_path, "older.json", older)
    status, out, err = run(capsys, "--format", "json", str(tmp_path))
    merged = json.loads(out)
    assert (status, err, merged["totals"], merged["violations"][0]["site"]) == (
        1,
        "",
        {"capture_disabled": 2},
        {**TRAIN, "column": 9},
    )
    assert merged["violations"][0]["first"]["later"] == {"nested": [1]}
    assert [(p["host"], p["pid"], p["violations"]) for p in merged["processes"]] == [
        ("node-a", 7, 2),
        (None, 8, 0),
    ]


def test_a_first_event_without_a_stack_is_at_an_unknown_site(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The schema lets a violation event lack its stack (a repeat does): merged, its site is
    unknown, and nothing fails."""
    write(tmp_path, "r.json", violating(stack=None, disabled_stack=None))
    status, out, err = run(capsys, str(tmp_path))
    assert (status, err, out.split("\n")[3:7]) == (
        1,
        "",
        [
            "capture_disabled at an unknown site: 1 in 1 process (1 logged)",
            "  node-a pid 9: 1",
            f"  {DISABLED} torch.cuda.graph at /job/train.py:40 (in step) began a capture; capture "
            "was disabled at /job/train.py:12 (in serve).",
            "",
        ],
    )


def report_command(*args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """``cgguard report`` in a child, whose memory is bounded, stopped if it takes too long."""
    import resource

    def bounded() -> None:  # a runaway read fails fast instead of filling the machine
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(
        [sys.executable, "-m", "cgguard", "report", *args],
        env=clean_environ(**environ),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=bounded,  # only setrlimit, in a child started from a test
        check=False,
    )


@pytest.mark.subprocess
def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO given as a path, or named *.json in a folder, is not a report: status 2 at once,
    naming it, instead of waiting for a writer."""
    folder = tmp_path / "reports"
    folder.mkdir()
    fifo = folder / "r-1.json"
    os.mkfifo(fifo)
    for path in (fifo, folder):
        result = report_command(str(path))
        assert (result.returncode, result.stdout, result.stderr) == (
            2,
            "",
            f"cgguard report: '{fifo}': not a regular file (a FIFO)\n",
        )


@pytest.mark.subprocess
def test_a_device_is_refused_not_read(tmp_path: Path) -> None:
    """/dev/zero is refused before anything is read from it (it never ends)."""
    result = report_command("/dev/zero")
    assert (result.returncode, result.stdout, result.stderr) == (
        2,
        "",
        "cgguard report: '/dev/zero': not a regular file (a character device)\n",
    )


def test_a_report_larger_than_the_limit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past --max-bytes a file is refused unread, naming the option that raises the limit;
    at the limit it is read."""
    path = write(tmp_path, "r.json", REPORT)
    size = path.stat().st_size
    assert run(capsys, "--max-bytes", str(size - 1), str(path)) == (
        2,
        "",
        f"cgguard report: '{path}': larger than {size - 1} bytes (--max-bytes raises the limit)\n",
    )
    assert run(capsys, "--max-bytes", str(size), str(path))[0] == 0


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "lots"])
def test_a_bad_max_bytes_is_refused_by_the_parser(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-bytes takes a whole number of bytes above 0."""
    with pytest.raises(SystemExit) as stopped:
        main(["report", "--max-bytes", value, "x.json"])
    assert (stopped.value.code, capsys.readouterr().err.splitlines()[-1]) == (
        2,
        f"cgguard report: error: argument --max-bytes: {value!r} is not a whole number of "
        "bytes above 0",
    )


@pytest.mark.subprocess
def test_a_recursive_glob_does_not_follow_symlinked_folders(tmp_path: Path) -> None:
    """``**`` walks real folders only: two symlink loops end, and each report is read once."""
    top = tmp_path / "job"
    (top / "node-b").mkdir(parents=True)
    write(top, "r-1.json", document(1, []))
    write(top / "node-b", "r-2.json", document(2, [], host="node-b"))
    (top / "loop").symlink_to(top)
    (top / "node-b" / "back").symlink_to(top)
    result = report_command("--format", "json", str(top / "**" / "*.json"))
    merged = json.loads(result.stdout) if result.returncode == 0 else result.stderr
    assert [p["report"] for p in merged["processes"]] == [
        str(top / "r-1.json"),
        str(top / "node-b" / "r-2.json"),
    ]


def test_a_folder_reads_its_regular_reports_and_refuses_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a folder, a *.json file or a link to one is read; anything else named so is
    refused, naming it."""
    write(tmp_path, "r-1.json", document(1, []))
    (tmp_path / "r-2.json").symlink_to(write(tmp_path, "kept.txt", json.dumps(document(2, []))))
    status, out, _ = run(capsys, "--format", "json", str(tmp_path))
    assert (status, [p["pid"] for p in json.loads(out)["processes"]]) == (0, [1, 2])
    (tmp_path / "sub.json").mkdir()
    assert run(capsys, str(tmp_path)) == (
        2,
        "",
        f"cgguard report: '{tmp_path / 'sub.json'}': not a regular file (a folder)\n",
    )


def test_deeply_nested_json_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON nested deeper than Python can parse is status 2, naming the file, not a crash."""
    path = write(tmp_path, "r.json", "[" * 100_000 + "]" * 100_000)
    assert run(capsys, str(path)) == (
        2,
        "",
        f"cgguard report: '{path}': not a cgguard report: not JSON (nested too deeply)\n",
    )


@pytest.mark.subprocess
def test_names_no_output_encoding_can_hold_are_escaped(tmp_path: Path) -> None:
    """A file name that is not UTF-8 (a lone surrogate to Python) and a host name an ASCII
    terminal cannot show come out escaped, on a strict UTF-8 stdout and on an ASCII one."""
    folder = os.fsencode(tmp_path)
    with open(os.path.join(folder, b"r-\xff.json"), "w") as file:
        json.dump(document(1, [], host="Grüße"), file)
    shown_path = f"{tmp_path}/r-\\udcff.json"
    for encoding, host in (("utf-8", "Grüße"), ("ascii", "Gr\\xfc\\xdfe")):
        result = report_command(str(tmp_path), PYTHONIOENCODING=f"{encoding}:strict")
        assert (result.returncode, result.stderr, result.stdout.splitlines()[-1]) == (
            0,
            "",
            f"  {host} pid 1  no violation  {shown_path}",
        ), encoding


def one_violation(pid: int, count: int, **keys: Any) -> dict[str, Any]:
    """A report of one process with ``count`` violations at TRAIN, and ``keys`` added."""
    event = disabled_event(pid, 0, "2026-12-01T05:00:01.000000Z")
    return {**document(pid, [{"rule": "capture_disabled", "count": count, "first": event}]), **keys}


def test_a_hard_link_is_the_same_file_read_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report reached by two names of one file (a hard link) counts once."""
    path = write(tmp_path, "r-1.json", one_violation(1, 3))
    os.link(path, tmp_path / "again.json")
    status, out, _ = run(capsys, "--format", "json", str(tmp_path))
    merged = json.loads(out)
    assert (status, merged["reports"], merged["totals"], merged["skipped"]) == (
        1,
        1,
        {"capture_disabled": 3},
        [],
    )


def test_a_copy_of_a_report_is_one_process_and_said_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte-for-byte copy of a report (gathered twice) counts once, and the view says which
    file it skipped as the same as which."""
    first = tmp_path / "a" / "r-1.json"
    copy = tmp_path / "b" / "r-1.json"
    first.parent.mkdir()
    copy.parent.mkdir()
    write(first.parent, first.name, one_violation(1, 3))
    shutil.copy(first, copy)
    status, out, _ = run(capsys, "--format", "json", str(first.parent), str(copy.parent))
    merged = json.loads(out)
    assert (status, merged["reports"], merged["totals"], merged["skipped"]) == (
        1,
        1,
        {"capture_disabled": 3},
        [{"report": str(copy), "same_as": str(first)}],
    )
    status, out, _ = run(capsys, str(first.parent), str(copy.parent))
    assert out.split("\n")[:3] == [
        "cgguard report: 1 process on 1 host: 3 violations at 1 site (3 logged)",
        "reports written at 2026-12-01T05:00:09.000000Z",
        f"skipped {copy}: the same report as {first}",
    ]


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        pytest.param(
            one_violation(1, 3, totals={"capture_disabled": 2}),
            "totals['capture_disabled'] is 2, fewer than its violations count (3)",
            id="total below its sites",
        ),
        pytest.param(
            one_violation(1, 3, totals={}),
            "totals['capture_disabled'] is 0, fewer than its violations count (3)",
            id="no total for its sites",
        ),
        pytest.param(
            {
                **document(1, [], exempted_totals={}),
                "exempted": [exempted_entry(2)],
            },
            "exempted_totals['capture_disabled'] is 0, fewer than its exempted count (2)",
            id="exempted below its sites",
        ),
        pytest.param(
            document(
                1,
                [
                    {
                        "rule": "nested_capture",
                        "count": 1,
                        "first": disabled_event(1, 0, "2026-12-01T05:00:01.000000Z"),
                    }
                ],
            ),
            "violations[0] is of rule 'nested_capture', its first event of 'capture_disabled'",
            id="first of another rule",
        ),
    ],
)
def test_a_report_that_contradicts_itself_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], report: dict[str, Any], reason: str
) -> None:
    """Totals fewer than the sites they count, or a site whose first event is of another rule:
    status 2, naming the file, rather than a count or an exit status taken from either."""
    path = write(tmp_path, "r.json", report)
    assert run(capsys, str(path)) == (
        2,
        "",
        f"cgguard report: '{path}': not a cgguard report: {reason}\n",
    )


def test_totals_beyond_the_sites_listed_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A total above its sites' counts is a site still being rendered when the report was
    written: it counts, and fails the gate."""
    write(tmp_path, "r.json", document(1, [], totals={"capture_disabled": 2}))
    status, out, _ = run(capsys, str(tmp_path))
    assert (status, out.split("\n")[0]) == (
        1,
        "cgguard report: 1 process on 1 host: 2 violations at 0 sites (2 not listed)",
    )


def test_the_view_says_which_jobs_and_times_it_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reports of different runs are named in the view: their jobs, and when they were
    written, first and last."""
    write(tmp_path, "a.json", document(1, [], job="run-a", written_at="2026-12-01T05:00:00Z"))
    write(tmp_path, "b.json", document(2, [], job="run-b", written_at="2026-12-03T07:00:00Z"))
    write(tmp_path, "c.json", document(3, [], job="run-a", written_at="2026-12-02T05:00:00Z"))
    status, out, _ = run(capsys, str(tmp_path))
    assert (status, out.split("\n")[:3]) == (
        0,
        [
            "cgguard report: 3 processes on 1 host: no violation",
            "reports written from 2026-12-01T05:00:00Z to 2026-12-03T07:00:00Z",
            "jobs: run-a, run-b",
        ],
    )
    merged = json.loads(run(capsys, "--format", "json", str(tmp_path))[1])
    assert (merged["jobs"], merged["written"], [p["job"] for p in merged["processes"]]) == (
        ["run-a", "run-b"],
        {"first": "2026-12-01T05:00:00Z", "last": "2026-12-03T07:00:00Z"},
        ["run-a", "run-b", "run-a"],
    )


def test_two_different_reports_of_one_process_are_pointed_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two reports of one host and pid that differ (a pid used again, or copies taken at
    different times) each count, and the view says so, naming both."""
    a = write(tmp_path, "a.json", one_violation(1, 2))
    b = write(tmp_path, "b.json", one_violation(1, 5, written_at="2026-12-01T05:00:30.000000Z"))
    status, out, _ = run(capsys, str(tmp_path))
    assert (status, out.split("\n")[:3]) == (
        1,
        [
            "cgguard report: 2 processes on 1 host: 7 violations at 1 site (7 logged)",
            "reports written from 2026-12-01T05:00:09.000000Z to 2026-12-01T05:00:30.000000Z",
            f"node-a pid 1: 2 different reports, each counted as a process: {a}, {b}",
        ],
    )
    merged = json.loads(run(capsys, "--format", "json", str(tmp_path))[1])
    assert merged["same_process"] == [
        {"host": "node-a", "pid": 1, "job": None, "reports": [str(a), str(b)]}
    ]


def test_one_process_at_one_site_twice_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two sites of one report that are one place in the code (two instructions of one line)
    merge into one count for that process."""
    event = disabled_event(1, 0, "2026-12-01T05:00:01.000000Z")
    write(
        tmp_path,
        "r.json",
        document(
            1,
            [
                {"rule": "capture_disabled", "count": 2, "first": event},
                {"rule": "capture_disabled", "count": 3, "first": event},
            ],
        ),
    )
    merged = json.loads(run(capsys, "--format", "json", str(tmp_path))[1])
    assert merged["violations"][0]["processes"] == [
        {"host": "node-a", "pid": 1, "rank": None, "count": 5}
    ]


@pytest.mark.subprocess
def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    """`cgguard report ... | head`: the pipe closes long before the output ends; the command
    still exits with its status, and writes nothing to stderr."""
    sites = []
    for line in range(1, 3001):  # far more text than a pipe holds
        event = disabled_event(7, 0, "2026-12-01T05:00:01.000000Z")
        top = {**TRAIN, "line": line}
        event.update(stack=[MAIN, top], message=f"{DISABLED} at /job/train.py:{line}")
        sites.append({"rule": "capture_disabled", "count": 1, "first": event})
    report = write(tmp_path, "r-7.json", document(7, sites, rank=0))
    with subprocess.Popen(
        [sys.executable, "-m", "cgguard", "report", str(report)],
        env=clean_environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as child:
        assert child.stdout is not None
        assert child.stderr is not None
        child.stdout.read(100)  # what `head -c 100` takes, then it goes
        child.stdout.close()
        err = child.stderr.read()
        status = child.wait(timeout=60)
    assert (status, err) == (1, b"")


def census_entry(seconds: float) -> dict[str, Any]:
    """One site's entry of a report's ``captures``: two captures that ended."""
    return {
        "file": "/job/train.py",
        "line": 40,
        "function": "step",
        "count": 2,
        "seconds": seconds,
        "max_seconds": seconds / 2,
        "bytes_reserved": None,
        "bytes_allocated": None,
        "outcomes": {"ended": 2, "failed": 0, "refused": 0, "abandoned": 0},
        "errors": {},
        "apis": {"torch.cuda.graph": 2},
        "modes": {"global": 2},
        "threads": {"MainThread": 2},
        "pools": {"private": 2},
        "devices": None,
    }


def test_markdown_names_a_sites_slowest_process_with_its_rank_as_text_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Markdown captures table's "slowest" cell is the text view's: host, pid and rank."""
    for pid, rank, seconds in ((101, 0, 1.0), (201, 1, 2.0)):
        report = document(pid, [], schema=2, rank=rank, captures=[census_entry(seconds)])
        write(tmp_path, f"r-{pid}.json", report)
    status, out, _ = run(capsys, "--format", "markdown", str(tmp_path))
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("| site |"))
    (row,) = table(lines, header)
    assert (status, row[0], row[-2:]) == (
        0,
        "/job/train.py:40 (in step)",
        ["2", "node-a pid 201 rank 1 (2.000000 s)"],
    )
    _, text, _ = run(capsys, str(tmp_path))
    assert (
        "  /job/train.py:40 (in step): 4 captures (ended 4), 3.000000 s, bytes not measured; "
        "slowest node-a pid 201 rank 1 (2.000000 s)"
    ) in text.splitlines()


def census_report(pid: int, *entries: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A report of schema 2 holding ``entries`` (one census_entry(1.0) without), each changed by
    ``changes``."""
    captures = [{**entry, **changes} for entry in entries or (census_entry(1.0),)]
    return document(pid, [], schema=2, captures=captures)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        pytest.param(
            {"seconds": math.nan},
            "captures[0].seconds: a finite number expected, found NaN",
            id="NaN seconds",
        ),
        pytest.param(
            {"seconds": math.inf},
            "captures[0].seconds: a finite number expected, found Infinity",
            id="infinite seconds",
        ),
        pytest.param(
            {"max_seconds": -math.inf},
            "captures[0].max_seconds: a finite number expected, found -Infinity",
            id="minus infinite max_seconds",
        ),
        pytest.param(
            {"seconds": -1.5},
            "captures[0].seconds: a number of 0 or more expected, found -1.5",
            id="negative seconds",
        ),
        pytest.param(
            {"seconds": -1, "max_seconds": 0},
            "captures[0].seconds: a number of 0 or more expected, found -1",
            id="negative whole seconds",
        ),
        pytest.param(
            {"seconds": 10**400},
            "captures[0].seconds is a whole number past what a float holds",
            id="whole seconds past a float",
        ),
        pytest.param(
            {"slowest": {"pid": 1, "host": None, "rank": None, "seconds": math.nan, "count": 2}},
            "captures[0].slowest.seconds: a finite number expected, found NaN",
            id="NaN slowest seconds",
        ),
        pytest.param(
            {"outcomes": {"ended": 2, "failed": 1, "refused": 0, "abandoned": 0}},
            "captures[0].outcomes add up to 3, more than its count (2)",
            id="outcomes above the count",
        ),
        pytest.param(
            {"apis": {"torch.cuda.graph": 2, "CUDAGraph.capture_begin": 1}},
            "captures[0].apis add up to 3, more than its count (2)",
            id="apis above the count",
        ),
        pytest.param(
            {"errors": {"AcceleratorError": 3}},
            "captures[0].errors add up to 3, more than its count (2)",
            id="errors above the count",
        ),
        pytest.param(
            {"replays": 5, "never_replayed": 3},
            "captures[0].never_replayed is 3, more than its count (2)",
            id="never replayed above the count",
        ),
        pytest.param(
            {"max_seconds": 2.0},
            "captures[0].max_seconds is 2.0, more than its seconds (1.0)",
            id="longest above the sum",
        ),
    ],
)
def test_census_values_no_process_can_write_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], reason: str
) -> None:
    """Seconds that are NaN, infinite, negative or past a float, and parts of a site's captures
    that add up to more than its count: status 2 and one line naming the file and the field,
    rather than a total of "nan s", a slowest process taken from it, or JSON with NaN."""
    good = write(tmp_path, "good.json", census_report(1))
    bad = write(tmp_path, "bad.json", census_report(2, **changes))
    assert run(capsys, "--format", "json", str(good), str(bad)) == (
        2,
        "",
        f"cgguard report: '{bad}': not a cgguard report: {reason}\n",
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param(
            json.dumps(document(1, [], config={"mode": "log", "lr": math.nan})),
            "config.lr: a finite number expected, found NaN",
            id="NaN in config",
        ),
        pytest.param(
            json.dumps(census_report(1, note=-math.inf)),
            "captures[0].note: a finite number expected, found -Infinity",
            id="a key the schema does not name",
        ),
        pytest.param(
            json.dumps(violating(extra=[1, {"x": 7.25}])).replace("7.25", "1e999"),
            "violations[0].first.extra[1].x: a finite number expected, found Infinity",
            id="a number past a float in an event",
        ),
    ],
)
def test_numbers_json_does_not_have_are_refused_wherever_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, reason: str
) -> None:
    """NaN, Infinity and -Infinity are not JSON, nor is a number a float cannot hold; a key the
    schema does not name is passed on to the JSON view, so one there is refused too."""
    path = write(tmp_path, "r.json", text)
    assert run(capsys, "--format", "json", str(path)) == (
        2,
        "",
        f"cgguard report: '{path}': not a cgguard report: {reason}\n",
    )


@pytest.mark.parametrize("together", [True, False], ids=["in one report", "across reports"])
def test_seconds_that_add_up_past_a_float_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], together: bool
) -> None:
    """Each number finite, their sum not: status 2, naming the report that took it past."""
    huge = {**census_entry(1.0), "seconds": 1e308, "max_seconds": 1e308}
    if together:
        path = write(tmp_path, "r.json", census_report(1, huge, huge))
    else:
        write(tmp_path, "a.json", census_report(1, huge))
        path = write(tmp_path, "b.json", census_report(2, huge))
    assert run(capsys, "--format", "json", str(tmp_path)) == (
        2,
        "",
        f"cgguard report: '{path}': captures: the seconds add up to more than a float holds\n",
    )


def test_the_json_view_never_writes_nan_or_infinity() -> None:
    """Were a value JSON does not have to reach the JSON view, it stops rather than write
    text that strict JSON parsers refuse."""
    merged = merge([("r.json", violating(extra=math.nan))])  # not read(): nothing refused it
    with pytest.raises(ValueError, match="not JSON compliant"):
        "".join(render_json(merged))


def test_help_gives_each_option_a_sentence_and_an_example(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cgguard report --help`: every option says what it does and shows itself in use, never
    cut at its hyphens on an 80-column terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    examples = [
        "--format html -o job.html",
        "-o summary.md",
        "--top 16",
        "--max-bytes 2000000000",
        "reports/ or 'node-*/**/r-*.json'",
        "cgguard report --format markdown 'node-*/r-*.json' >> \"$GITHUB_STEP_SUMMARY\"",
    ]
    assert [example for example in examples if example not in text] == []


def wide_job(folder: Path, processes: int) -> Path:
    """A job of ``processes`` ranks on one host, rank r hitting TRAIN r + 1 times (logged),
    and rank 0 also hitting the nested capture once (raised)."""
    for rank in range(processes):
        pid = 100 + rank
        sites = [
            {
                "rule": "capture_disabled",
                "count": rank + 1,
                "first": disabled_event(pid, rank, "2026-12-01T05:00:01.000000Z"),
            }
        ]
        if rank == 0:
            sites.append(
                {
                    "rule": "nested_capture",
                    "count": 1,
                    "first": nested_event(pid, rank, "2026-12-01T05:00:02.000000Z"),
                }
            )
        write(folder, f"r-{pid}.json", document(pid, sites, rank=rank))
    write(folder, "r-99.json", document(99, []))  # the launcher
    return folder


def test_a_site_hit_by_many_processes_names_the_top_five_and_how_many_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Text: under a site, the five processes with the most hits, then how many more and their
    count; the list of processes likewise, with how many of the rest violated."""
    status, out, _ = run(capsys, str(wide_job(tmp_path, 8)))
    lines = out.splitlines()
    site = lines.index(
        "capture_disabled at /job/train.py:40 (in step): 36 in 8 processes (36 logged)"
    )
    assert (status, lines[0], lines[site + 1 : site + 8]) == (
        1,
        "cgguard report: 9 processes on 1 host: 37 violations at 2 sites (1 raised, 36 logged)",
        [
            "  node-a pid 107 rank 7: 8",
            "  node-a pid 106 rank 6: 7",
            "  node-a pid 105 rank 5: 6",
            "  node-a pid 104 rank 4: 5",
            "  node-a pid 103 rank 3: 4",
            "  and 3 more processes (6 violations)",
            f"  {DISABLED} torch.cuda.graph at /job/train.py:40 (in step) began a capture; capture "
            "was disabled at /job/train.py:12 (in serve).",
        ],
    )
    assert lines[lines.index("processes:") + 1 :] == [
        f"  node-a pid 107  rank 7  capture_disabled 8 (8 logged)  {tmp_path / 'r-107.json'}",
        f"  node-a pid 106  rank 6  capture_disabled 7 (7 logged)  {tmp_path / 'r-106.json'}",
        f"  node-a pid 105  rank 5  capture_disabled 6 (6 logged)  {tmp_path / 'r-105.json'}",
        f"  node-a pid 104  rank 4  capture_disabled 5 (5 logged)  {tmp_path / 'r-104.json'}",
        f"  node-a pid 103  rank 3  capture_disabled 4 (4 logged)  {tmp_path / 'r-103.json'}",
        "  and 4 more processes: 3 with a violation, 1 without",
    ]


def test_markdown_names_the_top_five_processes_and_how_many_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Markdown: a site's processes cell and the processes table stop at five, and say how
    many more there are."""
    status, out, _ = run(capsys, "--format", "markdown", str(wide_job(tmp_path, 8)))
    lines = out.splitlines()
    assert (status, table(lines, "## Violations")[2]) == (
        1,
        [
            "capture_disabled",
            "/job/train.py:40 (in step)",
            "36",
            "0",
            "36",
            "node-a pid 107 rank 7 (8), node-a pid 106 rank 6 (7), node-a pid 105 rank 5 (6), "
            "node-a pid 104 rank 4 (5), node-a pid 103 rank 3 (4), and 3 more processes "
            "(6 violations)",
        ],
    )
    rows = table(lines, "## Processes")
    end = lines.index("## Processes") + 2 + len(rows)
    assert ([row[1] for row in rows[2:]], lines[end:]) == (
        ["107", "106", "105", "104", "103"],
        ["", "and 4 more processes: 3 with a violation, 1 without."],
    )


def test_top_sets_how_many_processes_the_views_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--top N names N processes under each site and in the list; the JSON view lists all."""
    folder = wide_job(tmp_path, 3)
    _, out, _ = run(capsys, "--top", "1", str(folder))
    lines = out.splitlines()
    assert lines[4:6] + lines[-2:] == [
        "  node-a pid 102 rank 2: 3",
        "  and 2 more processes (3 violations)",
        f"  node-a pid 102  rank 2  capture_disabled 3 (3 logged)  {folder / 'r-102.json'}",
        "  and 3 more processes: 2 with a violation, 1 without",
    ]
    merged = json.loads(run(capsys, "--format", "json", "--top", "1", str(folder))[1])
    assert (len(merged["processes"]), len(merged["violations"][0]["processes"])) == (4, 3)


@pytest.mark.parametrize("value", ["0", "-2", "five"])
def test_a_bad_top_is_refused_by_the_parser(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--top takes a whole number of processes above 0."""
    with pytest.raises(SystemExit) as stopped:
        main(["report", "--top", value, "x.json"])
    assert (stopped.value.code, capsys.readouterr().err.splitlines()[-1]) == (
        2,
        f"cgguard report: error: argument --top: {value!r} is not a whole number of processes "
        "above 0",
    )


def test_raised_and_logged_are_told_apart_at_one_site(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A site raised in one process (raise mode) and logged in another: each view counts the
    two apart, per site, per process and in all; an action a newer cgguard names follows."""
    raised = {**disabled_event(1, 0, "2026-12-01T05:00:01.000000Z"), "action": "raised"}
    warned = {**disabled_event(3, 2, "2026-12-01T05:00:03.000000Z"), "action": "warned"}
    write(
        tmp_path, "a.json", document(1, [{"rule": "capture_disabled", "count": 2, "first": raised}])
    )
    write(tmp_path, "b.json", one_violation(2, 3))
    write(
        tmp_path, "c.json", document(3, [{"rule": "capture_disabled", "count": 1, "first": warned}])
    )
    status, out, _ = run(capsys, str(tmp_path))
    lines = out.splitlines()
    assert (status, lines[0], lines[3], lines[-3:]) == (
        1,
        "cgguard report: 3 processes on 1 host: 6 violations at 1 site (2 raised, 3 logged, "
        "1 warned)",
        "capture_disabled at /job/train.py:40 (in step): 6 in 3 processes (2 raised, 3 logged, "
        "1 warned)",
        [
            f"  node-a pid 2  capture_disabled 3 (3 logged)  {tmp_path / 'b.json'}",
            f"  node-a pid 1  capture_disabled 2 (2 raised)  {tmp_path / 'a.json'}",
            f"  node-a pid 3  capture_disabled 1 (1 warned)  {tmp_path / 'c.json'}",
        ],
    )
    merged = json.loads(run(capsys, "--format", "json", str(tmp_path))[1])
    assert (
        merged["actions"],
        merged["violations"][0]["actions"],
        [p["actions"] for p in merged["processes"]],
    ) == (
        {"raised": 2, "logged": 3, "warned": 1},
        {"raised": 2, "logged": 3, "warned": 1},
        [
            {"raised": 2, "logged": 0},
            {"raised": 0, "logged": 3},
            {"raised": 0, "logged": 0, "warned": 1},
        ],
    )
    rows = table(
        run(capsys, "--format", "markdown", str(tmp_path))[1].splitlines(), "## Violations"
    )
    assert rows[2][2:5] == ["6", "2", "3"]


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_output_goes_to_the_file_named(
    job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    """-o FILE holds what standard output would have, in every format; stdout stays empty."""
    _, expected, _ = run(capsys, "--format", fmt, str(job))
    out = tmp_path / "view.out"
    out.write_text("older")
    assert (run(capsys, "--format", fmt, "-o", str(out), str(job)), out.read_text()) == (
        (1, "", ""),
        expected,
    )


def test_an_output_that_cannot_be_written_is_one_line(
    job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o naming a folder, or a file in a folder that is not there: status 2, one line."""
    missing = tmp_path / "nowhere" / "view.txt"
    assert [run(capsys, "-o", str(path), str(job)) for path in (tmp_path, missing)] == [
        (2, "", f"cgguard report: '{tmp_path}': cannot be written: Is a directory\n"),
        (2, "", f"cgguard report: '{missing}': cannot be written: No such file or directory\n"),
    ]


def test_a_report_that_cannot_be_read_leaves_the_output_as_it_was(
    job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The output file is opened only once every report has been read: a bad path keeps it."""
    out = tmp_path / "job.html"
    out.write_text("yesterday's page")
    bad = write(tmp_path, "bad.json", "{")
    status, _, err = run(capsys, "--format", "html", "-o", str(out), str(job), str(bad))
    assert (
        status,
        err.startswith(f"cgguard report: '{bad}': not a cgguard report"),
        out.read_text(),
    ) == (
        2,
        True,
        "yesterday's page",
    )
