"""The only module that touches torch: which of its entry points carry which of the capture
path's hooks.

The hooks go on the classes themselves (``torch.cuda.graphs.graph`` and the real ``CUDAGraph``,
``Stream`` and ``Event``), so references taken earlier, subclasses and ``from torch.cuda import
graph`` are all covered. Arguments pass through untouched: the signatures differ across torch
releases.
"""

from __future__ import annotations

import importlib
import sys
from functools import partial
from typing import TYPE_CHECKING, Any

import wrapt

from cgguard._core import hooks
from cgguard._core.probes import Probes, runs_kernels
from cgguard._core.syncs import SyncChecks
from cgguard._core.tracker import Tracker
from cgguard._rules.record import (
    API_ACCELERATOR_CAPTURE_BEGIN,
    API_ACCELERATOR_GRAPH,
    API_ACCELERATOR_SYNCHRONIZE,
    API_EVENT_ELAPSED_TIME,
    API_EVENT_QUERY,
    API_EVENT_SYNCHRONIZE,
    API_STREAM_QUERY,
    API_STREAM_SYNCHRONIZE,
)
from cgguard._support.patchset import describe

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from cgguard._core.installation import Installation
    from cgguard._core.probes import Device


def real_class(cls: type) -> type:
    """``cls``, or the torch class that a stand-in for it extends or names.

    cgguard's hooks belong on torch's own classes, whatever stands in torch.cuda's namespace. A
    stand-in extends torch's class where it can (on CPU-only builds); where it cannot (on CUDA
    builds torch's are C types that need a driver) it names it as ``_cgguard_stands_for``.
    """
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] == "torch":
            return klass
    named = getattr(cls, "_cgguard_stands_for", None)
    return named if isinstance(named, type) else cls


def _standins() -> list[tuple[str, type]]:
    """The classes in torch.cuda's namespace that stand for torch's without extending them, each
    with its name there. Hooks on torch's classes do not reach them: they carry their own."""
    cuda = sys.modules["torch.cuda"]
    found = []
    for name in _KINDS:
        cls = getattr(cuda, name, None)
        if isinstance(cls, type) and not issubclass(cls, real_class(cls)):
            found.append((name, cls))
    return found


def _wrapt(wrapper: Callable[[Any, Any, Any, Any], Any]) -> Callable[[Any], Any]:
    """What replaces an entry point with a wrapt wrapper around it."""
    return lambda original: wrapt.FunctionWrapper(original, wrapper)


_KINDS = ("CUDAGraph", "Stream", "Event")


def _class_hooks(
    tracker: Tracker, syncs: SyncChecks
) -> dict[str, list[tuple[str, Callable[[Any], Any]]]]:
    """The capture path's hooks on torch's CUDAGraph, Stream and Event classes, by class name."""
    return {
        "CUDAGraph": [
            ("capture_begin", partial(hooks.capture_begin, tracker)),
            ("capture_end", partial(hooks.capture_end, tracker)),
        ],
        "Stream": [
            ("synchronize", _wrapt(syncs.checks(API_STREAM_SYNCHRONIZE))),
            ("query", _wrapt(syncs.checks(API_STREAM_QUERY))),
        ],
        "Event": [
            ("synchronize", _wrapt(syncs.checks(API_EVENT_SYNCHRONIZE))),
            ("query", _wrapt(syncs.checks(API_EVENT_QUERY))),
            # A plain function, as capture_end: it runs on every record, capturing or not.
            ("record", syncs.make_event_record),
            ("elapsed_time", _wrapt(syncs.checks(API_EVENT_ELAPSED_TIME))),
        ],
    }


def patch_torch(installation: Installation, device: Device | None = None) -> None:
    """Put a capture path's hooks on torch's entry points. Raises, torch untouched, if torch is
    not as expected. ``device``: a runtime standing in for CUDA's, whose answers the probes
    give in place of torch's."""
    graphs = importlib.import_module("torch.cuda.graphs")
    streams = importlib.import_module("torch.cuda.streams")
    classes = {
        "CUDAGraph": real_class(graphs.CUDAGraph),
        "Stream": real_class(streams.Stream),
        "Event": real_class(streams.Event),
    }
    gate = installation.gate
    tracker = Tracker(
        torch_probes().over(device),
        installation.reporter,
        flag=gate.flag,
        follows=gate.follows,
        notes=installation.notes,
    )
    syncs = SyncChecks(tracker)
    patches = installation.patches
    patches.apply(
        [
            (graphs.graph, "__enter__", partial(hooks.graph_enter, tracker)),
            # The Python methods on the real classes: subclasses and bound methods land here.
            *(
                (classes[kind], name, make)
                for kind, hooks in _class_hooks(tracker, syncs).items()
                for name, make in hooks
            ),
        ]
    )
    try:
        patches.apply(_accelerator_entry_points(tracker, syncs))
        installation.tracker, installation.syncs = tracker, syncs
        patch_device_sync(installation, device)
    except BaseException:
        installation.tracker = installation.syncs = None
        installation.replay.restore()
        patches.restore()
        raise


