"""Testing capture code without a GPU: cgguard's simulated CUDA runtime and a violation recorder.

The simulated runtime is a simulation: it lets torch's own Python code for CUDA graphs run
without a CUDA device, on a CPU-only or a CUDA build of torch, and fails where CUDA would, but it
runs no kernel and proves nothing about a real GPU. Under pytest, the cgguard plugin's
``simulated_cuda_runtime`` fixture (cgguard.testing.fixtures) provides it.

Each name is imported when first used: pytest loads the plugin, and with it this package, in
every run of every environment where cgguard is installed.
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cgguard.testing._helpers import (
        active_simulation,
        capture_violations,
        simulated_cuda,
    )
    from cgguard.testing._simcuda import SimulatedCuda, SimulatedCudaError, SimulationError

__all__ = [
    "SimulatedCuda",
    "SimulatedCudaError",
    "SimulationError",
    "active_simulation",
    "capture_violations",
    "simulated_cuda",
]

_HOMES = {
    "SimulatedCuda": "cgguard.testing._simcuda",
    "SimulatedCudaError": "cgguard.testing._simcuda",
    "SimulationError": "cgguard.testing._simcuda",
    "active_simulation": "cgguard.testing._helpers",
    "capture_violations": "cgguard.testing._helpers",
    "simulated_cuda": "cgguard.testing._helpers",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cgguard.testing' has no attribute {name!r}")
    __import__(home)
    value = getattr(sys.modules[home], name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
