"""What bindings (stale_binding) cost, in one run.

Runs on cgguard's simulated CUDA runtime (no GPU work): CPU tensors stand for device tensors.
A model of ``--layers`` linear layers (two parameters each) is captured under inspection, so
that its graph has two bindings per layer. In interleaved rounds:

- ``replay()`` of that graph while no rebinding path has moved, against the same replay under
  inspection as it was before bindings (one test: no input died); the median added time per
  replay. Target: at most 0.5 us.
- ``replay()`` after a rebinding path moved (each name resolved again and compared), against
  a replay that resolves nothing; the added time per 1,000 bindings. Target: at most 1 ms.

It also prints, not against a target: naming the graph's inputs at the end of its capture,
a tensor's ``.data`` read and an ``nn.Module`` attribute set while inspection is on (each
wrapped, so that the epoch sees ``p.data = q`` and ``module.w = ...``) against without.

    python benchmarks/bindings_overhead.py [--layers N] [--replays N] [--rounds R]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import torch

# The same pairing of interleaved rounds as inspection's benchmark, beside this one.
from inspection_overhead import median_difference
from torch import nn

import cgguard
from cgguard._inspect import bindings as _bindings
from cgguard._inspect import inspector as _inspector
from cgguard.testing import simulated_cuda

if TYPE_CHECKING:
    from collections.abc import Iterator

REPLAY_TARGET_US = 0.5
RECHECK_TARGET_MS = 1.0  # per 1,000 bindings


class Runner:
    """A runner holding a model of linear layers, and the graph of its forward."""

    def __init__(self, layers: int) -> None:
        self.model = nn.Sequential(*(nn.Linear(2, 2) for _ in range(layers)))
        self.x = torch.ones(1, 2)
        self.graph = torch.cuda.CUDAGraph()

    def capture(self) -> float:
        start = time.perf_counter()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.y = self.model(self.x)
        return time.perf_counter() - start


def _one_test(self: Any, graph: Any) -> None:
    """Inspector.replaying as it was before bindings: one test for a healthy graph."""
    inputs = graph.__dict__.get(_inspector._INPUTS)
    if inputs is None or inputs.healthy:
        return
    self._check_replay(graph, inputs)


def replays(runner: Runner, count: int, *, moved: bool) -> float:
    """Seconds per replay; ``moved``: a rebinding path moved before each."""
    epoch = cgguard._process.PROCESS.inspections.epoch  # type: ignore[attr-defined]
    gc.collect()
    gc.disable()
    try:
        total = 0.0
        for _ in range(count):
            if moved:
                epoch.value += 1
            start = time.perf_counter()
            runner.graph.replay()
            total += time.perf_counter() - start
        return total / count
    finally:
        gc.enable()


@contextlib.contextmanager
def _no_naming() -> Iterator[None]:
    """Inspection without naming a graph's inputs at the end of its capture."""
    real = _bindings.name_inputs
    _bindings.name_inputs = lambda *args: []
    try:
        yield
    finally:
        _bindings.name_inputs = real


def per_call(action: Any, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        action()
    return (time.perf_counter() - start) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=500, help="linear layers in the model")
    parser.add_argument("--replays", type=int, default=200, help="replays per round")
    parser.add_argument("--rounds", type=int, default=15, help="rounds of each, interleaved")
    args = parser.parse_args()
    if args.rounds < 2 or min(args.layers, args.replays) < 1:
        parser.error("--rounds must be at least 2; --layers and --replays at least 1")
    import cgguard._process

    with simulated_cuda():
        cgguard.install(cgguard.Config(log_file=os.devnull, inspect=True))
        Runner(1).capture()  # torch's one-time set-up of a Python dispatch mode, not timed
        runner = Runner(args.layers)
        naming = runner.capture()
        runner.graph.replay()
        inputs = runner.graph.__dict__[_inspector._INPUTS]
        bindings = len(inputs.bindings)
        new = _inspector.Inspector.replaying
        steady, recheck = [], []
        for _ in range(args.rounds):
            _inspector.Inspector.replaying = _one_test  # type: ignore[method-assign]
            before = replays(runner, args.replays, moved=False)
            _inspector.Inspector.replaying = new  # type: ignore[method-assign]
            steady.append((before, replays(runner, args.replays, moved=False)))
            recheck.append((steady[-1][1], replays(runner, args.replays // 10 or 1, moved=True)))
        weight = runner.model[0].weight
        data_on = per_call(lambda: weight.data, 100_000)
        module = runner.model[0]
        set_on = per_call(lambda: setattr(module, "extra", weight), 20_000)
        cgguard.uninstall()
        data_off = per_call(lambda: weight.data, 100_000)
        set_off = per_call(lambda: setattr(module, "extra", weight), 20_000)
        # The same capture without inspection: what naming adds at its end is the rest.
        cgguard.install(cgguard.Config(log_file=os.devnull, inspect=True))
        unnamed = Runner(args.layers)
        with _no_naming():
            plain = unnamed.capture()
        cgguard.uninstall()
    added, q1, q3 = (d * 1e6 for d in median_difference(steady))
    per_thousand, r1, r3 = (d * 1e3 / bindings * 1000 for d in median_difference(recheck))
    print(f"simulated runtime (CPU tensors stand for device tensors), {args.rounds} rounds")
    print(f"graph of {args.layers} linear layers: {bindings} bindings")
    print(
        f"replay, no rebinding path moved: +{added:.3f} us over a replay under inspection "
        f"without bindings (quartiles {q1:.3f} to {q3:.3f}); target <= {REPLAY_TARGET_US} us"
    )
    print(
        f"replay after a rebinding path moved: {per_thousand:.3f} ms per 1,000 bindings "
        f"resolved (quartiles {r1:.3f} to {r3:.3f}); target <= {RECHECK_TARGET_MS} ms"
    )
    print(
        f"naming at the capture's end: {(naming - plain) * 1e3:.1f} ms for {bindings} "
        f"bindings (the inspected capture took {naming * 1e3:.1f} ms, {plain * 1e3:.1f} ms "
        f"without naming)"
    )
    print(
        f"tensor.data read: {data_on * 1e9:.0f} ns with inspection on, {data_off * 1e9:.0f} ns "
        f"off; nn.Module attribute set: {set_on * 1e6:.2f} us on, {set_off * 1e6:.2f} us off"
    )
    return 1 if added > REPLAY_TARGET_US or per_thousand > RECHECK_TARGET_MS else 0


if __name__ == "__main__":
    sys.exit(main())
