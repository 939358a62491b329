"""Fleet metrics (cgguard._reporting.metrics) with the real prometheus_client: scraped over HTTP
from a guarded process, and summed across processes by its multiprocess collector; the numbers
(counters, the capture histogram, replays, skips by class) are the JSON report's."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import types
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import cgguard
from cgguard import _process
from cgguard._census.skip_classes import skip_class
from cgguard._reporting import metrics as _metrics

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import parser  # noqa: E402 - only where the client is importable

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Three captures at one site, and one more while capture is disabled (a violation, logged in
# log mode, and the capture goes ahead). With "replays", one more graph, replayed five times;
# with "skips" (given where torch has one), four cudagraphs skipped, told to torch's own
# counting function with messages as torch writes them. With "serve", it serves /metrics on
# 127.0.0.1, says its port, and waits for a line on stdin.
PROGRAM = """\
import sys

import torch

import cgguard


def capture():
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pass
    return graph


for _ in range(3):
    capture()
cgguard.set_capture_enabled(False)
capture()
cgguard.set_capture_enabled(True)
if "replays" in sys.argv:
    graph = capture()
    for _ in range(5):
        graph.replay()
if "skips" in sys.argv:
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    for message in (
        "skipping cudagraphs due to cpu device (arg0_1)",
        "skipping cudagraphs due to cpu device (arg7_1)",
        "skipping cudagraphs due to mutated inputs (2 instances). Found from : \\n  File x.py",
        "skipping cudagraphs due to a reason torch has yet to write",
    ):
        log_cudagraph_skip_and_bump_counter(message)
print("prometheus_client" in sys.modules, flush=True)
if "serve" in sys.argv:
    import prometheus_client

    server, _ = prometheus_client.start_http_server(0, addr="127.0.0.1")
    print(server.server_port, flush=True)
    sys.stdin.readline()
"""


def torch_counts_skips() -> bool:
    """Whether this torch has the counting function the program calls (torch 2.1 has none),
    read from its source without importing inductor."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    source = Path(spec.origin).parent / "_inductor" / "cudagraph_utils.py"
    return source.is_file() and "def log_cudagraph_skip_and_bump_counter(" in source.read_text()


# What the program's "skips" count, by class, where torch counts them.
SKIPS = {"cpu_device": 2, "mutated_inputs": 1, "other": 1} if torch_counts_skips() else {}
SKIPPING = ("skips",) if SKIPS else ()


def child_environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CGGUARD_", "PROMETHEUS_"))}
    return env | extra


def command(tmp_path: Path, report: Path, *options: str) -> list[str]:
    program = tmp_path / "metrics_program.py"
    program.write_text(PROGRAM)
    run = [sys.executable, "-m", "cgguard", "run", "--simulate-cuda", "--mode", "log"]
    return [*run, "--report", str(report), "--log-file", os.devnull, *options, str(program)]


BUCKET = "cgguard_capture_duration_seconds_bucket"


def samples(text: str) -> Samples:
    """cgguard's samples of a scrape, by name and labels, but the histogram's buckets."""
    return {
        key: value
        for key, value in all_samples(text).items()
        if key[0].startswith("cgguard_") and key[0] != BUCKET
    }


