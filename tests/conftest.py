"""Shared fixtures: each test starts and ends with cgguard uninstalled, the flag enabled and the
environment, sys.path and torch as they were."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

import cgguard
from cgguard import _process
from cgguard._support import warn as _warn
from cgguard.testing import capture_violations

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads these options
def pytest_cmdline_main(config: pytest.Config) -> None:
    """In parallel unless told otherwise: ``-n auto`` where no ``-n`` was given.

    Set here rather than in addopts so that ``-p no:xdist`` still runs the suite (in this
    process, as ``-n 0`` does). Each xdist_group runs on one worker.
    """
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    if config.option.numprocesses is None:
        config.option.numprocesses = "auto"
    if config.option.dist == "no":
        config.option.dist = "loadgroup"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    skips = {
        "cuda": None
        if torch.cuda.is_available()
        else "needs a CUDA device: torch.cuda.is_available() is False",
        # The simulation refuses to shadow a usable device; such machines run the same
        # scenarios as `cuda` tests instead.
        "simulated": "needs no usable CUDA device: the simulation would shadow the real one"
        if torch.cuda.is_available()
        else None,
    }
    for item in items:
        for marker, reason in skips.items():
            if reason is not None and item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    """cgguard warns once per process; each test starts with nothing said yet."""
    # Not through monkeypatch: taking that fixture here would delay its undo past the
    # teardown of fixtures that check torch is back as it was.
    said = set(_warn._said)
    _warn._said.clear()
    yield
    _warn._said.clear()
    _warn._said.update(said)


@pytest.fixture
def events() -> Iterator[list[dict[str, Any]]]:
    """The full event of every violation reported during the test, in order."""
    with capture_violations() as seen:
        yield seen


@pytest.fixture(autouse=True)
def _clean_cuda_device(request: pytest.FixtureRequest) -> Iterator[None]:
    """A `cuda` test leaves no capture open, its work finished and the default stream current.

    So a capture that failed (and left its stream current, or open) cannot fail the tests after
    it, in any order or selection. What cannot be cleaned up fails the test's teardown, reported
    beside the test's own result, never instead of it. Named to sort before _clean_process (pytest
    sets autouse fixtures up in name order) so that its teardown comes after cgguard's uninstall
    and works on torch's own entry points.
    """
    if request.node.get_closest_marker("cuda") is None:
        yield
        return
    import torch
    from cuda_hygiene import pool_streams, restore

    pool = pool_streams()
    yield

    def streams() -> Iterator[Any]:
        default = torch.cuda.default_stream()
        side = torch.cuda.graph.default_capture_stream
        listed = [torch.cuda.current_stream(), *pool, *([side] if side is not None else [])]
        yield from (s for s in listed if s != default)

    problems = restore(streams())
    if problems:
        pytest.fail("the CUDA device was left unclean:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def _clean_process() -> Iterator[None]:
    environ = dict(os.environ)
    path = list(sys.path)
    listeners = list(_process.PROCESS.listeners)  # a session under `pytest --cgguard` has its own
    yield
    cgguard.uninstall()
    _process.reset()
    _process.PROCESS.listeners.extend(listeners)
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


@pytest.fixture(
    params=[
        pytest.param("simulated", marks=pytest.mark.simulated),
        pytest.param("cuda", marks=pytest.mark.cuda),
    ]
)
def runtime(request: pytest.FixtureRequest) -> Iterator[Runtime]:
    """Each end-to-end scenario runs on the simulated runtime here, and on CUDA where it exists."""
    if request.param == "cuda":
        yield Runtime("cuda", "cuda", None)
        return
    from cgguard.testing import simulated_cuda

    with simulated_cuda() as simulation:
        yield Runtime("simulated", "cpu", simulation)
