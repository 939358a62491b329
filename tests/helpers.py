"""Helpers shared by the test files: marked source lines, vLLM's sentence, a clean environment."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from cgguard import _process

# The sentence that opens every capture_disabled message: vLLM's own wording.
DISABLED_SENTENCE = (
    "CUDA graph capturing detected at an inappropriate time. This operation is currently disabled."
)


def tracker() -> Any:
    """The capture path of the installation in effect (torch is patched)."""

    installation = _process.PROCESS.installation
    assert installation is not None
    assert installation.tracker is not None
    return installation.tracker


def run_seen() -> Any:
    """What the installation in effect has seen."""

    assert _process.PROCESS.installation is not None
    return _process.PROCESS.installation.run


def patched_count() -> int:
    """How many of torch's entry points install() patches here: torch_entry_points(), and
    torch._C._cuda_synchronize where the build has it (CUDA builds; on CPU builds only the
    simulated runtime adds one)."""
    import torch

    return len(torch_entry_points()) + int(hasattr(torch._C, "_cuda_synchronize"))


def standin_hooks() -> list[str]:
    """The hooks the simulated runtime's stand-ins carry themselves while cgguard is installed:
    on a CUDA build they cannot extend torch's classes, so torch's hooks do not reach them."""
    import torch

    if not torch.backends.cuda.is_built():
        return []
    return [
        "cgguard.testing._simcuda._SimulatedCUDAGraph.capture_begin",
        "cgguard.testing._simcuda._SimulatedCUDAGraph.capture_end",
        "cgguard.testing._simcuda._SimulatedStream.synchronize",
        "cgguard.testing._simcuda._SimulatedStream.query",
        "cgguard.testing._simcuda._SimulatedEvent.synchronize",
        "cgguard.testing._simcuda._SimulatedEvent.query",
        "cgguard.testing._simcuda._SimulatedEvent.record",
        "cgguard.testing._simcuda._SimulatedEvent.elapsed_time",
    ]


class SourceFile:
    """A Python file whose lines are found by the comment that ends them, ``# marker``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.lines = Path(path).read_text().splitlines()

    def line_of(self, marker: str) -> int:
        """The number of the one line that ends with the comment ``# marker``."""
        (line,) = [n for n, text in enumerate(self.lines, 1) if text.endswith(f"# {marker}")]
        return line

    def frame(self, marker: str, function: str) -> dict[str, Any]:
        """The rendered frame cgguard must report for the line marked ``marker``."""
        line = self.line_of(marker)
        code = self.lines[line - 1].strip()
        return {"file": self.path, "line": line, "function": function, "code": code}


def clean_environ(**changes: str) -> dict[str, str]:
    """This process's environment without CGGUARD_* and PYTHON* variables, plus ``changes``.

    PYTHON* goes too (PYTHONPATH above all), so that no setting of the caller's (such as
    PYTHONSAFEPATH or PYTHONDONTWRITEBYTECODE) changes what the programs started with it see.
    """
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("CGGUARD_", "PYTHON"))
    }
    return {**kept, **changes}


# What ``cgguard info`` prints for each setting and rule left at its default, in order.
DEFAULT_CONFIGURATION = [
    "  mode           raise        (default)",
    "  log_format     json, or console when stderr is a terminal (default)",
    "  log_file       none         (default)",
    "  log_target     stderr       (default)",
    "  log_level      debug        (default)",
    "  report         none         (default)",
    "  capture        as it is (enabled at start) (default)",
    "  simulate_cuda  False        (default)",
    "  vllm_bridge    True         (default)",
    "  exempt         none         (default)",
    "  exempt_file    none         (default)",
    "  window         none         (default)",
    "  profiles       log          (default)",
    "  profile        vllm: vLLM Model Runner V2, 2 windows, 3 exemptions",
    "  profile        sglang: SGLang, 6 windows, 8 exemptions",
    "  profile        tensorrt_llm: TensorRT-LLM (PyTorch backend), 2 windows, 0 exemptions",
    "  inspect        False        (default)",
    "  inspect_first  every capture of each site (default)",
    "  census         True         (default)",
    "  census_replays False        (default)",
    "  metrics        none         (default)",
    "  manifest       True         (default)",
    "  rank_check     False        (default)",
    "  rule           capture_disabled: raise (default)",
    "  rule           nested_capture: raise (default)",
    "  rule           concurrent_capture: log (default)",
    "  rule           sync_during_capture: log (default)",
    "  rule           abandoned_capture: log (default)",
    "  rule           implicit_sync: raise (default)",
    "  rule           dead_input: raise (default)",
    "  rule           stale_binding: raise (default)",
    "  rule           rng_during_capture: raise (default)",
    "  rule           first_use_in_capture: log (default)",
    "  rule           rank_divergence: log (default)",
]


def torch_entry_points() -> tuple[str, ...]:
    """What install() patches on the installed torch, in order, without a CUDA runtime
    (torch._C._cuda_synchronize comes and goes with one, real or simulated)."""
    import torch

    points = (
        "torch.cuda.graphs.graph.__enter__",
        "torch.cuda.graphs.CUDAGraph.capture_begin",
        "torch.cuda.graphs.CUDAGraph.capture_end",
        "torch.cuda.streams.Stream.synchronize",
        "torch.cuda.streams.Stream.query",
        "torch.cuda.streams.Event.synchronize",
        "torch.cuda.streams.Event.query",
        "torch.cuda.streams.Event.record",
        "torch.cuda.streams.Event.elapsed_time",
    )
    if isinstance(getattr(getattr(torch, "accelerator", None), "Graph", None), type):
        points += (
            "torch.accelerator.graphs.Graph.__enter__",
            "torch.accelerator.graphs.Graph.capture_begin",
            "torch.accelerator.graphs.Graph.capture_end",
        )
        if "_accelerator_synchronizeDevice" in vars(torch._C):
            points += ("torch._C._accelerator_synchronizeDevice",)
    return points


class AliveThread:
    """Stands in for another running thread, as captures remember it (a ThreadRef)."""

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.name = f"thread-{ident}"

    def __call__(self) -> object:
        return self  # a live reference: the thread runs


_stand_ins: dict[int, Any] = {}


def thread(ident: int) -> Any:
    """This thread for its own id; a stand-in, one per id, for any other."""
    if ident == threading.get_ident():
        from cgguard._support.threads import this_thread

        return this_thread()
    return _stand_ins.setdefault(ident, AliveThread(ident))
