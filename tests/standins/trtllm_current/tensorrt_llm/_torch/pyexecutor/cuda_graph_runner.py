"""Stand-in: the shape of TensorRT-LLM's tensorrt_llm/_torch/pyexecutor/cuda_graph_runner.py in
current releases (the CUDAGraphRunner with allow_capture()), where the capture mark is per
runner: on-the-fly capture is off unless inside ``with runner.allow_capture():``."""

import contextlib

import torch


class CUDAGraphRunner:
    """Every graph of a model engine, keyed by batch shape."""

    WARMUP_STEPS = 2

    def __init__(self) -> None:
        self.graphs = {}
        # As the real runner: capture is refused by default, allowed during warm-up only.
        self._capture_allowed = False

    def needs_capture(self, key):  # type: ignore[no-untyped-def]
        return self._capture_allowed and key not in self.graphs

    @contextlib.contextmanager
    def allow_capture(self):  # type: ignore[no-untyped-def]
        self._capture_allowed = True
        try:
            yield
        finally:
            self._capture_allowed = False

    def capture(self, key, forward_fn):  # type: ignore[no-untyped-def]
        graph = torch.cuda.CUDAGraph()
        for _ in range(self.WARMUP_STEPS):
            forward_fn()
        with torch.cuda.graph(graph):  # @current-capture
            forward_fn()
        self.graphs[key] = graph
