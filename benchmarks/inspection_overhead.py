"""What inspection adds, in one run: per op dispatched inside a capture, and per replay.

Runs on cgguard's simulated CUDA runtime (no GPU work): CPU tensors stand for device tensors,
so each op's own time is a small CPU kernel's, and the figures are cgguard's cost per op and
per replay, not a GPU's. In interleaved rounds:

- a capture of ``--ops`` small ops (an add on a 4-element tensor), with cgguard installed and
  inspection on against cgguard installed without it; the median added time per op. The
  first inspected capture in the process (torch's one-time set-up of a Python dispatch mode)
  is timed apart. Target: at most 5 us per op.
- ``replay()`` of a healthy graph whose capture read ``--inputs`` external tensors, inspected
  against not; the median added time per replay. Target: at most 2 us.

    python benchmarks/inspection_overhead.py [--ops N] [--inputs N] [--rounds R]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cgguard
from cgguard.testing import simulated_cuda

OP_TARGET_US = 5.0
REPLAY_TARGET_US = 2.0


class Forwarding(TorchDispatchMode):
    """A dispatch mode that only forwards: the floor any dispatch-mode inspection pays."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def capture_seconds(ops: int, inspect: bool, *, bare: bool = False) -> float:
    """Seconds for one capture of ``ops`` small ops (``bare``: under a forwarding mode)."""
    cgguard.install(cgguard.Config(log_file=os.devnull, inspect=inspect))
    x = torch.ones(4)
    graph = torch.cuda.CUDAGraph()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        with torch.cuda.graph(graph), Forwarding() if bare else contextlib.nullcontext():
            for _ in range(ops):
                x.add(1)
        return time.perf_counter() - start
    finally:
        gc.enable()


def replay_seconds(inputs: int, replays: int, inspect: bool) -> float:
    """Seconds per replay of a healthy graph whose capture read ``inputs`` external tensors."""
    cgguard.install(cgguard.Config(log_file=os.devnull, inspect=inspect))
    tensors = [torch.ones(2) for _ in range(inputs)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for t in tensors:
            t.add(1)
    graph.replay()  # the first replay's one walk for moved storages, not timed
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        return (time.perf_counter() - start) / replays
    finally:
        gc.enable()


def median_difference(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median and quartiles of the differences between rounds run back to back."""
    diffs = sorted(b - a for a, b in pairs)
    q = statistics.quantiles(diffs, n=4)
    return statistics.median(diffs), q[0], q[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000, help="ops per capture")
    parser.add_argument("--inputs", type=int, default=500, help="external inputs per graph")
    parser.add_argument("--replays", type=int, default=2_000, help="replays per round")
    parser.add_argument("--rounds", type=int, default=21, help="rounds of each, interleaved")
    args = parser.parse_args()
    if args.rounds < 2 or min(args.ops, args.inputs, args.replays) < 1:
        parser.error("--rounds must be at least 2; --ops, --inputs, --replays at least 1")
    with simulated_cuda():
        capture_seconds(args.ops, inspect=False)  # warm-up: lazy imports
        first_use = capture_seconds(args.ops, inspect=True)  # the first dispatch mode here
        captures, forwarding = [], []
        for _ in range(args.rounds):
            plain = capture_seconds(args.ops, inspect=False)
            captures.append((plain, capture_seconds(args.ops, inspect=True)))
            forwarding.append((plain, capture_seconds(args.ops, inspect=False, bare=True)))
        replays = []
        for _ in range(args.rounds):
            plain = replay_seconds(args.inputs, args.replays, inspect=False)
            replays.append((plain, replay_seconds(args.inputs, args.replays, inspect=True)))
        cgguard.uninstall()
    per_op, op_q1, op_q3 = (d / args.ops * 1e6 for d in median_difference(captures))
    plain_op = statistics.median(a for a, _ in captures) / args.ops * 1e6
    floor = median_difference(forwarding)[0] / args.ops * 1e6
    per_replay, rep_q1, rep_q3 = (d * 1e6 for d in median_difference(replays))
    plain_replay = statistics.median(a for a, _ in replays) * 1e6
    steady = statistics.median(b for _, b in captures)
    print(f"simulated runtime (CPU tensors stand for device tensors), {args.rounds} rounds")
    print(
        f"per op inside a capture of {args.ops}: {plain_op:.2f} us plain, "
        f"+{per_op:.2f} us inspected (quartiles {op_q1:.2f} to {op_q3:.2f}), "
        f"{(plain_op + per_op) / plain_op:.2f}x; target <= {OP_TARGET_US} us"
    )
    print(
        f"  of which a dispatch mode that only forwards costs +{floor:.2f} us per op here: "
        f"inspection is {per_op / floor:.2f}x that floor"
    )
    print(
        f"first inspected capture in the process: {first_use * 1e3:.1f} ms, "
        f"{(first_use - steady) * 1e3:.1f} ms more than later ones (one-time set-up)"
    )
    print(
        f"per replay of a healthy graph that read {args.inputs} external tensors: "
        f"{plain_replay:.2f} us plain, +{per_replay:.2f} us inspected "
        f"(quartiles {rep_q1:.2f} to {rep_q3:.2f}); target <= {REPLAY_TARGET_US} us"
    )
    missed = per_op > OP_TARGET_US or per_replay > REPLAY_TARGET_US
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
