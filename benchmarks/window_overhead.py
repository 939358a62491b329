"""What capture windows cost: per capture while windows are watched, per call of a window function.

In one run, in interleaved rounds: the time of cgguard's check of a capture (the work its hook
does before torch begins one, on the simulated CUDA runtime) with no window declared, against
the same inside an open function window and while a predicate window (a module attribute) is
true; and the time per call of a method declared as a window, against the same method
unwrapped. The check is timed rather than a whole capture, whose own spread on a busy machine
is many times the figure sought. Targets: at most 1 us added per capture and per call.

    python benchmarks/window_overhead.py [--captures N] [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cgguard
from cgguard.testing import simulated_cuda

TARGET_US = 1.0

MODULE = """\
FLAG = True


class Runner:
    def capture_model(self, work=None):
        if work is not None:
            return work()
        return None

    def plain(self, work=None):
        if work is not None:
            return work()
        return None
"""
WINDOW = "cgguard_bench_windows:Runner.capture_model"
PREDICATE = "cgguard_bench_windows:FLAG"


def time_checks(count: int, windows: tuple[str, ...], how: str) -> float:
    """Seconds per capture check (the hook's work before torch begins a capture): ``how`` is
    "plain" (no window), "inside" (inside an open function window) or "predicate" (while a
    predicate window is true)."""
    import cgguard_bench_windows as bench  # type: ignore[import-not-found]

    from cgguard import _process
    from cgguard._support.frames import snapshot

    with simulated_cuda():
        cgguard.install(cgguard.Config(log_file=os.devnull, windows=windows))
        installation = _process.PROCESS.installation
        tracker = installation.tracker if installation is not None else None
        if tracker is None:
            raise SystemExit("cgguard did not patch torch")
        check = tracker.check
        runner = bench.Runner()
        if windows:
            runner.capture_model()  # entered and closed once: windows are watched from now on
        stack = snapshot(0)  # one capture site, as a capture loop has

        def checks() -> float:
            start = time.perf_counter()
            for key in range(count):
                check("torch.cuda.graph", key, "global", stack, None)
            return time.perf_counter() - start

        gc.collect()
        gc.disable()
        try:
            elapsed = runner.capture_model(checks) if how == "inside" else checks()
        finally:
            gc.enable()
            cgguard.uninstall()
    return elapsed / count


def time_calls(count: int, wrapped: bool) -> float:
    """Seconds per call of a window method (wrapped) or of the same method unwrapped."""
    import cgguard_bench_windows as bench

    cgguard.install(cgguard.Config(log_file=os.devnull, windows=(WINDOW,)))
    runner = bench.Runner()
    call = runner.capture_model if wrapped else runner.plain
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(count):
            call()
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
        cgguard.uninstall()
    return elapsed / count


def _added(with_: list[float], without: list[float]) -> tuple[float, float, float]:
    """The median and quartiles of the paired differences, in us."""
    diffs = [(w - p) * 1e6 for w, p in zip(with_, without, strict=True)]
    q1, median, q3 = statistics.quantiles(diffs, n=4)
    return median, q1, q3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", type=int, default=50_000, help="checks per round")
    parser.add_argument("--calls", type=int, default=100_000, help="window calls per round")
    parser.add_argument("--rounds", type=int, default=21, help="rounds of each, interleaved")
    args = parser.parse_args()
    if args.rounds < 2 or args.captures < 1 or args.calls < 1:
        parser.error("--rounds must be at least 2, --captures and --calls at least 1")
    folder = tempfile.mkdtemp(prefix="cgguard-bench-")
    Path(folder, "cgguard_bench_windows.py").write_text(MODULE)
    sys.path.insert(0, folder)
    both = (WINDOW, PREDICATE)
    runs: dict[str, list[float]] = {"plain": [], "inside": [], "predicate": []}
    calls: dict[bool, list[float]] = {True: [], False: []}
    time_checks(args.captures, both, "inside")  # warm-up: lazy imports on every side
    for i in range(args.rounds):
        # Interleaved, the order turned each round, so that drift hits every side alike.
        order = [("plain", ()), ("inside", (WINDOW,)), ("predicate", (PREDICATE,))]
        for how, windows in order if i % 2 == 0 else order[::-1]:
            runs[how].append(time_checks(args.captures, windows, how))
        for wrapped in (i % 2 == 0, i % 2 == 1):
            calls[wrapped].append(time_calls(args.calls, wrapped))
    print(f"capture checks: {args.rounds} rounds x {args.captures}, simulated CUDA runtime")
    print(f"no window:          {statistics.median(runs['plain']) * 1e6:8.3f} us per capture")
    missed = False
    for how, what in (("inside", "inside a window"), ("predicate", "predicate true")):
        median, q1, q3 = _added(runs[how], runs["plain"])
        missed |= median > TARGET_US
        print(
            f"{what + ':':<19} {median:+8.3f} us per capture, median of paired rounds "
            f"(quartiles {q1:+.3f} to {q3:+.3f}; target <= {TARGET_US} us)"
        )
    median, q1, q3 = _added(calls[True], calls[False])
    missed |= median > TARGET_US
    print(f"calls: {args.rounds} rounds x {args.calls}")
    print(f"unwrapped method:   {statistics.median(calls[False]) * 1e6:8.3f} us per call")
    print(
        f"window method:      {median:+8.3f} us per call, median of paired rounds "
        f"(quartiles {q1:+.3f} to {q3:+.3f}; target <= {TARGET_US} us)"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
