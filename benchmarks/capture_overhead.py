"""Time per ``with torch.cuda.graph(g)`` capture with cgguard installed and without, in one run.

Runs on cgguard's simulated CUDA runtime (no GPU work), so the figure is cgguard's own cost
per capture plus torch's Python code, not a GPU's. Target: at most 2.5 us added per capture,
with the census on, as it is by default.

With ``--census``, both sides run cgguard, with its census on (the default) and off: the
figure is the census's own cost per capture, seam included. Target: at most 1 us.

    python benchmarks/capture_overhead.py [--captures N] [--rounds R] [--census]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import torch

import cgguard
from cgguard.testing import simulated_cuda

TARGET_US = 2.5
CENSUS_TARGET_US = 1.0


def time_captures(count: int, guarded: bool, *, census: bool | None = None) -> float:
    """Seconds per capture, over ``count`` captures of fresh graphs on a fresh runtime.

    ``census``: None for no cgguard on the unguarded side; else both sides are guarded, and
    ``guarded`` says whether the census counts.
    """
    # A fresh runtime each time: the simulated driver records every call, and a record that
    # grew over earlier rounds would make later rounds slower for reasons of its own.
    with simulated_cuda():
        if census is not None:
            cgguard.install(cgguard.Config(log_file=os.devnull, census=guarded))
        elif guarded:
            cgguard.install(cgguard.Config(log_file=os.devnull))
        graphs = [torch.cuda.CUDAGraph() for _ in range(count)]
        gc.collect()
        gc.disable()  # as timeit does: a collection landing in one side only is noise
        try:
            start = time.perf_counter()
            for g in graphs:
                with torch.cuda.graph(g):
                    pass
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
            cgguard.uninstall()
    return elapsed / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", type=int, default=3_000, help="captures per round")
    parser.add_argument("--rounds", type=int, default=31, help="rounds of each, interleaved")
    parser.add_argument(
        "--census",
        action="store_true",
        help="compare the census on with the census off, both with cgguard installed",
    )
    args = parser.parse_args()
    if args.rounds < 2 or args.captures < 1:
        parser.error(
            "--rounds must be at least 2 (quartiles need two pairs), --captures at least 1"
        )
    census = True if args.census else None
    plain: list[float] = []
    guarded: list[float] = []
    # Warm-up: lazy imports on both sides.
    time_captures(args.captures, guarded=True, census=census)
    time_captures(args.captures, guarded=False, census=census)
    for i in range(args.rounds):
        # Interleaved, alternating which goes first, so that drift hits both sides alike.
        for guarded_first in (i % 2 == 0, i % 2 == 1):
            (guarded if guarded_first else plain).append(
                time_captures(args.captures, guarded=guarded_first, census=census)
            )
    without_us = statistics.median(plain) * 1e6
    with_us = statistics.median(guarded) * 1e6
    # Each round's pair ran back to back: their difference is the least disturbed by the
    # machine's other work, and its spread shows how much that work moved the figure.
    added = [(g - p) * 1e6 for g, p in zip(guarded, plain, strict=True)]
    q1, median_added, q3 = statistics.quantiles(added, n=4)
    target = CENSUS_TARGET_US if args.census else TARGET_US
    without, with_ = (
        ("census off:", "census on:") if args.census else ("without cgguard:", "with cgguard:")
    )
    print(f"captures: {args.rounds} rounds x {args.captures}, simulated CUDA runtime")
    print(f"{without:16} {without_us:8.2f} us per capture (median of rounds)")
    print(f"{with_:16} {with_us:8.2f} us per capture")
    print(
        f"{'added:':16} {median_added:8.2f} us per capture, median of paired rounds "
        f"(quartiles {q1:.2f} to {q3:.2f}; target <= {target} us)"
    )
    print(f"{'ratio:':16} {with_us / without_us:8.3f}x")
    return 0 if median_added <= target else 1


if __name__ == "__main__":
    sys.exit(main())
