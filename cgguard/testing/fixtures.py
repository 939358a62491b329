"""pytest fixtures for capture code.

The cgguard pytest plugin provides them in every session; a project that runs with
``-p no:cgguard`` loads this module instead, with ``pytest_plugins = ["cgguard.testing.fixtures"]``.
Importing it loads pytest alone: torch and the simulated runtime come when a test asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

    from cgguard.testing import SimulatedCuda

__all__ = ["simulated_cuda_runtime"]


@pytest.fixture
def simulated_cuda_runtime() -> Generator[SimulatedCuda, None, None]:
    """torch.cuda on cgguard's simulated CUDA runtime for one test; torch restored after it."""
    from cgguard.testing import simulated_cuda

    with simulated_cuda() as runtime:
        yield runtime