def all_samples(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parser.text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def buckets(text: str) -> dict[float, float]:
    """The capture histogram's buckets of a scrape, by upper bound."""
    return {
        float(dict(labels)["le"]): value
        for (name, labels), value in all_samples(text).items()
        if name == BUCKET
    }


def from_reports(*reports: dict[str, Any]) -> Samples:
    """The samples the reports' numbers call for, but the histogram's buckets."""
    expected: Samples = {}

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
            # Timed as the census times them: the captures that ended or failed.
            timed = site["outcomes"]["ended"] + site["outcomes"]["failed"]
            add("cgguard_capture_duration_seconds_count", (), timed)
            add("cgguard_capture_duration_seconds_sum", (), site["seconds"])
            if "replays" in site:  # only where replays are counted
                add("cgguard_graph_replays_total", (), site["replays"])
        for skip in report["cudagraph_skips"]:
            # Labelled by the class of torch's message, which the report keeps whole.
            reason = (("reason", skip_class(skip["example"])),)
            add("cgguard_cudagraph_skips_total", reason, skip["count"])
    return expected


def close_to(got: Samples, expected: Samples) -> bool:
    # The report rounds seconds to the nanosecond.
    return got.keys() == expected.keys() and all(
        abs(got[key] - expected[key]) < 1e-6 for key in expected
    )


def bucketed_as_reported(got: dict[float, float], *reports: dict[str, Any]) -> bool:
    """The buckets are the histogram's, cumulative, and hold every capture timed at or past
    the longest that the reports name."""
    sites = [site for report in reports for site in report["captures"]]
    timed = sum(site["outcomes"]["ended"] + site["outcomes"]["failed"] for site in sites)
    longest = max(site["max_seconds"] for site in sites)
    bounds = sorted(got)
    values = [got[bound] for bound in bounds]
    return (
        bounds == [*_metrics.CAPTURE_BUCKETS, float("inf")]
        and values == sorted(values)
        and all(got[bound] == timed for bound in bounds if bound >= longest)
    )


@pytest.mark.simulated
@pytest.mark.subprocess
def test_a_guarded_process_metrics_scraped_over_http_match_its_report(tmp_path: Path) -> None:
    """--metrics prometheus: the process's /metrics holds cgguard's counters and histogram,
    whose values are the report's counts, seconds, bytes, replays and skips (by class)."""
    report = tmp_path / "report.json"
    options = ("--metrics", "prometheus", "--census-replays")
    child = subprocess.Popen(
        [*command(tmp_path, report, *options), "serve", "replays", *SKIPPING],
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
            text = page.read().decode()
        child.stdin.write("\n")
        child.stdin.flush()
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    document = json.loads(report.read_text())
    expected = from_reports(document)
    assert expected[("cgguard_captures_total", (("outcome", "ended"),))] == 5
    assert expected[("cgguard_graph_replays_total", ())] == 5
    skips = {
        dict(labels)["reason"]: value
        for (name, labels), value in expected.items()
        if "skips" in name
    }
    assert skips == SKIPS
    scraped = samples(text)
    assert close_to(scraped, expected), (scraped, expected)
    assert bucketed_as_reported(buckets(text), document), buckets(text)


@pytest.mark.simulated
@pytest.mark.subprocess
def test_the_multiprocess_collector_sums_two_processes(tmp_path: Path) -> None:
    """PROMETHEUS_MULTIPROC_DIR: each process writes its own values, and the server's
    MultiProcessCollector reads both, summed as the two reports are, histogram and skips
    included; replays not counted show no replay counter."""
    folder = tmp_path / "prometheus"
    folder.mkdir()
    reports = []
    for i in range(2):
        report = tmp_path / f"report-{i}.json"
        result = subprocess.run(
            [*command(tmp_path, report), "replays", *SKIPPING],
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
    text = prometheus_client.generate_latest(registry).decode()
    expected = from_reports(*reports)
    assert expected[("cgguard_captures_total", (("outcome", "ended"),))] == 10
    skips = {
        dict(labels)["reason"]: value
        for (name, labels), value in expected.items()
        if "skips" in name
    }
    assert skips == {reason: 2 * count for reason, count in SKIPS.items()}
    scraped = samples(text)
    assert "cgguard_graph_replays_total" not in {name for name, _ in scraped}
    assert close_to(scraped, expected), (scraped, expected)
    assert bucketed_as_reported(buckets(text), *reports), buckets(text)


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


@pytest.mark.simulated
@pytest.mark.subprocess
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


@pytest.mark.simulated
@pytest.mark.subprocess
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


@pytest.mark.simulated
@pytest.mark.subprocess
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


def private_metrics() -> tuple[_metrics.Metrics, Any]:
    """cgguard's metrics, registered in a registry of their own, not the process's default."""
    registry = prometheus_client.CollectorRegistry()
    client = types.SimpleNamespace(
        Counter=functools.partial(prometheus_client.Counter, registry=registry),
        Histogram=functools.partial(prometheus_client.Histogram, registry=registry),
    )
    return _metrics.Metrics(client), registry


def test_captures_are_timed_in_a_histogram_as_the_census_times_them() -> None:
    """The captures that ended or failed are observed, in buckets from a millisecond to
    minutes, and summed in seconds; a refused or abandoned capture is counted, not timed."""
    metrics, registry = private_metrics()
    metrics.captured("ended", 0.003, None)
    metrics.captured("failed", 0.2, None)
    metrics.captured("abandoned", 5.0, None)  # how long cgguard took to notice
    metrics.captured("refused", 0.0, None)
    text = prometheus_client.generate_latest(registry).decode()
    below = {0.001: 0.0, 0.0025: 0.0, 0.005: 1.0, 0.01: 1.0, 0.025: 1.0, 0.05: 1.0, 0.1: 1.0}
    assert buckets(text) == below | dict.fromkeys(
        [*_metrics.CAPTURE_BUCKETS[7:], float("inf")], 2.0
    )
    assert samples(text) == {
        ("cgguard_captures_total", (("outcome", "ended"),)): 1.0,
        ("cgguard_captures_total", (("outcome", "failed"),)): 1.0,
        ("cgguard_captures_total", (("outcome", "abandoned"),)): 1.0,
        ("cgguard_captures_total", (("outcome", "refused"),)): 1.0,
        ("cgguard_capture_seconds_total", ()): 0.203,
        ("cgguard_capture_bytes_total", ()): 0.0,
        ("cgguard_capture_duration_seconds_count", ()): 2.0,
        ("cgguard_capture_duration_seconds_sum", ()): 0.203,
    }


def test_the_replay_counter_shows_once_replays_are_counted() -> None:
    """No replay counter until replays are counted; then 0, and each replay counted."""
    metrics, registry = private_metrics()

    def replays() -> dict[str, float]:
        text = prometheus_client.generate_latest(registry).decode()
        return {name: value for (name, _), value in samples(text).items() if "replays" in name}

    assert replays() == {}
    metrics.replayed(0)  # told at the first capture counted while replays are counted
    assert replays() == {"cgguard_graph_replays_total": 0.0}
    metrics.replayed(1)
    metrics.replayed(1)
    assert replays() == {"cgguard_graph_replays_total": 2.0}
