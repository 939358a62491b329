"""The only module that touches torch: which of its entry points carry which of the guard's hooks.

The hooks go on the classes themselves (``torch.cuda.graphs.graph`` and the real ``CUDAGraph``,
``Stream`` and ``Event``), so references taken earlier, subclasses and ``from torch.cuda import
graph`` are all covered. Arguments pass through untouched: the signatures differ across torch
releases.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

import wrapt

from cgguard._guard import (
    API_ACCELERATOR_SYNCHRONIZE,
    API_EVENT_ELAPSED_TIME,
    API_EVENT_QUERY,
    API_EVENT_SYNCHRONIZE,
    API_STREAM_QUERY,
    API_STREAM_SYNCHRONIZE,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from cgguard._guard import Guard


def real_class(cls: type) -> type:
    """``cls``, or the torch class that a stand-in for it (a subclass of another module) extends.

    cgguard's hooks belong on torch's own classes, whatever stands in torch.cuda's namespace.
    """
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] == "torch":
            return klass
    return cls


def _wrapt(wrapper: Callable[[Any, Any, Any, Any], Any]) -> Callable[[Any], Any]:
    """What replaces an entry point with a wrapt wrapper around it."""
    return lambda original: wrapt.FunctionWrapper(original, wrapper)


def patch_torch(guard: Guard) -> None:
    """Put the guard's hooks on torch's entry points. Raises, torch untouched, if torch is not
    as expected."""
    graphs = importlib.import_module("torch.cuda.graphs")
    streams = importlib.import_module("torch.cuda.streams")
    cuda_graph = real_class(graphs.CUDAGraph)
    stream, event = real_class(streams.Stream), real_class(streams.Event)
    cuda = importlib.import_module("torch.cuda")
    # Looked up at each call: the simulated runtime replaces it while it is in place.
    guard.is_capturing = lambda: bool(cuda.is_current_stream_capturing())
    guard.is_current_stream = lambda stream: bool(stream == cuda.current_stream())
    guard.stream_captures = lambda stream: _stream_captures(cuda, stream)
    guard.patches.apply(
        [
            (graphs.graph, "__enter__", _wrapt(guard.graph_enter)),
            (cuda_graph, "capture_begin", _wrapt(guard.capture_begin)),
            (cuda_graph, "capture_end", guard.make_capture_end),
            # The Python methods on the real classes: subclasses and bound methods land here.
            (stream, "synchronize", _wrapt(guard.checks_sync(API_STREAM_SYNCHRONIZE))),
            (event, "synchronize", _wrapt(guard.checks_sync(API_EVENT_SYNCHRONIZE))),
            (stream, "query", _wrapt(guard.checks_sync(API_STREAM_QUERY))),
            (event, "query", _wrapt(guard.checks_sync(API_EVENT_QUERY))),
            (event, "record", guard.make_event_record),
            (event, "elapsed_time", _wrapt(guard.checks_sync(API_EVENT_ELAPSED_TIME))),
        ]
    )
    try:
        guard.patches.apply(_accelerator_entry_points(guard))
        patch_device_sync(guard)
    except BaseException:
        guard.patches.restore()
        raise


def _stream_captures(cuda: ModuleType, stream: Any) -> bool:
    """Whether ``stream`` is capturing: torch answers only for the current stream, so the
    stream is made current for the question (a thread-local setting, no CUDA call) and the
    previous one put back. Asked only while something captures."""
    previous = cuda.current_stream()
    if stream == previous:
        return bool(cuda.is_current_stream_capturing())
    cuda.set_stream(stream)
    try:
        return bool(cuda.is_current_stream_capturing())
    finally:
        cuda.set_stream(previous)


def _accelerator_entry_points(guard: Guard) -> list[tuple[Any, str, Callable[[Any], Any]]]:
    """torch.accelerator's graph and synchronize (torch 2.13 and later), where torch has them.

    ``torch.accelerator.Graph`` is Python over the C ``_acceleratorGraph``: its ``__enter__``
    calls ``torch.accelerator.synchronize()``, empties the caches and calls ``capture_begin``,
    as ``torch.cuda.graph`` does. ``torch.accelerator.synchronize()`` lands in
    ``torch._C._accelerator_synchronizeDevice``, which is wrapped for the same reason as
    ``_cuda_synchronize``.
    """
    accelerator = sys.modules.get("torch.accelerator")
    graph_class = getattr(accelerator, "Graph", None)
    if not isinstance(graph_class, type):
        return []
    graph_class = real_class(graph_class)
    c_module = sys.modules["torch._C"]
    points: list[tuple[Any, str, Callable[[Any], Any]]] = [
        (graph_class, "__enter__", _wrapt(guard.accelerator_enter)),
        (graph_class, "capture_begin", _wrapt(guard.accelerator_begin)),
        (graph_class, "capture_end", guard.make_capture_end),
    ]
    if "_accelerator_synchronizeDevice" in vars(c_module):
        points.append(
            (
                c_module,
                "_accelerator_synchronizeDevice",
                lambda original: guard.make_device_sync(original, API_ACCELERATOR_SYNCHRONIZE),
            )
        )
    return points


# torch.cuda.synchronize() lands in torch._C._cuda_synchronize: wrapping that, rather than the
# Python function, also catches ``from torch.cuda import synchronize`` bound before install.
# CPU builds have no such function; the simulated runtime adds one while it is active, and
# cgguard.testing has cgguard._install call patch_device_sync() again as it comes.


def patch_device_sync(guard: Guard) -> None:
    """Wrap torch._C._cuda_synchronize if it exists and the guard's wrapper is not there."""
    c_module = sys.modules["torch._C"]
    if guard.device_sync.holds(c_module, "_cuda_synchronize"):
        return
    guard.device_sync.restore()  # a wrapper of ours replaced since is only forgotten
    if "_cuda_synchronize" in vars(c_module):
        guard.device_sync.wrap(c_module, "_cuda_synchronize", guard.make_device_sync)
