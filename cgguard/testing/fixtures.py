"""pytest fixtures for capture code: load with ``pytest_plugins = ["cgguard.testing.fixtures"]``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from cgguard.testing import simulated_cuda

if TYPE_CHECKING:
    from collections.abc import Iterator

    from cgguard.testing import SimulatedCuda


@pytest.fixture
def simulated_cuda_runtime() -> Iterator[SimulatedCuda]:
    """torch.cuda on cgguard's simulated CUDA runtime for one test; torch restored after it."""
    with simulated_cuda() as runtime:
        yield runtime
