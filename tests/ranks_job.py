"""A two-rank job for tests/test_ranks.py, run by torchrun over gloo on the simulated runtime.

Each rank captures two graphs, with an all-reduce inside each, then compares the ranks live
(cgguard.check_ranks) and writes what it found to found-RANK.json in the working directory
(the ranks share one stdout, where long lines may interleave). The scenario, the first
argument, makes rank 1 differ: "agree" (it does not), "extra_graph" (rank 1 captures a third
graph), "extra_allreduce" (rank 1 issues a second all-reduce inside its second capture; rank 0
issues the matching one outside, so that gloo's collectives still pair up), "absent" (rank 1
never reaches the check).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import cgguard


def main(scenario: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(8, device="cuda")
    dist.all_reduce(x)  # the group's first use, outside any capture
    graphs = [torch.cuda.CUDAGraph() for _ in range(3)]
    with torch.cuda.graph(graphs[0]):
        dist.all_reduce(x)
    with torch.cuda.graph(graphs[1]):
        dist.all_reduce(x)
        if scenario == "extra_allreduce" and rank == 1:
            dist.all_reduce(x)
    if scenario == "extra_allreduce" and rank == 0:
        dist.all_reduce(x)
    if scenario == "extra_graph" and rank == 1:
        with torch.cuda.graph(graphs[2]):
            x.add_(1)
    if scenario == "absent" and rank == 1:
        dist.destroy_process_group()
        return
    found = cgguard.check_ranks(timeout=3 if scenario == "absent" else 60)
    with open(f"found-{rank}.json", "w") as out:
        json.dump([difference._asdict() for difference in found], out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
