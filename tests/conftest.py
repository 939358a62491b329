"""Shared fixtures: each test starts and ends with cgguard uninstalled, the flag enabled and the
environment, sys.path and torch as they were."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

import cgguard
from cgguard import _state

if TYPE_CHECKING:
    from collections.abc import Iterator

pytest_plugins = ["cgguard.testing.fixtures"]


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("cuda") for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
        for item in items:
            if item.get_closest_marker("cuda"):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _clean_process() -> Iterator[None]:
    environ = dict(os.environ)
    path = list(sys.path)
    yield
    cgguard.uninstall()
    _state.reset()
    os.environ.clear()
    os.environ.update(environ)
    sys.path[:] = path


@dataclass
class Runtime:
    """Where a capture scenario runs: cgguard's simulated CUDA runtime, or a real GPU."""

    name: str
    device: str  # where the scenario's tensors live
    simulation: Any  # the SimulatedCuda driver, None on a real GPU

    def tensor(self) -> Any:
        import torch

        return torch.zeros(4, device=self.device)


@pytest.fixture(params=["simulated", pytest.param("cuda", marks=pytest.mark.cuda)])
def runtime(request: pytest.FixtureRequest) -> Iterator[Runtime]:
    """Each end-to-end scenario runs on the simulated runtime here, and on CUDA where it exists."""
    if request.param == "cuda":
        yield Runtime("cuda", "cuda", None)
        return
    from cgguard.testing import simulated_cuda

    with simulated_cuda() as simulation:
        yield Runtime("simulated", "cpu", simulation)
