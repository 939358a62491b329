"""The only module that touches torch: wrappers on its capture and synchronize entry points.

They are wrapt wrappers, except two plain functions where wrapt's call protocol would cost more
than the work itself on every capture: capture_end, and torch._C._cuda_synchronize, which
torch.cuda.graph's own __enter__ calls. They go on the classes themselves
(``torch.cuda.graphs.graph`` and the real ``CUDAGraph``), so references taken earlier,
subclasses and ``from torch.cuda import graph`` are all covered. Arguments pass through
untouched: the signatures differ across torch releases.
"""

from __future__ import annotations

import functools
import importlib
import sys
from threading import get_ident
from typing import Any

import wrapt

from cgguard import _guard, _state
from cgguard._frames import snapshot, with_stack

_ABSENT = object()
_STANDIN_MARKER = "__cgguard_standin__"


def real_class(cls: type) -> type:
    """``cls``, or the class a simulated stand-in of it was made from."""
    for klass in cls.__mro__:
        if _STANDIN_MARKER not in klass.__dict__:
            return klass
    return cls


def _error_mode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    # capture_begin(pool=None, capture_error_mode="global", ...) in every supported release.
    if "capture_error_mode" in kwargs:
        return str(kwargs["capture_error_mode"])
    return str(args[1]) if len(args) > 1 else "global"


# The wrappers below run on every capture: they do the least work that keeps the record of
# active captures true, and leave everything else to cgguard._guard's slow path.


