"""The capture census on a real CUDA device: what the simulated runtime cannot show (the
device, the allocator's bytes). Skipped where torch.cuda.is_available() is false."""

from __future__ import annotations

import os

import pytest
import torch

import cgguard


@pytest.mark.cuda
def test_on_a_device_the_census_weighs_each_capture() -> None:
    """On CUDA: the device is named, and the growth of reserved and allocated bytes across a
    capture holds the output the graph keeps in its pool (1 Mi float32: 4 MiB)."""
    cgguard.install(cgguard.Config(log_file=os.devnull))
    static = torch.ones(1 << 20, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = static * 2
    (site,) = cgguard.census()["captures"]
    assert site["devices"] == {f"cuda:{torch.cuda.current_device()}": 1}
    assert site["bytes_allocated"] is not None
    assert site["bytes_reserved"] is not None
    assert site["bytes_allocated"] >= 4 << 20
    assert site["bytes_reserved"] >= 4 << 20
    assert site["seconds"] > 0
    graph.replay()
    assert torch.equal(output, static * 2)
