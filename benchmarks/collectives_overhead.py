"""What the capture manifest costs a collective outside every capture: the hook on
torch.distributed's entry points, in a process with a rank identity.

In one run, in interleaved rounds, in a one-rank gloo job: the time per ``all_reduce`` of one
element, with cgguard installed (RANK set, so the manifest's hooks are on) against the same
function unwrapped, read through ``__wrapped__`` in the same rounds. The figure is the median
of the differences between rounds run back to back. Target: at most 1 us added per call, which
a collective on a real device (tens of microseconds at least) cannot show.

    python benchmarks/collectives_overhead.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from inspection_overhead import median_difference

TARGET_US = 1.0


def per_call(function: object, tensor: object, calls: int) -> float:
    """Seconds per call of ``function(tensor)``."""
    call = function  # local: the loop's look-up is the same on both sides
    start = time.perf_counter()
    for _ in range(calls):
        call(tensor)  # type: ignore[operator]
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args(argv)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
    import torch
    import torch.distributed as dist

    import cgguard

    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        cgguard.install(cgguard.Config(log_file=os.devnull))
        wrapped = dist.all_reduce
        plain = getattr(wrapped, "__wrapped__", None)
        if plain is None or "torch.distributed.all_reduce" not in cgguard.status().patched:
            print("the manifest's hooks are not on: nothing to measure")
            return 1
        tensor = torch.ones(1)
        per_call(wrapped, tensor, options.calls)  # warm both
        per_call(plain, tensor, options.calls)
        pairs: list[tuple[float, float]] = []
        for i in range(options.rounds):
            if i % 2:
                base = per_call(plain, tensor, options.calls)
                hooked = per_call(wrapped, tensor, options.calls)
            else:
                hooked = per_call(wrapped, tensor, options.calls)
                base = per_call(plain, tensor, options.calls)
            pairs.append((base, hooked))
        cgguard.uninstall()
        dist.destroy_process_group()
    added, low, high = (value * 1e6 for value in median_difference(pairs))
    base_us = statistics.median(base for base, _ in pairs) * 1e6
    print(
        f"all_reduce outside a capture: {base_us:.2f} us unwrapped; +{added:.3f} us with the "
        f"manifest's hook (quartiles {low:+.3f} to {high:+.3f}), "
        f"{(base_us + added) / base_us:.3f}x; target +{TARGET_US} us"
    )
    return 0 if added <= TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
