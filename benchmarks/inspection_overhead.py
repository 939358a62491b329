"""What inspection adds, in one run: per op dispatched inside a capture, and per replay.

Runs on cgguard's simulated CUDA runtime (no GPU work): CPU tensors stand for device tensors,
so each op's own time is a small CPU kernel's, and the figures are cgguard's cost per op and
per replay, not a GPU's. In interleaved rounds:

- a capture of ``--ops`` small ops (an add on a 4-element tensor) three ways: with cgguard
  installed and inspection off, under a dispatch mode that only forwards, and with inspection
  on. What inspection adds above the forwarding mode, the median per op of the differences
  between the two captures of each round (run back to back, in turn first), is its own cost:
  the forwarding mode's is torch's, paid by any dispatch-mode tracker. Target: at most 1 us
  per op. Each capture is timed after a garbage collection and with the C allocator settled
  (settle_malloc): none pays for what the one before it freed. The first inspected capture in
  the process (torch's one-time set-up of a Python dispatch mode) is timed apart.
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

OP_TARGET_US = 1.0  # above a dispatch mode that only forwards
REPLAY_TARGET_US = 2.0


class Forwarding(TorchDispatchMode):
    """A dispatch mode that only forwards: the floor any dispatch-mode inspection pays."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def settle_malloc() -> None:
    """Have the C allocator merge the small blocks freed before a timed capture now.

    glibc's malloc keeps small freed blocks in its fast bins and merges them all at the next
    request of 1 KiB or more (malloc/malloc.c, _int_malloc: "If this is a large request,
    consolidate fastbins before continuing"). Left there, the blocks the collection just
    freed, the previous capture's, are merged inside the timed capture that first makes such a
    request: an inspected one does (its table of addresses grows), a plain or forwarding one
    does not, and the figure then depends on which capture ran before it. Elsewhere a request
    this size is harmless.
    """
    bytearray(4096)


def capture_seconds(ops: int, inspect: bool, *, bare: bool = False) -> float:
    """Seconds for one capture of ``ops`` small ops (``bare``: under a forwarding mode)."""
    cgguard.install(cgguard.Config(log_file=os.devnull, inspect=inspect))
    x = torch.ones(4)
    graph = torch.cuda.CUDAGraph()
    gc.collect()
    settle_malloc()
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
        captures, forwarding, above = [], [], []
        for index in range(args.rounds):
            plain = capture_seconds(args.ops, inspect=False)
            # The two compared captures each round, in turn first: neither always runs second.
            if index % 2:
                bare = capture_seconds(args.ops, inspect=False, bare=True)
                inspected = capture_seconds(args.ops, inspect=True)
            else:
                inspected = capture_seconds(args.ops, inspect=True)
                bare = capture_seconds(args.ops, inspect=False, bare=True)
            captures.append((plain, inspected))
            forwarding.append((plain, bare))
            above.append((bare, inspected))
        replays = []
        for _ in range(args.rounds):
            plain = replay_seconds(args.inputs, args.replays, inspect=False)
            replays.append((plain, replay_seconds(args.inputs, args.replays, inspect=True)))
        cgguard.uninstall()
    per_op = median_difference(captures)[0] / args.ops * 1e6
    plain_op = statistics.median(a for a, _ in captures) / args.ops * 1e6
    floor = median_difference(forwarding)[0] / args.ops * 1e6
    own, own_q1, own_q3 = (d / args.ops * 1e6 for d in median_difference(above))
    per_replay, rep_q1, rep_q3 = (d * 1e6 for d in median_difference(replays))
    plain_replay = statistics.median(a for a, _ in replays) * 1e6
    steady = statistics.median(b for _, b in captures)
    print(f"simulated runtime (CPU tensors stand for device tensors), {args.rounds} rounds")
    print(
        f"per op inside a capture of {args.ops}: {plain_op:.2f} us plain, "
        f"+{floor:.2f} us under a dispatch mode that only forwards, +{per_op:.2f} us inspected"
    )
    print(
        f"  inspection above the forwarding mode: +{own:.2f} us per op (quartiles "
        f"{own_q1:.2f} to {own_q3:.2f}), {(floor + own) / floor:.2f}x that mode's cost; "
        f"target <= {OP_TARGET_US} us"
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
    missed = own > OP_TARGET_US or per_replay > REPLAY_TARGET_US
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
