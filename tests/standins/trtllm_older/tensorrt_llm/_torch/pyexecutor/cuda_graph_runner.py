"""Stand-in: the shape of TensorRT-LLM's tensorrt_llm/_torch/pyexecutor/cuda_graph_runner.py at
revision 000a01de66f0eab4ab05640711f0253f50f5209c, where the capture mark is per thread."""

import threading

import torch


class graph_capturing_local(threading.local):  # noqa: N801 - the framework's own name
    def __init__(self) -> None:
        self.is_graph_capturing = False


_local = graph_capturing_local()


def set_graph_capturing(enable: bool) -> None:
    _local.is_graph_capturing = enable


def is_graph_capturing() -> bool:
    return _local.is_graph_capturing


class DecodingCUDAGraphRunner:
    """One batch size's graph; captured at warm-up, or on first use while serving."""

    def __init__(self) -> None:
        self._graph = None

    def capture(self, forward_fn):  # type: ignore[no-untyped-def]
        self._graph = torch.cuda.CUDAGraph()
        # As the real runner: the mark spans the warm-up runs and the capture.
        set_graph_capturing(True)
        for _ in range(2):
            forward_fn()
        with torch.cuda.graph(self._graph):  # @older-capture
            forward_fn()
        set_graph_capturing(False)  # @older-closes
        return self._graph
