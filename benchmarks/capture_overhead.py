"""Time per ``with torch.cuda.graph(g)`` capture with cgguard installed and without, in one run.

Runs on cgguard's simulated CUDA runtime (no GPU work), so the figure is cgguard's own cost
per capture plus torch's Python code, not a GPU's. Target: at most 5 us added per capture.

    python benchmarks/capture_overhead.py [--captures N] [--rounds R]
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

TARGET_US = 5.0


def time_captures(count: int, guarded: bool) -> float:
    """Seconds per capture, over ``count`` captures of fresh graphs on a fresh runtime."""
    # A fresh runtime each time: the simulated driver records every call, and a record that
    # grew over earlier rounds would make later rounds slower for reasons of its own.
    with simulated_cuda():
        if guarded:
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
    parser.add_argument("--captures", type=int, default=5_000, help="captures per round")
    parser.add_argument("--rounds", type=int, default=15, help="rounds of each, interleaved")
    args = parser.parse_args()
    plain: list[float] = []
    guarded: list[float] = []
    time_captures(args.captures, guarded=True)  # warm-up: lazy imports on both sides
    for i in range(args.rounds):
        # Interleaved, alternating which goes first, so that drift hits both sides alike.
        for guarded_first in (i % 2 == 0, i % 2 == 1):
            (guarded if guarded_first else plain).append(
                time_captures(args.captures, guarded=guarded_first)
            )
    without_us = statistics.median(plain) * 1e6
    with_us = statistics.median(guarded) * 1e6
    added = with_us - without_us
    print(f"captures: {args.rounds} rounds x {args.captures}, simulated CUDA runtime")
    print(f"without cgguard: {without_us:8.2f} us per capture (median of rounds)")
    print(f"with cgguard:    {with_us:8.2f} us per capture")
    print(f"added:           {added:8.2f} us per capture (target <= {TARGET_US} us)")
    print(f"ratio:           {with_us / without_us:8.3f}x")
    return 0 if added <= TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
