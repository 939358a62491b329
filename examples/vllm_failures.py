"""Two vLLM capture failures, reproduced with plain torch calls.

A model runner captures its CUDA graphs at start-up, then disables capture and serves. Two
pieces of code it does not own break its rules:

1. a kernel plugin that lazily captures a graph of its own on first use, after capture was
   disabled (vLLM: "CUDA graph capturing detected at an inappropriate time. This operation is
   currently disabled.");
2. a fused-op helper that opens a capture inside the runner's capture (vLLM: "Nested
   BreakableCUDAGraphCapture is not supported.").

Neither calls vLLM's guarded wrappers, so vLLM's own checks never see them. Run it under
cgguard, on a GPU or on the simulated runtime:

    python -m cgguard run --simulate-cuda --log-format console examples/vllm_failures.py

The program itself knows nothing of cgguard except the capture flag its runner sets.
"""

from __future__ import annotations

import torch

import cgguard


class KernelPlugin:
    """A third-party kernel that captures its own graph the first time it is called."""

    def __init__(self) -> None:
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self, x: torch.Tensor) -> None:
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):  # lazy capture, whenever first called
                x.mul_(2)
        self.graph.replay()


def fused_op(x: torch.Tensor) -> None:
    """A helper that captures its own piece, unaware that its caller is capturing already."""
    piece = torch.cuda.CUDAGraph()
    with torch.cuda.graph(piece):
        x.add_(1)


def capture_model(x: torch.Tensor) -> torch.cuda.CUDAGraph:
    """The runner's start-up capture of the model's forward pass."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
        fused_op(x)  # failure 2: a capture inside this one
    return graph


def serve(plugin: KernelPlugin, x: torch.Tensor) -> None:
    """Serving: capture is over, so a capture now corrupts the graph memory pool."""
    cgguard.set_capture_enabled(False)  # what vLLM does once its capture phase ends
    plugin(x)  # failure 1: the plugin captures on first use


def main() -> None:
    x = torch.zeros(8, device="cuda")
    for name, step in (
        ("start-up capture", lambda: capture_model(x)),
        ("serving", lambda: serve(KernelPlugin(), x)),
    ):
        try:
            step()
            print(f"{name}: completed")
        except cgguard.CaptureViolation as exc:  # cgguard refused it; its report says why
            print(f"{name}: refused ({type(exc).__name__})")
        except RuntimeError as exc:  # what a serving loop catches, logs, and lives with
            print(f"{name}: failed: {exc}")


if __name__ == "__main__":
    main()
