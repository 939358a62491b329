"""The capture census (cgguard._data.census): every capture counted per site, in census(), the exit
summary, the JSON report and cgguard report, on the simulated runtime."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

import cgguard
from cgguard import _process
from cgguard._census import watcher as _watcher
from cgguard._census.watcher import CensusWatcher
from cgguard._core import hooks
from cgguard._core.probes import NO_TORCH
from cgguard._core.tracker import Tracker
from cgguard._data import census as _census
from cgguard._data import census_merge as _census_merge
from cgguard._data.census import Census, skip_reason
from cgguard._data.ledger import Run
from cgguard._gate.flags import CaptureFlag
from cgguard._reporting import log as _log
from cgguard._reporting.reporter import Reporter
from cgguard.testing import simulated_cuda

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.simulated

REPLAY = "torch.cuda.graphs.CUDAGraph.replay"

# Three captures at one site, two at another, the second of them refused. The census's clock
# is replaced by one that moves STEP seconds at each reading, so that each capture that runs
# takes exactly STEP seconds (one reading at its begin, one at its end): the census reads it at
# the begin, and the capture path where it stamps the end (cgguard._core.watcher.Watcher).
PROGRAM = """\
import json
import sys

import torch

import cgguard
from cgguard._census import watcher as _watcher
from cgguard._core import hooks as _capture

STEP = float(sys.argv[1])
ticks = iter(range(1, 1_000_000))
_watcher.perf_counter = _capture.perf_counter = lambda: next(ticks) * STEP


def three():
    for _ in range(3):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):  # site-three
            pass


def two():
    for allowed in (True, False):
        cgguard.set_capture_enabled(allowed)
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):  # site-two
                pass
        except cgguard.CaptureViolation:
            pass
    cgguard.set_capture_enabled(True)


three()
if "--only-three" not in sys.argv:
    two()
print(json.dumps(cgguard.census()))
"""

OUTCOMES = ("ended", "failed", "refused", "abandoned")


def outcomes(**counts: int) -> dict[str, int]:
    return {name: counts.get(name, 0) for name in OUTCOMES}


def line_of(path: Path, marker: str) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# {marker}"))


def expected_sites(path: Path, step: float) -> list[dict[str, Any]]:
    """The census of PROGRAM, written out by hand from what it does."""
    return [
        {
            "file": str(path),
            "line": line_of(path, "site-three"),
            "function": "three",
            "count": 3,
            "seconds": 3 * step,
            "max_seconds": step,
            "bytes_reserved": None,  # the simulated runtime has no allocator to ask
            "bytes_allocated": None,
            "outcomes": outcomes(ended=3),
            "errors": {},
            "apis": {"torch.cuda.graph": 3},
            "modes": {"global": 3},
            "threads": {"MainThread": 3},
            "pools": {"private": 3},
            "devices": None,
        },
        {
            "file": str(path),
            "line": line_of(path, "site-two"),
            "function": "two",
            "count": 2,
            "seconds": step,  # the refused one never began
            "max_seconds": step,
            "bytes_reserved": None,
            "bytes_allocated": None,
            "outcomes": outcomes(ended=1, refused=1),
            "errors": {},
            "apis": {"torch.cuda.graph": 2},
            "modes": {"global": 2},
            "threads": {"MainThread": 2},
            "pools": {"private": 1},
            "devices": None,
        },
    ]


def child_environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")}
    return env | extra


def run_guarded(
    tmp_path: Path, *args: str, options: tuple[str, ...] = (), **env: str
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    program = tmp_path / "census_program.py"
    program.write_text(PROGRAM)
    command = [sys.executable, "-m", "cgguard", "run", "--simulate-cuda", *options]
    result = subprocess.run(
        [*command, str(program), *args],
        env=child_environ(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return program, result


@pytest.mark.subprocess
def test_the_census_of_a_run_is_the_same_in_census_the_summary_and_the_report(
    tmp_path: Path,
) -> None:
    """3 captures at one site, 2 at another (one refused): exactly those counts, outcomes and
    seconds in census(), the cgguard.census exit event and the report's captures."""
    log, report = tmp_path / "events.jsonl", tmp_path / "report.json"
    options = ("--report", str(report), "--log-file", str(log), "--log-format", "json")
    program, result = run_guarded(tmp_path, "0.25", options=options)
    assert result.returncode == 0, result.stderr
    sites = expected_sites(program, 0.25)
    assert json.loads(result.stdout) == {"captures": sites, "cudagraph_skips": []}
    events = [json.loads(line) for line in log.read_text().splitlines()]
    census = [event for event in events if event["event"] == "cgguard.census"]
    assert len(census) == 1
    assert (census[0]["message"], census[0]["totals"], census[0]["captures"]) == (
        "5 captures at 2 sites, 1.000000 s, bytes not measured; 0 compiled graphs skipped",
        {
            "captures": 5,
            "sites": 2,
            "seconds": 1.0,
            "bytes_reserved": None,
            "bytes_allocated": None,
            "outcomes": outcomes(ended=4, refused=1),
            "cudagraph_skips": 0,
        },
        sites,  # the slowest first: 0.75 s, then 0.25 s
    )
    document = json.loads(report.read_text())
    assert (document["schema"], document["captures"], document["cudagraph_skips"]) == (
        2,
        sites,
        [],
    )


