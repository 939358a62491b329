"""Two ranks under torchrun, over gloo on the simulated runtime (tests/ranks_job.py): the live
check on every rank, and the merged reports' comparison of the ranks in each format.

A gloo job whose ranks issue different collectives hangs for good: the job runs in a session of
its own, killed whole on a timeout, and the scenarios keep the collectives outside captures
paired (docs/ranks.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import clean_environ

JOB = str(Path(__file__).with_name("ranks_job.py"))
SITE = f"{JOB}:{{}} (in main)"

pytestmark = pytest.mark.subprocess


def line_of(marker: str) -> int:
    with open(JOB) as source:
        return next(n for n, text in enumerate(source, 1) if marker in text)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run_job(tmp_path: Path, scenario: str) -> tuple[dict[int, list[dict[str, Any]]], Path]:
    """Run the two-rank job; what each rank's check found, and the folder of its reports."""
    reports = tmp_path / "reports"
    reports.mkdir()
    env = clean_environ(
        CGGUARD_ENABLED="1",
        CGGUARD_SIMULATE_CUDA="1",
        CGGUARD_LOG_LEVEL="error",
        CGGUARD_REPORT=str(reports / "r-{pid}.json"),
    )
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        JOB,
        scenario,
    ]
    # A session of its own: workers outlive a launcher killed alone.
    job = subprocess.Popen(
        argv,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = job.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        raise
    assert job.returncode == 0, err
    found = {}
    for rank in (0, 1):
        written = tmp_path / f"found-{rank}.json"
        if written.exists():
            found[rank] = json.loads(written.read_text())
    return found, reports


def report(folder: Path, form: str) -> tuple[int, str]:
    """``cgguard report --format FORM`` of a job's reports: its status and what it wrote."""
    done = subprocess.run(
        [sys.executable, "-m", "cgguard", "report", "--format", form, str(folder)],
        env=clean_environ(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.stderr == ""
    return done.returncode, done.stdout


def compared(folder: Path) -> dict[str, Any]:
    """What each view of the merged reports says of the ranks: the JSON view's ``ranks`` (its
    launcher's place left out), the text view's ranks section, the Markdown view's; and the
    status."""
    status, text = report(folder, "json")
    ranks = json.loads(text)["ranks"]
    launchers = ranks.pop("unidentified")
    assert len(launchers) == 1  # torchrun's own process, activated too: no rank identity
    _, text = report(folder, "text")
    section = text.split("\nranks: ", 1)[1].split("\n\n", 1)[0].splitlines()
    _, markdown = report(folder, "markdown")
    table = markdown.split("\n## Ranks\n\n", 1)[1].split("\n## ", 1)[0]
    return {"status": status, "json": ranks, "text": section, "markdown": table}


LEFT_OUT = "left out: 1 process without a rank identity or a capture manifest (a launcher, "


def test_ranks_that_agree_find_nothing(tmp_path: Path) -> None:
    """Both ranks capture alike: the check finds nothing on either, and the merged report says
    in one line that the ranks agree, in every view."""
    found, reports = run_job(tmp_path, "agree")
    assert found == {0: [], 1: []}
    agree = "2 ranks agree: 2 captures, 2 collectives inside them"
    assert compared(reports) == {
        "status": 0,
        "json": {"identified": [0, 1], "repeated": [], "agree": True, "divergence": []},
        "text": [agree, f"  {LEFT_OUT}CGGUARD_MANIFEST=0)"],
        "markdown": f"{agree}.\n\n{LEFT_OUT}CGGUARD\\_MANIFEST=0).\n",
    }


def test_a_rank_that_captures_one_more_graph_is_named_on_every_rank(tmp_path: Path) -> None:
    """Rank 1's third graph: both ranks name it, and the site's count."""
    found, reports = run_job(tmp_path, "extra_graph")
    site = SITE.format(line_of("with torch.cuda.graph(graphs[2]):"))
    expected = [
        {
            "kind": "extra_capture",
            "ranks": [1],
            "others": [0],
            "detail": f"rank 1 captured 1 more: capture 3 at {site} (call 1) is missing on rank 0",
            "capture": 3,
        },
        {
            "kind": "count",
            "ranks": [1],
            "others": [0],
            "detail": f"{site}: captured once on rank 1, 0 times on rank 0",
            "capture": None,
        },
    ]
    assert found == {0: expected, 1: expected}
    assert_reported(reports, expected)


def assert_reported(reports: Path, expected: list[dict[str, Any]]) -> None:
    """The merged reports name what the live check found, in every view; status 1."""
    said = compared(reports)
    count = len(expected)
    head = f"2 ranks compared: {count} difference{'s' if count != 1 else ''}, the ranks on each "
    assert said["status"] == 1
    assert said["json"] == {
        "identified": [0, 1],
        "repeated": [],
        "agree": False,
        "divergence": expected,
    }
    assert said["text"] == [
        f"{head}side named",
        *(f"  {d['kind']}: {d['detail']}" for d in expected),
        f"  {LEFT_OUT}CGGUARD_MANIFEST=0)",
    ]
    rows = [line for line in said["markdown"].splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[:4] for row in rows[2:]] == [
        [f"| {d['kind'].replace('_', chr(92) + '_')}", "1", "0", str(d["capture"] or "")]
        for d in expected
    ]


def test_a_rank_that_issues_one_more_all_reduce_is_named_at_its_capture(tmp_path: Path) -> None:
    """Rank 1's second all-reduce inside its second capture: named at that capture."""
    found, reports = run_job(tmp_path, "extra_allreduce")
    site = SITE.format(line_of("with torch.cuda.graph(graphs[1]):"))
    expected = [
        {
            "kind": "collectives",
            "ranks": [1],
            "others": [0],
            "detail": f"capture 2 at {site} (call 1): rank 1 issues 1 more collective than "
            "rank 0, the first all_reduce of 8 float32 over ranks [0, 1]",
            "capture": 2,
        }
    ]
    assert found == {0: expected, 1: expected}
    assert_reported(reports, expected)


def test_a_rank_that_never_reaches_the_check_is_named_within_the_timeout(tmp_path: Path) -> None:
    """Rank 1 leaves before the check: rank 0 names it once its timeout has passed. Both
    captured alike, which the merged report says."""
    found, reports = run_job(tmp_path, "absent")
    assert found == {
        0: [
            {
                "kind": "missing",
                "ranks": [1],
                "others": [0],
                "detail": "rank 1 did not reach the check in time; rank 0 did",
                "capture": None,
            }
        ]
    }
    said = compared(reports)
    assert (said["status"], said["json"]["agree"]) == (1, True)  # rank 0's rank_divergence
