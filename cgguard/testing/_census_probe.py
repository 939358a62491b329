"""The census of the probe's own captures: a few graphs captured under cgguard, then printed.

``python -m cgguard.testing.probe --census`` runs this in a fresh interpreter. On a CUDA device
the captures are real and the census weighs them; without one they run on the simulated
runtime, which has no allocator, and the output says so.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

# Three graphs, each of a different size, all captured at one line: one site, three captures.
# Compiled under a name of its own: cgguard's own frames are never a site, and the census
# would name the frame that ran this module instead.
CAPTURES = """
def capture(torch, static, sizes):
    graphs, outputs = [], []
    for size in sizes:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs.append(static[:size] * 2)  # allocated in the graph's own pool
        graphs.append(graph)
    return graphs, outputs
"""
SIZES = (1 << 18, 1 << 19, 1 << 20)


def main() -> int:
    """Capture, and print the census: the totals' line and one line per site."""
    import torch

    import cgguard
    from cgguard._data.census_merge import site_text
    from cgguard._reporting.events import census_line, census_totals
    from cgguard.testing import simulated_cuda

    device = torch.cuda.is_available()
    where = (
        f"on {torch.cuda.get_device_name()}"
        if device
        else "on cgguard's simulated CUDA runtime (no GPU; not a GPU result)"
    )
    with contextlib.nullcontext() if device else simulated_cuda():
        cgguard.install(cgguard.Config(log_file=os.devnull))
        static = torch.ones(max(SIZES), device="cuda" if device else "cpu")
        namespace: dict[str, Any] = {}
        exec(compile(CAPTURES, "<cgguard census probe>", "exec"), namespace)  # noqa: S102
        kept = namespace["capture"](torch, static, SIZES)  # the graphs, alive until printed
        counted = cgguard.census()
        cgguard.uninstall()
        del kept
    captures = counted["captures"]
    totals = census_totals(captures, counted["cudagraph_skips"], replays=False)
    print(f"census of the probe's own captures, {where}:")
    print(f"  {census_line(totals)}")
    for site in captures:
        print(f"  {site_text(site)}; devices {site['devices']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
