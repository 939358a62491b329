"""Fleet metrics (cgguard._reporting.metrics) with the real prometheus_client: scraped over HTTP
from a guarded process, and summed across processes by its multiprocess collector; the numbers are
the JSON report's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

import cgguard
from cgguard import _process
from cgguard._reporting import metrics as _metrics

if TYPE_CHECKING:
    from pathlib import Path

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import parser  # noqa: E402 - only where the client is importable

pytestmark = [pytest.mark.simulated, pytest.mark.subprocess]

# Three captures at one site, and one more while capture is disabled (a violation, logged in
# log mode, and the capture goes ahead). With "serve", it serves /metrics on 127.0.0.1, says its
# port, and waits for a line on stdin.
PROGRAM = """\
import sys

import torch

import cgguard


def capture():
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass


for _ in range(3):
    capture()
cgguard.set_capture_enabled(False)
capture()
cgguard.set_capture_enabled(True)
print("prometheus_client" in sys.modules, flush=True)
if "serve" in sys.argv:
    import prometheus_client

    server, _ = prometheus_client.start_http_server(0, addr="127.0.0.1")
    print(server.server_port, flush=True)
    sys.stdin.readline()
"""


def child_environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CGGUARD_", "PROMETHEUS_"))}
    return env | extra


def command(tmp_path: Path, report: Path, *options: str) -> list[str]:
    program = tmp_path / "metrics_program.py"
    program.write_text(PROGRAM)
    run = [sys.executable, "-m", "cgguard", "run", "--simulate-cuda", "--mode", "log"]
    return [*run, "--report", str(report), "--log-file", os.devnull, *options, str(program)]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """cgguard's samples of a scrape, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parser.text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("cgguard_") and not sample.name.endswith("_created")
    }


def from_reports(*reports: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples the reports' numbers call for."""
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def add(name: str, labels: tuple[tuple[str, str], ...], value: float) -> None:
        expected[(name, labels)] = expected.get((name, labels), 0.0) + value

    for report in reports:
        for rule, count in report["totals"].items():
            # Each violation of a report in log mode was logged.
            add("cgguard_violations_total", (("action", "logged"), ("rule", rule)), count)
        for site in report["captures"]:
            for outcome, count in site["outcomes"].items():
                if count:
                    add("cgguard_captures_total", (("outcome", outcome),), count)
            add("cgguard_capture_seconds_total", (), site["seconds"])
            add("cgguard_capture_bytes_total", (), site["bytes_reserved"] or 0)
    return expected


def close_to(
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> bool:
    # The report rounds seconds to the nanosecond.
    return got.keys() == expected.keys() and all(
        abs(got[key] - expected[key]) < 1e-6 for key in expected
    )


def test_a_guarded_process_metrics_scraped_over_http_match_its_report(tmp_path: Path) -> None:
    """--metrics prometheus: the process's /metrics holds cgguard's counters, whose values are
    the report's counts, seconds and bytes."""
    report = tmp_path / "report.json"
    child = subprocess.Popen(
        [*command(tmp_path, report, "--metrics", "prometheus"), "serve"],
        env=child_environ(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline().strip() == "True"  # asked for: imported
        port = int(child.stdout.readline())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as page:
            scraped = samples(page.read().decode())
        child.stdin.write("\n")
        child.stdin.flush()
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    document = json.loads(report.read_text())
    expected = from_reports(document)
    assert expected[("cgguard_captures_total", (("outcome", "ended"),))] == 4
    assert close_to(scraped, expected), (scraped, expected)


def test_the_multiprocess_collector_sums_two_processes(tmp_path: Path) -> None:
    """PROMETHEUS_MULTIPROC_DIR: each process writes its own values, and the server's
    MultiProcessCollector reads both, summed as the two reports are."""
    folder = tmp_path / "prometheus"
    folder.mkdir()
    reports = []
    for i in range(2):
        report = tmp_path / f"report-{i}.json"
        result = subprocess.run(
            command(tmp_path, report),
            env=child_environ(CGGUARD_METRICS="prometheus", PROMETHEUS_MULTIPROC_DIR=str(folder)),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr
        reports.append(json.loads(report.read_text()))
    from prometheus_client import multiprocess

    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(folder))
    scraped = samples(prometheus_client.generate_latest(registry).decode())
    expected = from_reports(*reports)
    assert expected[("cgguard_captures_total", (("outcome", "ended"),))] == 8
    assert close_to(scraped, expected), (scraped, expected)


# As SGLang does: PROMETHEUS_MULTIPROC_DIR set after torch's import (where cgguard is
# configured), then prometheus_client imported by the program, before its first capture or
# after it ("late").
LATE_MULTIPROC_PROGRAM = """\
import os
import sys

import torch

os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]


def capture():
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass


if "late" in sys.argv:
    capture()
import prometheus_client

prometheus_client.Counter("app_requests", "the program's own").inc()
capture()
print(prometheus_client.values.ValueClass.__name__, flush=True)
"""


@pytest.mark.parametrize("order", ["imported first", "late"])
def test_a_multiproc_dir_set_after_torchs_import_holds_the_programs_and_cgguards_values(
    tmp_path: Path, order: str
) -> None:
    """PROMETHEUS_MULTIPROC_DIR set by the program after ``import torch``: prometheus_client
    is still in multiprocess mode, and its folder holds the program's counter and cgguard's."""
    folder = tmp_path / "prometheus"
    folder.mkdir()
    program = tmp_path / "late_multiproc_program.py"
    program.write_text(LATE_MULTIPROC_PROGRAM)
    run = [sys.executable, "-m", "cgguard", "run", "--simulate-cuda", "--metrics", "prometheus"]
    result = subprocess.run(
        [*run, "--log-file", os.devnull, str(program), str(folder), order],
        env=child_environ(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "MmapedValue\n"), result.stderr
    from prometheus_client import multiprocess

    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(folder))
    scraped = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parser.text_string_to_metric_families(
            prometheus_client.generate_latest(registry).decode()
        )
        for sample in family.samples
        if sample.name in {"app_requests_total", "cgguard_captures_total"}
    }
    assert scraped == {
        ("app_requests_total", ()): 1.0,
        ("cgguard_captures_total", (("outcome", "ended"),)): 2.0 if order == "late" else 1.0,
    }


def test_prometheus_client_is_never_imported_unless_asked(tmp_path: Path) -> None:
    """Without metrics asked for, a guarded process never imports prometheus_client."""
    result = subprocess.run(
        command(tmp_path, tmp_path / "report.json"),
        env=child_environ(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "False\n"), result.stderr


def test_metrics_without_the_client_is_one_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """prometheus_client not importable: one line naming the setting, and no metrics."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setattr(_metrics, "_registered", [])
    cgguard.install(cgguard.Config(log_file=os.devnull, metrics="prometheus"))
    cgguard.install(cgguard.Config(log_file=os.devnull, metrics="prometheus"))
    assert _process.PROCESS.prometheus.active() is None
    assert capsys.readouterr().err == (
        "cgguard: metrics='prometheus' (CGGUARD_METRICS) needs prometheus_client, which is not "
        "importable here: no metrics (pip install 'cgguard[metrics]')\n"
    )