@pytest.mark.subprocess
def test_the_console_summary_is_one_line_of_totals_and_the_top_sites(tmp_path: Path) -> None:
    """In the console format: the totals' line, then one line per site, slowest first."""
    program, result = run_guarded(tmp_path, "0.5", CGGUARD_LOG_FORMAT="console")
    assert result.returncode == 0, result.stderr
    three, two = line_of(program, "site-three"), line_of(program, "site-two")
    summary = result.stderr[result.stderr.index("cgguard.census") :].splitlines()
    assert summary[0].split("message=")[1].split(" pid=")[0] == (
        "'5 captures at 2 sites, 2.000000 s, bytes not measured; 0 compiled graphs skipped'"
    )
    assert summary[1:4] == [
        "top capture sites (by seconds):",
        f"  {program}:{three} (in three): 3 captures (ended 3), 1.500000 s, bytes not measured",
        f"  {program}:{two} (in two): 2 captures (ended 1, refused 1), 0.500000 s, "
        "bytes not measured",
    ]


@pytest.mark.subprocess
def test_two_processes_merge_into_one_census_naming_the_slower(tmp_path: Path) -> None:
    """cgguard report sums each site across processes and names the slowest process, per site
    and for the job, in every format."""
    folder = tmp_path / "reports"
    folder.mkdir()
    options = ("--report", str(folder / "r-{pid}.json"), "--log-file", os.devnull)
    pids = []
    for step in ("0.25", "1.0"):
        before = set(os.listdir(folder))
        program, result = run_guarded(tmp_path, step, options=options)
        assert result.returncode == 0, result.stderr
        (written,) = set(os.listdir(folder)) - before
        pids.append(int(written.removeprefix("r-").removesuffix(".json")))
    slow = pids[1]
    merged = subprocess.run(
        [sys.executable, "-m", "cgguard", "report", "--format", "json", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert merged.returncode == 1  # the refused capture is a violation in each
    view = json.loads(merged.stdout)
    host = view["hosts"][0]
    three, two = expected_sites(program, 1.25)  # the two processes' seconds, 0.25 + 1.0 each
    three.update(count=6, max_seconds=1.0, processes=2)
    three.update(outcomes=outcomes(ended=6), apis={"torch.cuda.graph": 6})
    three.update(modes={"global": 6}, threads={"MainThread": 6}, pools={"private": 6})
    three["slowest"] = {"pid": slow, "host": host, "rank": None, "seconds": 3.0, "count": 3}
    two.update(count=4, seconds=1.25, max_seconds=1.0, processes=2)
    two.update(outcomes=outcomes(ended=2, refused=2), apis={"torch.cuda.graph": 4})
    two.update(modes={"global": 4}, threads={"MainThread": 4}, pools={"private": 2})
    two["slowest"] = {"pid": slow, "host": host, "rank": None, "seconds": 1.0, "count": 2}
    assert (view["captures"], view["cudagraph_skips"], view["slowest_capturing"]) == (
        [three, two],
        [],
        {"host": host, "pid": slow, "rank": None, "seconds": 4.0, "captures": 5},
    )
    text = subprocess.run(
        [sys.executable, "-m", "cgguard", "report", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    assert (
        f"census: 10 captures at 2 sites in 2 processes, 5.000000 s; 0 compiled graphs skipped; "
        f"slowest process {host} pid {slow}: 4.000000 s (the next 1.000000 s)"
    ) in text.splitlines()
    markdown = subprocess.run(
        [sys.executable, "-m", "cgguard", "report", "--format", "markdown", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    assert "## Captures" in markdown
    assert f"| 2 | {host} pid {slow} (3.000000 s) |" in markdown


@pytest.mark.subprocess
def test_a_census_only_process_writes_a_report_cgguard_report_reads_with_status_0(
    tmp_path: Path,
) -> None:
    """No violation, captures counted: the report is written, and reads as no violation."""
    report = tmp_path / "report.json"
    options = ("--report", str(report), "--log-file", os.devnull)
    _, result = run_guarded(tmp_path, "0.25", "--only-three", options=options)
    assert result.returncode == 0, result.stderr
    merged = subprocess.run(
        [sys.executable, "-m", "cgguard", "report", "--format", "json", str(report)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert merged.returncode == 0, merged.stderr
    (site,) = json.loads(merged.stdout)["captures"]
    assert (site["count"], site["seconds"], site["outcomes"]) == (3, 0.75, outcomes(ended=3))


@pytest.fixture
def installed() -> Iterator[None]:
    with simulated_cuda():
        cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
        yield


def captured() -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.zeros(2).add_(1)
    return graph


def counts() -> list[tuple[int, dict[str, int]]]:
    return [(site["count"], site["outcomes"]) for site in cgguard.census()["captures"]]


def test_replays_are_counted_per_site_when_asked(installed: None) -> None:
    """census_replays: replays per site, and the graphs captured there and never replayed."""
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull, census_replays=True))
    assert REPLAY in cgguard.status().patched
    graphs = [captured() for _ in range(3)]
    graphs[0].replay()
    graphs[0].replay()
    graphs[2].replay()
    (site,) = cgguard.census()["captures"]
    assert (site["count"], site["replays"], site["never_replayed"]) == (3, 3, 1)


def test_without_replays_asked_replay_is_untouched_and_nothing_speaks_of_replays(
    installed: None,
) -> None:
    """By default torch's replay is its own, and no entry has replay keys."""
    real = vars(torch.cuda.graphs.CUDAGraph)["replay"]
    assert REPLAY not in cgguard.status().patched
    captured().replay()
    assert vars(torch.cuda.graphs.CUDAGraph)["replay"] is real
    (site,) = cgguard.census()["captures"]
    assert ("replays" in site, "never_replayed" in site) == (False, False)


def test_a_failed_capture_is_counted_with_its_error_type(installed: None) -> None:
    """torch refuses a capture on the default stream: failed, by its error's type."""
    before = time.perf_counter()
    with pytest.raises(RuntimeError, match="non-default stream"):
        torch.cuda.CUDAGraph().capture_begin()
    took = time.perf_counter() - before
    (site,) = cgguard.census()["captures"]
    assert (site["outcomes"], site["errors"], site["apis"]) == (
        outcomes(failed=1),
        {"SimulatedCudaError": 1},
        {"CUDAGraph.capture_begin": 1},
    )
    # Its time up to torch's refusal, from its begin's clock: no more than the call took.
    assert 0.0 < site["seconds"] <= took


def test_a_capture_left_open_by_an_ended_thread_is_counted_abandoned(installed: None) -> None:
    """Its thread ended mid-capture: abandoned, with no seconds (only cgguard's delay)."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()

    def begin() -> None:
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")

    worker = threading.Thread(target=begin, name="worker")
    worker.start()
    worker.join()
    captured()  # the next attempt sweeps the ended thread's capture
    by_outcome = {
        next(k for k, v in s["outcomes"].items() if v): s for s in cgguard.census()["captures"]
    }
    abandoned = by_outcome["abandoned"]
    assert (abandoned["seconds"], abandoned["threads"], abandoned["modes"]) == (
        0.0,
        {"worker": 1},
        {"thread_local": 1},
    )


def test_a_shared_pool_is_named_by_its_handle(installed: None) -> None:
    """A capture into another graph's pool names that pool."""
    first = captured()
    pool = first.pool()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        pass
    pools = [site["pools"] for site in cgguard.census()["captures"]]
    assert pools == [{"private": 1}, {f"shared {pool!r}": 1}]


def test_reconfiguration_keeps_the_census_and_off_stops_it(installed: None) -> None:
    """install(Config) again keeps what was counted; census=False counts nothing more and
    census() says nothing, status() says it is off."""
    captured()
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull, vllm_bridge=False))
    captured()  # the same site: captured()'s own line
    assert counts() == [(2, outcomes(ended=2))]
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull, census=False))
    captured()
    assert (cgguard.status().census, cgguard.census()) == (
        False,
        {"captures": [], "cudagraph_skips": []},
    )
    installation = _process.PROCESS.installation
    assert installation is not None
    assert [s.count for s in installation.run.census.sites()] == [2]


def test_uninstall_leaves_no_census(installed: None) -> None:
    """After uninstall, census() is empty."""
    captured()
    cgguard.uninstall()
    assert cgguard.census() == {"captures": [], "cudagraph_skips": []}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_with_an_empty_census(installed: None) -> None:
    """The parent's captures are the parent's: the child counts only its own."""
    captured()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            before = cgguard.census()["captures"]
            captured()
            after = [s["count"] for s in cgguard.census()["captures"]]
            os.write(write, json.dumps([before, after]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert seen == [[], [1]]
    assert counts() == [(1, outcomes(ended=1))]


class _Graph:
    """A graph as the capture path sees one: torch's capture_begin and capture_end, doing
    nothing (the capture path's own cost and bookkeeping are what is measured)."""

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        pass

    def capture_end(self) -> None:
        pass


def path_without_torch(census: Census, probe: Any = None) -> tuple[Any, Any, Any]:
    """The real capture path (cgguard._core.tracker.Tracker) over _Graph, with a census watcher
    whose memory probe is ``probe``: a capture_begin of a graph, capture_end, and the
    capture_begin hook itself (whose caller is the capture's site)."""
    reporter = Reporter(cgguard.Config(mode="log"), Run(census), listeners=[])
    tracker = Tracker(NO_TORCH, reporter, flag=CaptureFlag(), follows=[])
    tracker.set_watchers((CensusWatcher(census, replays=False, memory=lambda: probe),))
    end = hooks.capture_end(tracker, _Graph.capture_end)
    hook = hooks.capture_begin(tracker, _Graph.capture_begin)

    def begin(graph: _Graph, *args: Any, **kwargs: Any) -> None:
        hook(graph, *args, **kwargs)

    return begin, end, hook


def waiting(census: Census) -> int:
    """How many captures wait in the census's pending lists, all sites together."""
    return sum(len(site.pending) for site in census.sites_at.values())


def test_a_hundred_thousand_captures_at_one_site_are_one_aggregate() -> None:
    """Bounded: one site's aggregate, whatever the number of captures there, and at most
    PENDING_MAX of them waiting to be counted."""
    census = Census()
    begin, end, _ = path_without_torch(census)
    graph = _Graph()
    longest = 0
    for _ in range(100_000):
        begin(graph)
        end(graph)
        longest = max(longest, waiting(census))
    (site,) = census.sites()
    assert (len(census), site.count, site.outcomes["ended"], len(site.kinds), longest) == (
        1,
        100_000,
        100_000,
        1,
        _census.PENDING_MAX,
    )


def test_a_measured_capture_counts_the_growth_its_probe_reads_at_each_end() -> None:
    """With a memory probe (a device's allocator statistics), each capture is counted as it
    ends with the growth read at its two ends; where the probe reads nothing (CUDA not yet
    initialised), the capture is stamped as a plain one and its bytes stay unmeasured."""
    readings = iter([(0, 100, 10), (0, 160, 30), (0, 160, 30), (0, 200, 35)])
    census = Census()
    begin, end, _ = path_without_torch(census, probe=lambda: next(readings))
    graph = _Graph()
    for _ in range(2):
        begin(graph)
        end(graph)
    (site,) = census.sites_at.values()
    assert (site.count, site.pending) == (2, [])  # counted as they ended, none left waiting
    (entry,) = census.captures()
    assert (entry["count"], entry["bytes_reserved"], entry["bytes_allocated"]) == (2, 100, 25)
    assert entry["devices"] == {"cuda:0": 2}
    unmeasured = Census()
    begin, end, _ = path_without_torch(unmeasured, probe=lambda: None)
    begin(graph)
    end(graph)
    (site,) = unmeasured.sites_at.values()
    assert (site.count, len(site.pending)) == (0, 1)  # stamped, waiting for the next fold
    (entry,) = unmeasured.captures()
    assert (entry["count"], entry["outcomes"]["ended"], entry["bytes_reserved"]) == (1, 1, None)


def test_two_lines_of_one_function_are_two_sites() -> None:
    """Captures alternating between two lines of one function: each line its own site, though
    the last site found is remembered by its code."""
    census = Census()
    _, end, hook = path_without_torch(census)
    graph = _Graph()
    for _ in range(3):
        hook(graph)  # @first
        end(graph)
        hook(graph)  # @second
        end(graph)
    this_file = Path(__file__)
    assert sorted((e["line"], e["count"]) for e in census.captures()) == [
        (line_of(this_file, "@first"), 3),
        (line_of(this_file, "@second"), 3),
    ]


def test_captures_at_many_sites_keep_at_most_pending_max_waiting_in_all() -> None:
    """The bound on captures waiting to be counted is the process's, not each site's: 500
    sites of 1,024 captures each, never read, keep at most PENDING_MAX waiting."""
    census = Census()
    _, end, hook = path_without_torch(census)
    graph = _Graph()
    # One function per site, as generated code has: each calls the capture_begin hook itself.
    source = "def at_site(hook, end, graph):\n    for _ in range(1024):\n"
    source += "        hook(graph)\n        end(graph)\n"
    for i in range(500):
        namespace: dict[str, Any] = {}
        exec(compile(source, f"/srv/generated_{i}.py", "exec"), namespace)  # noqa: S102
        namespace["at_site"](hook, end, graph)
    assert waiting(census) <= _census.PENDING_MAX
    entries = census.captures()
    assert (len(entries), {e["count"] for e in entries}) == (500, {1024})


def test_captures_on_threads_read_meanwhile_are_each_counted_once() -> None:
    """Four threads capture at one site while a fifth reads the census over and over: every
    capture is counted once, whichever thread folds it."""
    census = Census()
    begin, end, _ = path_without_torch(census)
    each, stop = 3000, threading.Event()

    def capture() -> None:
        graph = _Graph()
        for _ in range(each):
            begin(graph, capture_error_mode="thread_local")
            end(graph)

    def read() -> None:
        while not stop.is_set():
            census.captures()

    reader = threading.Thread(target=read)
    reader.start()
    workers = [threading.Thread(target=capture, name=f"w{i}") for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stop.set()
    reader.join()
    (entry,) = census.captures()
    assert (entry["count"], entry["outcomes"]["ended"], entry["threads"]) == (
        4 * each,
        4 * each,
        {f"w{i}": each for i in range(4)},
    )


def test_captures_begun_and_never_ended_keep_the_pending_list_bounded_by_them() -> None:
    """A site with more captures under way than PENDING_MAX keeps each (in its count, in no
    outcome), and folds only when its list has doubled since: not at every capture."""
    census = Census()
    begin, end, _ = path_without_torch(census)
    folds = 0
    fold = census.fold

    def counting() -> None:
        nonlocal folds
        folds += 1
        fold()

    census.fold = counting  # type: ignore[method-assign]  # the capture path's folds
    graphs = [_Graph() for _ in range(3 * _census.PENDING_MAX)]
    for graph in graphs:
        begin(graph)  # one capture each, none ended
    assert folds == 2  # at PENDING_MAX waiting, then at twice that: not at every capture
    (entry,) = census.captures()
    assert (entry["count"], sum(entry["outcomes"].values())) == (len(graphs), 0)
    for graph in graphs:
        end(graph)
    (entry,) = census.captures()
    assert (entry["count"], entry["outcomes"]["ended"]) == (len(graphs), len(graphs))


def test_a_fold_between_a_captures_entry_and_its_clock_finds_it_under_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another thread may fold the census after a capture's entry is in its site's list and
    before its begin read the clock: the capture is under way then, and counted once, as it
    ended, with its own seconds."""
    census = Census()
    begin, end, _ = path_without_torch(census)
    graph = _Graph()
    begin(graph)  # the first capture: its site is found, and the census known to be plain
    end(graph)
    clock = iter([10.0, 10.5])  # the second capture's begin, then its end
    seen: list[dict[str, Any]] = []

    def folding_clock() -> float:
        if not seen:  # at its begin: what a fold on another thread would count
            seen.extend(census.captures(fresh=True))
        return next(clock)

    monkeypatch.setattr(_watcher, "perf_counter", folding_clock)
    monkeypatch.setattr(hooks, "perf_counter", folding_clock)
    begin(graph)
    end(graph)
    monkeypatch.undo()
    ((during,), (after,)) = (seen, census.captures(fresh=True))
    assert (during["count"], during["outcomes"]["ended"]) == (2, 1)  # one open, one ended
    assert (after["count"], after["outcomes"]["ended"]) == (2, 2)
    assert after["seconds"] - during["seconds"] == pytest.approx(0.5)


def test_captures_of_threads_that_have_ended_are_counted_by_their_names() -> None:
    """Plain captures of two threads, both ended before anything is read: one batch of two
    kinds whose threads are gone, counted under each thread's name."""
    census = Census()
    begin, end, _ = path_without_torch(census)

    def capture(times: int) -> None:
        graph = _Graph()
        for _ in range(times):
            begin(graph, capture_error_mode="thread_local")
            end(graph)

    workers = [threading.Thread(target=capture, args=(n,), name=f"t{n}") for n in (2, 3)]
    for worker in workers:
        worker.start()
        worker.join()
    (entry,) = census.captures()
    assert (entry["count"], entry["threads"]) == (5, {"t2": 2, "t3": 3})


def test_distinct_kinds_at_a_site_are_bounded() -> None:
    """A pool of threads with fresh names keeps at most KINDS_MAX kinds, the rest "other"."""
    census = Census()
    site = census.site((test_distinct_kinds_at_a_site_are_bounded.__code__, 10))
    for i in range(_census.KINDS_MAX + 10):
        kind = ("torch.cuda.graph", "global", f"t{i}", "private", None)
        census.capture(site, kind, "ended", None, 0.0)
    (entry,) = census.captures()
    assert (len(entry["threads"]), entry["threads"]["other"]) == (_census.KINDS_MAX + 1, 10)


def test_a_fold_counts_each_kind_of_a_mixed_batch() -> None:
    """Plain captures of two kinds at one site, folded in one batch, count under each."""
    census = Census()
    begin, end, _ = path_without_torch(census)
    graph = _Graph()
    for i in range(10):
        if i % 3:
            begin(graph, capture_error_mode="relaxed")
        else:
            begin(graph, pool=(0, 7))
        end(graph)
    (entry,) = census.captures()
    assert (entry["count"], entry["pools"], entry["modes"]) == (
        10,
        {"private": 6, "shared (0, 7)": 4},
        {"relaxed": 6, "global": 4},
    )


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("skipping cudagraphs due to cpu device (arg0_1)", "cpu device"),
        (
            "skipping cudagraphs due to cpu device (arg0_1). Found from : \n"
            '   File "model.py", line 3, in forward',
            "cpu device",
        ),
        ("skipping cudagraphs due to mutated inputs (2 instances)", "mutated inputs"),
        ("skipping cudagraphs due to multiple devices: ", "multiple devices"),
        (
            "skipping cudagraphs due to skipping cudagraphs due to multiple devices: "
            "device(type='cuda', index=0), device(type='cpu')",
            "multiple devices",
        ),
        ("skipping cudagraphs due to incompatible op (nonzero_1)", "incompatible op"),
        (
            # torch/_inductor/compile_fx.py: "Found from" after a space alone.
            "skipping cudagraphs due to disabling cudagraphs due to incompatible op "
            'aten.nonzero.default Found from \n  File "/srv/model.py", line 3, in forward\n'
            "    y = x.nonzero()\n",
            "disabling cudagraphs due to incompatible op aten.nonzero.default",
        ),
        ("", "unknown"),
    ],
)
def test_skip_reasons_are_grouped_without_names(message: str, reason: str) -> None:
    """One cause at many nodes is one reason: node names, lists and stack traces dropped."""
    assert skip_reason(message) == reason


def test_distinct_skips_are_bounded_and_each_keeps_its_first_message() -> None:
    """Skips of one reason at one site are one entry, with the first full message."""
    census = Census()
    code = test_distinct_skips_are_bounded_and_each_keeps_its_first_message.__code__
    census.skipped("skipping cudagraphs due to cpu device (arg0_1)", (code, 4))
    census.skipped("skipping cudagraphs due to cpu device (arg7_1)", (code, 4))
    for i in range(_census.SKIPS_MAX + 5):
        census.skipped(f"skipping cudagraphs due to reason {'x' * (i % 7)}{i}", (code, i))
    skips = census.skips()
    assert len(skips) == _census.SKIPS_MAX
    assert (skips[0]["reason"], skips[0]["count"], skips[0]["example"]) == (
        "cpu device",
        2,
        "skipping cudagraphs due to cpu device (arg0_1)",
    )


@pytest.mark.subprocess
def test_the_probe_prints_a_census_of_its_own_captures() -> None:
    """probe --census: three captures at one site; on the simulated runtime it says so, and
    bytes are not measured."""
    result = subprocess.run(
        [sys.executable, "-m", "cgguard.testing.probe", "--census"],
        env=child_environ(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    where = "on cgguard's simulated CUDA runtime (no GPU; not a GPU result)"
    assert lines[0] == f"census of the probe's own captures, {where}:"
    assert lines[1].startswith("  3 captures at 1 site, ")
    assert lines[1].endswith(" s, bytes not measured; 0 compiled graphs skipped")
    assert lines[2].startswith("  <cgguard census probe>:6 (in capture): 3 captures (ended 3), ")
    assert lines[2].endswith(" s, bytes not measured; devices None")


def test_the_reports_entries_follow_each_change_of_their_site(installed: None) -> None:
    """An entry built for the report is reused only while its site is unchanged."""
    installation = _process.PROCESS.installation
    assert installation is not None
    census = installation.run.census
    captured()
    first = census.captures()
    assert census.captures()[0] is first[0]  # unchanged: the same entry, encoded once
    captured()
    (entry,) = census.captures()
    assert (first[0]["count"], entry["count"], entry["outcomes"]) == (1, 2, outcomes(ended=2))


def test_a_site_without_a_file_is_an_unknown_site_in_the_merged_text() -> None:
    """cgguard report's text names a capture or a skip whose file is not known "an unknown
    site", as its Markdown does."""
    from cgguard._data.census_merge import CensusMerge, site_text, skip_text

    unknown = {
        "file": None,
        "line": None,
        "function": None,
        "count": 2,
        "seconds": 0.5,
        "max_seconds": 0.25,
        "bytes_reserved": None,
        "bytes_allocated": None,
        "outcomes": outcomes(ended=2),
        "errors": {},
        "apis": {"torch.cuda.graph": 2},
        "modes": {"global": 2},
        "threads": {"MainThread": 2},
        "pools": {"private": 2},
        "devices": None,
    }
    skip = {"reason": "cpu device", "count": 1, "example": "", "file": None, "line": None}
    merge = CensusMerge()
    merge.add("host", 7, None, [unknown], [{**skip, "function": None}])
    assert [site_text(entry) for entry in merge.captures()] == [
        "an unknown site: 2 captures (ended 2), 0.500000 s, bytes not measured"
    ]
    assert [skip_text(s) for s in merge.cudagraph_skips()] == ["cpu device: 1 at an unknown site"]


def test_replays_turned_on_later_leave_the_graphs_captured_before_out(installed: None) -> None:
    """census_replays switched on by reconfiguration: a graph captured before is neither
    counted as replayed nor as never replayed; those captured after are."""
    before = captured()
    cgguard.install(cgguard.Config(mode="log", log_file=os.devnull, census_replays=True))
    replayed, _never = captured(), captured()
    for _ in range(5):
        before.replay()
    replayed.replay()
    replayed.replay()
    (site,) = cgguard.census()["captures"]
    assert (site["count"], site["replays"], site["never_replayed"]) == (3, 2, 1)


def test_a_capture_still_open_when_the_census_is_read_is_in_its_count(installed: None) -> None:
    """count is every capture begun: one not ended yet is counted, in no outcome, and gets its
    outcome once it ends."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        graph.capture_begin()
        try:
            assert counts() == [(1, outcomes())]
            (site,) = cgguard.census()["captures"]
            line = _census_merge.site_text(site)
            assert line[line.index(": ") :].startswith(": 1 capture (open 1), ")
        finally:
            graph.capture_end()
    assert counts() == [(1, outcomes(ended=1))]


def test_the_exit_event_shows_the_most_counted_skips_with_their_examples_cut() -> None:
    """The cgguard.census event lists the five most counted skips, each example cut to 200
    characters; its totals, and the census itself, keep every skip whole."""
    from cgguard._reporting import events as _events

    census = Census()
    code = test_the_exit_event_shows_the_most_counted_skips_with_their_examples_cut.__code__
    long = "skipping cudagraphs due to cpu device (arg0_1). Found from\n" + "  x\n" * 300
    for i in range(8):  # reason i, counted i + 1 times, at line i
        for _ in range(i + 1):
            census.skipped(f"skipping cudagraphs due to reason {chr(97 + i)}", (code, i))
    for _ in range(20):
        census.skipped(long, (code, 99))
    event = _events.census(census)
    shown = [(s["reason"], s["count"], s["example"]) for s in event["cudagraph_skips"]]
    assert shown == [
        ("cpu device", 20, long[:200]),
        ("reason h", 8, "skipping cudagraphs due to reason h"),
        ("reason g", 7, "skipping cudagraphs due to reason g"),
        ("reason f", 6, "skipping cudagraphs due to reason f"),
        ("reason e", 5, "skipping cudagraphs due to reason e"),
    ]
    assert event["totals"]["cudagraph_skips"] == 56  # 1 + ... + 8, and 20
    assert [s["example"] for s in census.skips()][-1] == long.strip()


def test_the_console_summary_names_a_site_without_a_file_an_unknown_site() -> None:
    """The exit summary's lines, like cgguard report's, say "an unknown site" where a capture's
    or a skip's file is not known."""

    site = {
        "file": None,
        "line": None,
        "function": None,
        "count": 1,
        "seconds": 0.25,
        "bytes_reserved": None,
        "outcomes": outcomes(ended=1),
    }
    skip = {"reason": "cpu device", "count": 3, "file": None, "line": None, "function": None}
    event = {"event": "cgguard.census", "captures": [site], "cudagraph_skips": [skip]}
    assert _log._census_as_text(None, "info", event)["stack"] == (
        "top capture sites (by seconds):\n"
        "  an unknown site: 1 capture (ended 1), 0.250000 s, bytes not measured\n"
        "torch.compile's skipped cudagraphs:\n"
        "  cpu device: 3 at an unknown site"
    )


def captures_in_code(census: Census, names: Iterator[str], source: str) -> weakref.ref[Any]:
    """A capture in code compiled afresh under each of ``names`` (a request's, a cell's), as
    the capture path sees it; a weak reference to the first code."""
    _, end, hook = path_without_torch(census)
    graph = _Graph()
    first = None
    for name in names:
        code = compile(source, name, "exec")
        exec(code, {"hook": hook, "end": end, "graph": graph})  # noqa: S102 - the test's own code
        first = first or weakref.ref(code)
        del code
    assert first is not None
    return first


def test_twenty_thousand_one_off_sites_stay_bounded_and_hold_no_code() -> None:
    """Code compiled per request: at most SITES_MAX sites, then one row for the other sites
    counting the rest; no code object kept; under 16 MB, the report's text under 4 MB."""
    census = Census()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        first = captures_in_code(
            census, (f"<request {i}>" for i in range(20_000)), "hook(graph)\nend(graph)\n"
        )
        entries = census.captures()
        size = len(json.dumps(entries))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    other = entries[-1]
    kept = 4096  # the bound docs/census.md states
    assert (
        len(entries),
        (other["file"], other["line"], other["function"]),
        (other["other_sites"], other["count"]),
        sum(entry["count"] for entry in entries),
        len(census),
        first() is None,
    ) == (kept + 1, (None, None, None), (20_000 - kept, 20_000 - kept), 20_000, 20_000, True)
    assert (grown < 16 << 20, size < 4 << 20) == (True, True), (grown, size)


def test_code_compiled_again_at_one_place_is_one_site() -> None:
    """A module reloaded, a cell run again: new code at the same file and line is the same
    site, in census() as in the summary."""
    census = Census()
    captures_in_code(census, ["<cell>"] * 3, "\nhook(graph)\nend(graph)\n")
    (entry,) = census.captures()
    assert (len(census), entry["file"], entry["line"], entry["count"]) == (1, "<cell>", 2, 3)


def test_the_other_sites_read_as_such_in_the_summary_and_a_merge() -> None:
    """The row of the other sites says how many sites it counts for; a job's merge adds the
    rows of the other sites of its processes together, apart from an unknown site's."""
    census = Census()
    captures_in_code(
        census,
        (f"<request {i}>" for i in range(_census.SITES_MAX + 3)),
        "hook(graph)\nend(graph)\n",
    )
    entries = census.captures()
    unknown = {**entries[0], "file": None, "line": None, "function": None}
    merged = _census_merge.CensusMerge()
    merged.add("a", 1, 0, [entries[-1], unknown], [])
    merged.add("b", 2, 1, [entries[-1]], [])
    rows = {(row["file"], row.get("other_sites")): row["count"] for row in merged.captures()}
    assert (
        _census_merge.site_text(entries[-1]).split(":")[0],
        rows,
        merged.summary().split(" in ")[0],
    ) == (
        "3 other sites",
        {(None, 6): 6, (None, None): 1},
        "census: 7 captures at 7 sites",
    )


def test_a_set_up_told_to_the_census_runs_once_before_the_first_captures_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``prepare`` (inspection's one-time set-up) runs at the first capture, before the census
    reads the clock at its begin, and never again: its time is in no capture's seconds."""
    said: list[str] = []
    monkeypatch.setattr(_watcher, "perf_counter", lambda: said.append("clock") or 1.0)
    census = Census()
    reporter = Reporter(cgguard.Config(mode="log"), Run(census), listeners=[])
    tracker = Tracker(NO_TORCH, reporter, flag=CaptureFlag(), follows=[])
    watcher = CensusWatcher(
        census, replays=False, memory=lambda: None, prepare=lambda: said.append("prepare")
    )
    tracker.set_watchers((watcher,))
    begin = hooks.capture_begin(tracker, _Graph.capture_begin)
    end = hooks.capture_end(tracker, _Graph.capture_end)
    graph = _Graph()
    for _ in range(3):
        begin(graph)
        end(graph)
    assert said == ["prepare", "clock", "clock", "clock"]


def test_replays_counted_are_told_to_the_metrics_from_the_first_capture_on() -> None:
    """``replayed`` is told 0 at the first capture (the metric shows from then on) and 1 for
    each replay the census counts; a graph captured before replays were counted is not
    counted, nor told."""
    census = Census()
    told: list[int] = []
    untracked = _Graph()  # never captured while replays were counted
    reporter = Reporter(cgguard.Config(mode="log"), Run(census), listeners=[])
    tracker = Tracker(NO_TORCH, reporter, flag=CaptureFlag(), follows=[])
    watcher = CensusWatcher(census, replays=True, memory=lambda: None, replayed=told.append)
    tracker.set_watchers((watcher,))
    begin = hooks.capture_begin(tracker, _Graph.capture_begin)
    end = hooks.capture_end(tracker, _Graph.capture_end)
    graph = _Graph()
    begin(graph)
    end(graph)
    for each in (graph, untracked, graph):
        watcher.replaying(each)
    assert told == [0, 1, 1]
    quiet: list[int] = []  # replays not counted: nothing to tell
    CensusWatcher(Census(), replays=False, memory=lambda: None, replayed=quiet.append).replaying(
        graph
    )
    assert quiet == []


# Under inspection, the first capture in a process pays torch's one-time set-up of a Python
# dispatch mode (the import of torch._dynamo) unless it is done before the census's clock: the
# program notes, at each reading of that clock and at the start of the capture's body (after
# capture_begin, before any op), whether torch._dynamo is imported yet.
INSPECTED_PROGRAM = """\
import json
import sys
import time

import torch

import cgguard
from cgguard._census import watcher as _watcher

at_start = "torch._dynamo" in sys.modules
readings = []
clock = _watcher.perf_counter


def noted():
    readings.append("torch._dynamo" in sys.modules)
    return clock()


_watcher.perf_counter = noted
x = torch.ones(4)
start = time.perf_counter()
with torch.cuda.graph(torch.cuda.CUDAGraph()):
    inside = "torch._dynamo" in sys.modules
    y = x * 2
wall = time.perf_counter() - start
sites = cgguard.census()["captures"]
seconds = sites[0]["seconds"] if sites else None
print(json.dumps([at_start, readings[:1], inside, seconds, wall]))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("census", [True, False], ids=["census", "no census"])
def test_inspections_one_time_set_up_is_outside_the_first_capture(
    tmp_path: Path, census: bool
) -> None:
    """--inspect: torch's one-time set-up is done before capture_begin, and with the census on
    before the census reads the clock at the first capture's begin, so the census's seconds
    are the capture's alone, a small part of the wall time of the with statement that paid
    for the set-up."""
    program = tmp_path / "inspected_program.py"
    program.write_text(INSPECTED_PROGRAM)
    command = [sys.executable, "-m", "cgguard", "run", "--simulate-cuda", "--inspect"]
    options = [] if census else ["--no-census"]
    result = subprocess.run(
        [*command, *options, "--log-file", os.devnull, str(program)],
        env=child_environ(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    at_start, readings, inside, seconds, wall = json.loads(result.stdout)
    assert (at_start, readings, inside) == (False, [True] if census else [], True)
    if census:
        # The set-up, an import of about a second, against a capture of a millisecond or less.
        assert seconds < wall / 4, (seconds, wall)