def torch_probes() -> Probes:
    """The probes as torch answers them: a CUDA tensor is on the device, and the caching
    allocator says whose pool a block is in."""
    cuda = importlib.import_module("torch.cuda")
    # Looked up at each call: a runtime standing in for CUDA's replaces them while in place.
    return Probes(
        is_capturing=lambda: bool(cuda.is_current_stream_capturing()),
        current_stream=lambda: cuda.current_stream(),  # noqa: PLW0108 - looked up per call
        is_current_stream=lambda stream: bool(stream == cuda.current_stream()),
        stream_captures=lambda stream: _stream_captures(cuda, stream),
        memory=_memory_probe(cuda),
        on_device=_is_cuda,
        allocator=True,
    )


def _is_cuda(value: Any) -> bool:
    """Whether ``value`` is a strided CUDA tensor with memory: an op's argument may be anything
    (a bool, a list), a sparse tensor has no storage of its own to copy or index, and a fake
    CUDA tensor runs no kernel."""
    torch = sys.modules["torch"]
    if not (isinstance(value, torch.Tensor) and value.is_cuda and value.layout == torch.strided):
        return False
    return runs_kernels(value)


def _memory_probe(cuda: ModuleType) -> Callable[[], tuple[int, int, int] | None] | None:
    """The census's reading of the allocator on the current device, or None on a CPU build.

    One call of torch's statistics (``torch._C._cuda_memoryStats``, what
    ``memory_stats_as_nested_dict`` returns): ``memory_reserved()`` and ``memory_allocated()``
    each build and flatten the whole dict. No synchronize: the allocator's counts are the host's
    own bookkeeping. Nothing while CUDA is not initialised, as where a runtime stands in for it.
    """
    c_module = sys.modules["torch._C"]
    stats = getattr(c_module, "_cuda_memoryStats", None)
    get_device = getattr(c_module, "_cuda_getDevice", None)
    if stats is None or get_device is None:
        return None

    def memory() -> tuple[int, int, int] | None:
        if not cuda.is_initialized():
            return None
        device = get_device()
        found = stats(device)
        return (
            device,
            int(found["reserved_bytes"]["all"]["current"]),
            int(found["allocated_bytes"]["all"]["current"]),
        )

    return memory


def _stream_captures(cuda: ModuleType, stream: Any) -> bool:
    """Whether ``stream`` is capturing: torch answers only for the current stream, so the
    stream is made current for the question, through torch.cuda.stream, which puts back the
    current stream of both devices when the stream is another device's (a thread-local
    setting, no CUDA call). Asked only while something captures."""
    if stream == cuda.current_stream():
        return bool(cuda.is_current_stream_capturing())
    with cuda.stream(stream):
        return bool(cuda.is_current_stream_capturing())


def _accelerator_entry_points(
    tracker: Tracker, syncs: SyncChecks
) -> list[tuple[Any, str, Callable[[Any], Any]]]:
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
        (graph_class, "__enter__", partial(hooks.graph_enter, tracker, api=API_ACCELERATOR_GRAPH)),
        (
            graph_class,
            "capture_begin",
            partial(hooks.capture_begin, tracker, api=API_ACCELERATOR_CAPTURE_BEGIN),
        ),
        (graph_class, "capture_end", partial(hooks.capture_end, tracker)),
    ]
    if "_accelerator_synchronizeDevice" in vars(c_module):
        points.append(
            (
                c_module,
                "_accelerator_synchronizeDevice",
                lambda original: syncs.make_device_sync(original, API_ACCELERATOR_SYNCHRONIZE),
            )
        )
    return points


# torch.cuda.synchronize() lands in torch._C._cuda_synchronize: wrapping that, rather than the
# Python function, also catches ``from torch.cuda import synchronize`` bound before install.
# CPU builds have no such function; a runtime standing in for CUDA's adds one while it is in
# place (and, on CUDA builds, stand-in classes that do not extend torch's), and tells
# cgguard._install as it comes and goes, which calls patch_device_sync() again.


def patch_device_sync(installation: Installation, device: Device | None = None) -> None:
    """Wrap torch._C._cuda_synchronize if it exists, and the hooked methods of stand-ins that do
    not extend torch's classes, where the tracker's wrappers are not all there already; and
    take ``device``'s answers (None: torch's own) into the probes."""
    tracker, syncs = installation.tracker, installation.syncs
    if tracker is None or syncs is None:
        return
    tracker.probes = torch_probes().over(device)
    c_module = sys.modules["torch._C"]
    changes: list[tuple[Any, str, Callable[[Any], Any]]] = []
    if "_cuda_synchronize" in vars(c_module):
        changes.append((c_module, "_cuda_synchronize", syncs.make_device_sync))
    hooks = _class_hooks(tracker, syncs)
    changes += [(cls, name, make) for kind, cls in _standins() for name, make in hooks[kind]]
    wanted = [describe(owner, name) for owner, name, _ in changes]
    # Where CUDAGraph.replay lands, for watchers of replays (Installation.set_watchers).
    installation.replay_targets = [
        (real_class(importlib.import_module("torch.cuda.graphs").CUDAGraph), "replay"),
        *((cls, "replay") for kind, cls in _standins() if kind == "CUDAGraph"),
    ]
    installation.set_watchers(installation.watchers)
    device_sync = installation.device_sync
    if device_sync.targets() == wanted and all(
        device_sync.holds(owner, name) for owner, name, _ in changes
    ):
        return
    device_sync.restore()  # a wrapper of ours replaced since is only forgotten
    device_sync.apply(changes)
