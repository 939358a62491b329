"""Eight threads capturing at once on the simulated runtime: every violation counted exactly.

Barriers split the run into phases, so that which rule each capture breaks is decided by the
design, not by scheduling; the threads still race within each phase.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
import torch
from helpers import run_seen

import cgguard
from cgguard.testing import SimulatedCudaError, capture_violations, simulated_cuda

if TYPE_CHECKING:
    from collections.abc import Iterator

    from cgguard.testing import SimulatedCuda

pytestmark = pytest.mark.simulated

THREADS = 8
PLAIN = 5  # captures per thread with capture enabled: no violation
NESTED = 3  # nested attempts per thread: one nested_capture each
DISABLED = 4  # captures per thread while the main thread has disabled capture
CONCURRENT = 2  # captures per thread but worker 0 while worker 0 captures in global mode
SYNCS = 2  # synchronize calls per thread during its own capture
TIMEOUT = 30


class Run:
    """The simulated runtime, cgguard installed in log mode, and the violations seen."""

    def __init__(self, simulation: SimulatedCuda, events: list[dict[str, Any]]) -> None:
        self.simulation = simulation
        self.events = events


@pytest.fixture
def run() -> Iterator[Run]:
    with simulated_cuda() as simulation, capture_violations() as events:
        cgguard.install(cgguard.Config(mode="log", log_file=os.devnull))
        yield Run(simulation, events)


def capture_once(stream: Any, x: Any, mode: str = "thread_local") -> None:
    """One raw capture of ``x += 1`` on ``stream``, begun and ended."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode=mode)  # @capture-once
        x.add_(1)
        graph.capture_end()


def capture_nested(outer_stream: Any, inner_stream: Any, x: Any) -> None:
    """A capture begun inside this thread's own capture (log mode: it goes on), both ended."""
    outer, inner = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.stream(outer_stream):
        outer.capture_begin(capture_error_mode="thread_local")
        x.add_(1)
        with torch.cuda.stream(inner_stream):
            inner.capture_begin(capture_error_mode="thread_local")  # @nested-begin
            x.add_(1)
            inner.capture_end()
        outer.capture_end()


def worker(index: int, barrier: threading.Barrier) -> None:
    """One capturing thread's whole run; the barrier's waits match the main thread's."""
    stream, side = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(4)
    # Phase 1, capture enabled: plain captures (legal), then nested attempts.
    for _ in range(PLAIN):
        capture_once(stream, x)
    for _ in range(NESTED):
        capture_nested(stream, side, x)
    barrier.wait()  # A: phase 1 done
    barrier.wait()  # B: the main thread has disabled capture
    for _ in range(DISABLED):
        capture_once(stream, x)
    barrier.wait()  # C: phase 2 done
    barrier.wait()  # D: the main thread has enabled capture again
    # Phase 3: worker 0 holds a global-mode capture while every other worker captures.
    if index == 0:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="global")
            x.add_(1)
            barrier.wait()  # E: worker 0 is capturing
            barrier.wait()  # F: the others are done
            graph.capture_end()
    else:
        barrier.wait()  # E
        for _ in range(CONCURRENT):
            capture_once(stream, x)
        barrier.wait()  # F
    barrier.wait()  # G: phase 3 done
    # Phase 4: every worker captures; the main thread synchronizes (legal: it is not
    # capturing, and every capture is thread_local); then each worker synchronizes itself.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        x.add_(1)
        barrier.wait()  # H: every worker is capturing
        barrier.wait()  # I: the main thread has synchronized
        for _ in range(SYNCS):
            with pytest.raises(SimulatedCudaError, match="operation not permitted"):
                torch.cuda.synchronize()  # @sync
        with pytest.raises(SimulatedCudaError, match="previous error during capture"):
            graph.capture_end()


def run_workers() -> tuple[list[threading.Thread], list[int]]:
    """Run the workers through the phases, playing the main thread's part.

    Returns the worker threads, and the owners of the captures active in phase 4 (all workers).
    Re-raises the first failure of a worker.
    """
    barrier = threading.Barrier(THREADS + 1, timeout=TIMEOUT)
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            worker(index, barrier)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [
        threading.Thread(target=guarded, args=(i,), name=f"cgg-worker-{i}") for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    owners: list[int] = []
    try:
        barrier.wait()  # A
        cgguard.set_capture_enabled(False)
        barrier.wait()  # B
        barrier.wait()  # C
        cgguard.set_capture_enabled(True)
        barrier.wait()  # D
        barrier.wait()  # E
        barrier.wait()  # F
        barrier.wait()  # G
        barrier.wait()  # H
        owners = sorted(capture.thread_id for capture in cgguard.status().captures)
        torch.cuda.synchronize()  # not capturing here: no violation, and CUDA allows it
        barrier.wait()  # I
    except threading.BrokenBarrierError:
        pass  # a worker failed: its error is raised below
    finally:
        for thread in threads:
            thread.join(timeout=TIMEOUT)
            assert not thread.is_alive(), "a worker hung"
    if errors:
        raise errors[0]
    return threads, owners


def test_eight_threads_capturing_count_every_violation_exactly(run: Run) -> None:
    """8 threads racing through four phases: exact violations per rule and thread, none lost."""
    threads, owners = run_workers()
    index = {thread.ident: i for i, thread in enumerate(threads)}
    assert sorted(index) == owners

    expected: Counter[tuple[int, str]] = Counter()
    for i in range(THREADS):
        expected[i, "nested_capture"] = NESTED
        expected[i, "capture_disabled"] = DISABLED
        expected[i, "sync_during_capture"] = SYNCS
        if i != 0:
            expected[i, "concurrent_capture"] = CONCURRENT
    events = run.events
    got = Counter((index.get(e["thread_id"], -1), e["rule"]) for e in events)
    assert expected == got

    totals = {
        "nested_capture": THREADS * NESTED,
        "capture_disabled": THREADS * DISABLED,
        "concurrent_capture": (THREADS - 1) * CONCURRENT,
        "sync_during_capture": THREADS * SYNCS,
    }
    # One site per rule, counted under a lock: each count from 1 to the total exactly once.
    counts = {rule: sorted(e["count"] for e in events if e["rule"] == rule) for rule in totals}
    assert {rule: list(range(1, total + 1)) for rule, total in totals.items()} == counts
    assert {e["action"] for e in events} == {"logged"}
    assert [e["thread"] for e in events] == [threads[index[e["thread_id"]]].name for e in events]
    concurrent_with = {e["other_thread_id"] for e in events if e["rule"] == "concurrent_capture"}
    assert concurrent_with == {threads[0].ident}

    assert cgguard.status().captures == ()
    assert totals == cgguard.status().violations
    assert len(run_seen().ledger.sites()) == 4

    # How the simulated driver saw each capture end: ok for all but each worker's last.
    ended = Counter((c.thread, c.args[1]) for c in run.simulation.calls if c.name == "capture_end")
    expected_ends: Counter[tuple[str, object]] = Counter()
    for i, thread in enumerate(threads):
        phase3 = 1 if i == 0 else CONCURRENT
        expected_ends[thread.name, True] = PLAIN + 2 * NESTED + DISABLED + phase3
        expected_ends[thread.name, False] = 1
    assert expected_ends == ended
    assert run.simulation.active_captures() == []
