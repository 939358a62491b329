"""Leaving a CUDA device as a test found it: no capture open, work finished, default stream current.

A capture a failed test leaves open poisons what comes after it: torch hands out streams from a
pool of 32 per priority, so a later test's new stream may be the capturing one, and an open
global-mode capture forbids every later synchronize in the process. torch's own clean-up does
not end a capture (``CUDAGraph::reset`` in aten/src/ATen/cuda/CUDAGraph.cpp only drops its
bookkeeping), so this ends it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

# c10/cuda/CUDAStream.cpp: kStreamsPerPool streams per priority, handed out round robin.
STREAMS_PER_POOL = 32


@functools.cache
def pool_streams() -> tuple[Any, ...]:
    """One of each stream torch's pools hand out on the current device.

    Asking for 32 streams of a priority goes once round that priority's pool. Listed once, and
    before any capture: the priority range is a CUDA call.
    """
    import torch

    least, greatest = torch.cuda.Stream().priority_range()
    return tuple(
        torch.cuda.Stream(priority=priority)
        for priority in range(least, greatest - 1, -1)
        for _ in range(STREAMS_PER_POOL)
    )


def is_capturing(stream: Any) -> bool:
    """Whether ``stream`` is capturing (an invalidated capture counts until it is ended)."""
    import torch

    with torch.cuda.stream(stream):
        return bool(torch.cuda.is_current_stream_capturing())


def end_capture_on_gpu(stream: Any) -> None:
    """End the capture on ``stream``: through its graph where torch still has it, else in CUDA.

    The graph's own ``capture_end`` also undoes torch's bookkeeping (the allocator's pool).
    Without the graph (its Python object already freed), cuStreamEndCapture ends the capture
    and cuGraphDestroy frees what it captured. A capture begun in global or thread_local mode by
    a thread that has ended cannot be ended (cudaErrorStreamCaptureWrongThread).
    """
    import torch

    with torch.cuda.stream(stream):
        find = getattr(torch.cuda.CUDAGraph, "get_currently_capturing_graph", None)
        if find is not None:
            # An invalidated capture's end fails, yet ends it: whether it ended is checked below.
            with contextlib.suppress(Exception):
                find().capture_end()
        if not torch.cuda.is_current_stream_capturing():
            return
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    driver = ctypes.CDLL(name)
    graph = ctypes.c_void_p()
    status = driver.cuStreamEndCapture(ctypes.c_void_p(stream.cuda_stream), ctypes.byref(graph))
    if status == 0 and graph.value:
        driver.cuGraphDestroy(graph)


def restore(
    streams: Iterable[Any], end_capture: Callable[[Any], None] = end_capture_on_gpu
) -> list[str]:
    """End every capture open on ``streams``, synchronize, make the default stream current.

    Each step runs whatever the one before it did; what went wrong is returned, one line each,
    for the caller to report after the test's own result. The synchronize is skipped while a
    capture stays open: it would fail, and invalidate that capture.
    """
    import torch

    problems: list[str] = []
    try:
        candidates = list(streams)
    except Exception as exc:
        candidates = []
        problems.append(f"could not list the streams to check: {exc!r}")
    still_open = 0
    seen: set[int] = set()
    for stream in candidates:
        try:
            handle = int(stream.cuda_stream)
            if handle in seen:
                continue
            seen.add(handle)
            if not is_capturing(stream):
                continue
        except Exception as exc:
            problems.append(f"could not check {stream!r}: {exc!r}")
            continue
        failure = ""
        try:
            end_capture(stream)
        except Exception as exc:  # an invalidated capture's end fails, yet ends it
            failure = f": {exc!r}"
        try:
            ended = not is_capturing(stream)
        except Exception as exc:
            ended, failure = False, f"{failure}; checking again failed: {exc!r}"
        if not ended:
            still_open += 1
            problems.append(
                f"a capture stays open on {stream!r} (begun by a thread now gone?){failure}"
            )
    if not still_open:
        try:
            torch.cuda.synchronize()
        except Exception as exc:
            problems.append(f"torch.cuda.synchronize() failed: {exc!r}")
    try:
        torch.cuda.set_stream(torch.cuda.default_stream())
    except Exception as exc:
        problems.append(f"could not make the default stream current again: {exc!r}")
    return problems