def _graph_enter(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    # Checked before torch's __enter__ runs: it synchronizes, empties the cache and switches the
    # current stream before capture_begin, and a refusal raised after that would leave the
    # thread on the capture stream for good, since __exit__ never runs.
    graph, thread = id(instance.cuda_graph), get_ident()
    stack = with_stack(sys._getframe(1))
    mode = instance.capture_error_mode
    record: _guard.Record
    quiet = not _state.active and _state.capture_enabled and not _state.flag_sources
    if quiet:
        record = (graph, thread, _guard.API_GRAPH, mode, stack)
    else:
        record = _guard.check_begin(_guard.API_GRAPH, graph, mode, stack)
    # For the capture_begin that __enter__ makes: its record, and whether there was anything
    # to check. Passed aside, not through the active captures: torch's own synchronize before
    # capture_begin is no synchronize during a capture.
    key = (thread, graph)
    _state.entering[key] = (record, quiet)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _state.entering.pop(key, None)


def _capture_begin(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    graph = id(instance)
    entry = _state.entering.pop((get_ident(), graph), None)
    record: _guard.Record
    if entry is not None:
        # The capture_begin that torch.cuda.graph.__enter__ makes: checked by the wrapper
        # around __enter__; one capture, not two.
        record, quiet = entry
        if quiet and _state.active:
            # Another thread began a capture while torch prepared this one.
            _guard.recheck_concurrent(record)
    else:
        # Walked now: a raw capture_begin is often made by a helper that returns at once, and
        # its callers move on while the capture stays active.
        record = _guard.check_begin(
            _guard.API_CAPTURE_BEGIN, graph, _error_mode(args, kwargs), snapshot(1)
        )
    result = wrapped(*args, **kwargs)
    _state.active[graph] = record
    return result


def _ends_capture(original: Any) -> Any:
    """CUDAGraph.capture_end, forgetting the capture however capture_end ends.

    A plain function, not a wrapt wrapper: it runs on every capture and does one dict pop, and
    wrapt's binding and call protocol would cost several times that pop (about 1 us of the
    capture path, benchmarks/capture_overhead.py). Put on the class, a function binds as the
    method it replaces, so it covers subclasses as a wrapt wrapper would.
    """

    @functools.wraps(original)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            # Whether capture_end succeeded or not, CUDA has left capture mode on that stream.
            _state.active.pop(id(self), None)

    return capture_end


def _wrapt_wrapper(wrapper: Any) -> Any:
    """What replaces an entry point with a wrapt wrapper around it."""
    return lambda original: wrapt.FunctionWrapper(original, wrapper)


def _checks_sync(api: str) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if _state.active:  # nothing capturing, nothing to check
            _guard.check_sync(api)
        return wrapped(*args, **kwargs)

    return wrapper


def _device_sync(original: Any) -> Any:
    """torch._C._cuda_synchronize, checked.

    A plain function, not a wrapt wrapper: torch.cuda.graph.__enter__ calls this on every
    capture, a C function has no binding or signature for wrapt to preserve, and wrapt's call
    protocol costs more here than the rest of the capture path together.
    """

    @functools.wraps(original)
    def synchronize(*args: Any, **kwargs: Any) -> Any:
        if _state.active:  # nothing capturing, nothing to check
            _guard.check_sync(_guard.API_SYNCHRONIZE)
        return original(*args, **kwargs)

    return synchronize


def patch_torch() -> None:
    """Wrap torch's capture and synchronize entry points. Raises if torch is not as expected."""
    if _state.patches:
        return
    # No capture recorded before these patches can end through them: one a capture_begin
    # wrapper recorded while another thread uninstalled would otherwise stay active for good.
    _state.active.clear()
    _state.entering.clear()
    graphs = importlib.import_module("torch.cuda.graphs")
    streams = importlib.import_module("torch.cuda.streams")
    cuda_graph = real_class(graphs.CUDAGraph)
    stream, event = real_class(streams.Stream), real_class(streams.Event)
    targets = (
        (graphs.graph, "__enter__", _wrapt_wrapper(_graph_enter)),
        (cuda_graph, "capture_begin", _wrapt_wrapper(_capture_begin)),
        (cuda_graph, "capture_end", _ends_capture),
        # The Python methods on the real classes: subclasses and bound methods all land here.
        (stream, "synchronize", _wrapt_wrapper(_checks_sync(_guard.API_STREAM_SYNCHRONIZE))),
        (event, "synchronize", _wrapt_wrapper(_checks_sync(_guard.API_EVENT_SYNCHRONIZE))),
    )
    try:
        for owner, name, replace in targets:
            original = owner.__dict__.get(name, _ABSENT)
            setattr(owner, name, replace(getattr(owner, name)))
            _state.patches.append((owner, name, original))
        refresh_device_sync()
    except BaseException:
        unpatch_torch()
        raise


def unpatch_torch() -> None:
    """Put back exactly what patch_torch() replaced."""
    release_device_sync()
    _state.entering.clear()
    while _state.patches:
        owner, name, original = _state.patches.pop()
        if original is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


# torch.cuda.synchronize() lands in torch._C._cuda_synchronize: wrapping that, rather than the
# Python function, also catches ``from torch.cuda import synchronize`` bound before install.
# CPU builds have no such function; the simulated runtime adds one while it is active, and
# calls the two functions below as it comes and goes.


def refresh_device_sync() -> None:
    """Wrap torch._C._cuda_synchronize if it exists, cgguard is installed and it is not wrapped."""
    c_module = sys.modules["torch._C"]
    current = c_module.__dict__.get("_cuda_synchronize")
    held = _state.device_sync
    if held is not None and current is held[1]:
        return
    _state.device_sync = None  # replaced or removed since: nothing of ours to restore
    if current is not None and _state.patches:
        wrapper = _device_sync(current)
        setattr(c_module, "_cuda_synchronize", wrapper)  # noqa: B010 - absent on CPU builds
        _state.device_sync = (current, wrapper)


def release_device_sync() -> None:
    """Put torch._C._cuda_synchronize back, if cgguard's wrapper is still the one there."""
    held, _state.device_sync = _state.device_sync, None
    c_module = sys.modules.get("torch._C")
    if held is not None and c_module is not None:
        original, wrapper = held
        if c_module.__dict__.get("_cuda_synchronize") is wrapper:
            setattr(c_module, "_cuda_synchronize", original)  # noqa: B010 - as above
