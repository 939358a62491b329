"""Testing capture code without a GPU: cgguard's simulated CUDA runtime and a violation recorder.

The simulated runtime is a simulation: it lets torch's own Python code for CUDA graphs run
without a CUDA device, on a CPU-only or a CUDA build of torch, and fails where CUDA would, but it
runs no kernel and proves nothing about a real GPU. Under pytest, the cgguard plugin's
``simulated_cuda_runtime`` fixture (cgguard.testing.fixtures) provides it.

pytest loads the plugin, and with it this package, in every run of every environment where
cgguard is installed: what is imported here loads neither torch nor cgguard's capture path,
which come when a test asks.
"""

from cgguard.testing._helpers import (
    active_simulation,
    bindings_kept,
    capture_violations,
    simulated_cuda,
)
from cgguard.testing._simcuda import SimulatedCuda, SimulatedCudaError, SimulationError

__all__ = [
    "SimulatedCuda",
    "SimulatedCudaError",
    "SimulationError",
    "active_simulation",
    "bindings_kept",
    "capture_violations",
    "simulated_cuda",
]
