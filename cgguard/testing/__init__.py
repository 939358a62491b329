"""Testing capture code without a GPU: cgguard's simulated CUDA runtime and a violation recorder.

The simulated runtime is a simulation: it lets torch's own Python code for CUDA graphs run on a
CPU-only torch build and fails where CUDA would, but it runs no kernel and proves nothing about a
real GPU. Under pytest, the cgguard plugin's ``simulated_cuda_runtime`` fixture provides it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from cgguard import _state
from cgguard._simcuda import SimulatedCuda, SimulatedCudaError, SimulationError, simulated_cuda

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "SimulatedCuda",
    "SimulatedCudaError",
    "SimulationError",
    "capture_violations",
    "simulated_cuda",
]


@contextlib.contextmanager
def capture_violations() -> Iterator[list[dict[str, object]]]:
    """Collect the full event of every violation reported inside the block, in order.

    Independent of logging: every violation is seen, whatever the configured output.
    """
    events: list[dict[str, object]] = []
    listener = events.append
    _state.listeners.append(listener)
    try:
        yield events
    finally:
        _state.listeners.remove(listener)
