"""The simulated CUDA device: GPU code's requests for CUDA memory get host memory, and the calls
that name the device are answered for its one device, cuda:0.

A ``TorchFunctionMode`` at the bottom of each served thread's mode stack rewrites every request
for CUDA memory before torch sees it: a ``device=`` naming CUDA (factory functions, ``*_like``,
``new_*``), ``Tensor.to`` to CUDA, ``Tensor.cuda()`` (and so ``Module.cuda()`` and
``Module.to("cuda")``, which call them per tensor), ``pin_memory``. Every such request gets new
host memory, as on a GPU a host tensor moved to the device gets new device memory. The tensors
say ``device(type='cpu')``: they are CPU tensors, so torch.compile, torch.distributed over gloo
and torch's dispatch modes take them as what they are. Why it is done so, and what it cannot
serve, is in docs/testing-without-a-gpu.md.

A mode stack is per thread (torch's PythonTorchFunctionTLS): the mode goes on the thread that
begins the simulation and on each thread that ``threading`` starts while it lasts. A thread that
outlives the simulation keeps the mode, which then forwards every call untouched.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType

    from cgguard._support.patchset import PatchSet

# What torch.cuda.get_device_name() says of the simulated device.
DEVICE_NAME = "cgguard simulated CUDA device (no GPU)"
_SERVED = (
    "it answers current_device(), set_device(0), get_device_name() and synchronize() for its one "
    "device, cuda:0, and torch itself has no CUDA here"
)
# Whether requests are rewritten now: the mode stays on threads that outlive a simulation.
_serving = False
# How the simulated runtime words a CUDA error (torch.AcceleratorError where torch has it), set
# by answer_device_calls().
_cuda_error: Callable[[str], Exception] = RuntimeError


def _invalid_ordinal(index: int) -> Exception:
    # What CUDA says of a device index it does not have (cudaErrorInvalidDevice), through torch's
    # AT_CUDA_CHECK on cudaSetDevice.
    return _cuda_error(
        f"CUDA error: invalid device ordinal (cuda:{index}; cgguard's simulated CUDA runtime has "
        "one device, cuda:0)"
    )


def _check_index(index: int | None) -> None:
    # None and -1: the current device (torch's _get_device_index finds no current device where
    # torch.cuda.is_available() is false, and answers None), which is cuda:0.
    if index is not None and index > 0:
        raise _invalid_ordinal(index)


def _cuda_index(device: object) -> int | None:
    """The CUDA device index a ``device`` argument names, -1 for CUDA without an index, None
    where it names no CUDA device. A bare int is an accelerator index, CUDA's on a GPU machine
    (torch/csrc/utils/python_arg_parser.h, deviceOptional)."""
    if isinstance(device, str):
        # Parsed here, not by torch.device(), to stay plain Python for dynamo; a string this
        # does not read ("cuda:x") is left to torch, which refuses it in its own words.
        if device == "cuda":
            return -1
        number = device[5:]
        if device.startswith("cuda:") and number.isdecimal() and number.isascii():
            return int(number)
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if getattr(device, "type", None) != "cuda":
        return None
    index = getattr(device, "index", None)
    return -1 if index is None else int(index)


@functools.cache
def _requests_type() -> type:
    """The mode's class, made once torch is imported (importing cgguard.testing never imports
    it). Its ``__torch_function__`` stays plain Python that dynamo can trace, so a compiled
    function's own requests for CUDA memory are rewritten in its graph (torch 2.13's dynamo
    inlines a function mode's handler: torch/_dynamo/variables/torch_function.py)."""
    import torch
    from torch.overrides import TorchFunctionMode

    tensor = torch.Tensor
    to, cuda, pin_memory, clone = tensor.to, tensor.cuda, tensor.pin_memory, tensor.clone
    host = torch.device("cpu")
    # torch.set_default_device("cuda") and `with torch.device("cuda"):` add device="cuda" to
    # these (torch/utils/_device.py, DeviceContext) from the bottom of the stack, below this mode.
    from torch.utils import _device

    listed: Callable[[], Any] | None = getattr(_device, "_device_constructors", None)
    constructors = frozenset() if listed is None else listed()
    compiling: Callable[[], bool] | None = getattr(torch.compiler, "is_compiling", None)
    fake_key = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)

    def faked() -> bool:
        # Under a FakeTensorMode a CUDA tensor needs no CUDA (torch/_subclasses/fake_tensor.py):
        # it is made as asked. Dynamo traces with one on, but rewrites in the graph it builds.
        if compiling is None or fake_key is None or compiling():
            return False
        return torch._C._get_dispatch_mode(fake_key) is not None

    def on_default_device(func: Any) -> bool:
        default = getattr(_device, "CURRENT_DEVICE", None)
        return default is not None and default.type == "cuda" and func in constructors

    def copied(source: Any, dtype: Any, memory_format: Any) -> Any:
        """New memory for ``source``, in ``dtype``: what a move to the device gives on a GPU.

        Made without naming a device (aten::clone, or aten::_to_copy with a dtype alone):
        cgguard's inspection, to which every tensor is a device tensor on the simulation, sees
        a copy on the device, never one to the host that would wait for the device (a
        device-less Tensor.to(copy=True) names the host, as
        aten/src/ATen/native/TensorConversions.cpp fills it in).
        """
        if memory_format is None:
            memory_format = torch.preserve_format
        if dtype is None or dtype == source.dtype:
            return clone(source, memory_format=memory_format)
        return to(source, dtype, copy=True, memory_format=memory_format)

    def moved(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Tensor.to, Tensor.cuda and Tensor.pin_memory, rewritten where they ask for CUDA."""
        if func is to:
            # to(device=None, dtype=None, non_blocking=False, copy=False, *, memory_format) and
            # to(dtype | tensor, ...): a device comes first, if at all.
            index = _cuda_index(args[1] if len(args) > 1 else kwargs.get("device"))
            if index is None:
                return func(*args, **kwargs)
            _check_index(index)
            dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
            return copied(args[0], dtype, kwargs.get("memory_format"))
        if func is cuda:
            # cuda(device=None, non_blocking=False, memory_format=torch.preserve_format)
            device = args[1] if len(args) > 1 else kwargs.get("device")
            if device is not None:
                index = _cuda_index(device)
                if index is None:
                    return func(*args, **kwargs)  # not a CUDA device: torch's own error
                _check_index(index)
            memory_format = args[3] if len(args) > 3 else kwargs.get("memory_format")
            return copied(args[0], None, memory_format)
        # pin_memory(device=None): nothing is pinned on the simulation (is_pinned() is False),
        # and pinning copies a tensor not yet pinned (aten/src/ATen/native/Memory.cpp).
        return copied(args[0], None, None)

    class DeviceRequests(TorchFunctionMode):
        """Requests for CUDA memory, given host memory (cgguard's simulated CUDA device)."""

        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            if kwargs is None:
                kwargs = {}
            if not _serving:
                return func(*args, **kwargs)
            if func is to or func is cuda or func is pin_memory:
                if faked():
                    return func(*args, **kwargs)
                return moved(func, args, kwargs)
            if not kwargs and not on_default_device(func):
                return func(*args)  # every other op: the fast path
            device = kwargs.get("device")
            if device is None:
                if on_default_device(func) and not faked():
                    kwargs = {**kwargs, "device": host}
            else:
                index = _cuda_index(device)
                if index is not None and not faked():
                    _check_index(index)
                    kwargs = {**kwargs, "device": host}
            if kwargs.get("pin_memory"):
                # torch refuses pinned memory without an accelerator; here host memory is it.
                kwargs = {**kwargs, "pin_memory": False}
            return func(*args, **kwargs)

    return DeviceRequests


@functools.cache
def _requests() -> Any:
    """The one mode object every served thread holds."""
    return _requests_type()()


def _holds_mode() -> bool:
    """Whether this thread's function-mode stack holds the mode."""
    from torch._C import _get_function_stack_at, _len_torch_function_stack

    mode = _requests()
    return any(_get_function_stack_at(i) is mode for i in range(_len_torch_function_stack()))


def _serve_this_thread() -> None:
    """Put the mode at the bottom of this thread's function-mode stack, if not on it yet, with
    the program's modes back above it in their order: a mode the program pushes later sees a
    request before the simulation rewrites it, as it would on a GPU."""
    from torch._C import (
        _len_torch_function_stack,
        _pop_torch_function_stack,
        _push_on_torch_function_stack,
    )

    if _holds_mode():
        return
    above = [_pop_torch_function_stack() for _ in range(_len_torch_function_stack())]
    try:
        _push_on_torch_function_stack(_requests())
    finally:
        for other in reversed(above):
            _push_on_torch_function_stack(other)


def _leave_this_thread() -> None:
    """Take the mode off this thread's function-mode stack, wherever it is on it."""
    from torch._C import (
        _len_torch_function_stack,
        _pop_torch_function_stack,
        _push_on_torch_function_stack,
    )

    mode = _requests()
    above = []
    for _ in range(_len_torch_function_stack()):
        top = _pop_torch_function_stack()
        if top is mode:
            break
        above.append(top)
    # Put back, found or not (a thread that did not begin the simulation may not hold it).
    for other in reversed(above):
        _push_on_torch_function_stack(other)


def _served_threads(bootstrap_inner: Callable[[threading.Thread], None]) -> Any:
    """threading.Thread._bootstrap_inner, putting the mode on the new thread first: the first
    code every thread that ``threading`` starts runs in that thread (CPython's Lib/threading.py,
    3.10 to 3.14), before its ``run()``."""

    def _bootstrap_inner(self: threading.Thread) -> None:
        served = False
        if _serving:
            # The thread must run whatever happens here; its requests then fail clearly.
            with contextlib.suppress(Exception):
                _serve_this_thread()
                served = True
        try:
            bootstrap_inner(self)
        finally:
            if served:
                # Off again before the thread ends: its mode stack is thread-local state of
                # torch's C++, and a Python object left there is released when the thread's
                # storage is torn down, without the interpreter, which aborts the process
                # ("terminate called without an active exception") when that races its exit.
                with contextlib.suppress(Exception):
                    _leave_this_thread()

    return _bootstrap_inner


def _entry_point(frame: Any, namespace: str) -> str | None:
    """The torch.cuda function the program called that led to ``frame``: the outermost of the
    torch.cuda frames it is in, or None where ``frame`` is not torch.cuda's (CUDA memory
    requested from C++, which calls torch.cuda._lazy_init itself)."""
    name = None
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(namespace):
        name = frame.f_code.co_name
        frame = frame.f_back
    return name


def _unserved(entry: str | None) -> str:
    if entry is not None:
        return f"cgguard's simulated CUDA runtime cannot serve torch.cuda.{entry}(): {_SERVED}"
    thread = threading.current_thread().name
    if not _holds_mode():
        return (
            f"cgguard's simulated CUDA runtime cannot serve a CUDA tensor on thread {thread!r}: "
            "it serves the thread that began it and the threads started after, and this one "
            "began before"
        )
    return (
        "cgguard's simulated CUDA runtime cannot serve this request for CUDA memory: it gives "
        "host memory where a device= argument, Tensor.to, .cuda(), Module.cuda() or pin_memory "
        "asks for CUDA memory, not to storages, nor while torch function modes are disabled"
    )


def _lazy_init_served(cuda: ModuleType) -> Callable[[], None]:
    """torch.cuda._lazy_init, with CUDA initialised for synchronize and current_device alone.

    torch's synchronize and current_device (torch/cuda/__init__.py) call _lazy_init() before the
    device calls the simulation stands in for. torch.cuda's other callers of _lazy_init
    (get_device_properties, mem_get_info, init, the random functions) go on to torch._C
    functions the simulation does not provide. For them torch's own _lazy_init runs and fails as
    it fails without the simulation, with the same type: an AssertionError ("Torch not compiled
    with CUDA enabled") on a CPU-only build, a RuntimeError where no driver works; its message
    then says what the simulation cannot serve. Those types are what torch's own probes of CUDA
    catch: inductor's CacheBase.get_system (torch/_inductor/codecache.py) asks
    get_device_properties(current_device()) for the cache key of every compile, and takes the
    key of a machine without CUDA on either error.
    """
    torch_lazy_init = cuda._lazy_init
    namespace = vars(cuda)

    def _lazy_init() -> None:
        # Told apart by name and module rather than by function object, so that a function bound
        # by name or wrapped before the simulation began is still torch's.
        caller = sys._getframe(1)
        if caller.f_globals is namespace and caller.f_code.co_name in (
            "synchronize",
            "current_device",
        ):
            return
        try:
            torch_lazy_init()
        except Exception as exc:
            exc.args = (f"{_unserved(_entry_point(caller, cuda.__name__))} ({exc})",)
            raise

    return _lazy_init


def _get_device() -> int:
    return 0


def _set_device(index: int) -> None:
    _check_index(index)


def _reset_peak_memory_stats(index: int | None) -> None:
    # The simulated device allocates nothing: its statistics stay zero, as torch reports them
    # while CUDA is not initialised (torch/cuda/memory.py, memory_stats).
    _check_index(index)


def _device_name(cuda: ModuleType) -> Callable[..., str]:
    def get_device_name(device: object = None) -> str:
        _check_index(cuda._get_device_index(device, optional=True))
        return DEVICE_NAME

    return get_device_name


# One simulated device: torch.cuda.device(...) switches nothing. Two functions, not one under
# two names: dynamo keeps a handler per function object for each of torch.cuda's device switches
# (torch/_dynamo/variables/torch.py, TorchInGraphFunctionVariable._get_handlers), and refuses to
# build that table, failing every compile that meets a torch function, if two are one object.


def _no_device_switch(device: int) -> int:
    _check_index(device)
    return -1


def _no_maybe_device_switch(device: int) -> int:
    _check_index(device)
    return -1


def answer_device_calls(
    torch: ModuleType, patches: PatchSet, *, invalid_device: Callable[[str], Exception]
) -> None:
    """Answer torch.cuda's device calls for the one simulated device, and have ``threading``
    serve device requests on each thread it starts; all undone by ``patches``.
    ``invalid_device`` makes the CUDA error that refuses a device other than cuda:0."""
    global _cuda_error
    _cuda_error = invalid_device
    put = patches.replace
    cuda = torch.cuda
    # torch.cuda.memory and torch.cuda.random bind _lazy_init by name (`from . import
    # _lazy_init`): each namespace that holds torch's gets the served one.
    torch_lazy_init, served = cuda._lazy_init, _lazy_init_served(cuda)
    for name, module in list(sys.modules.items()):
        in_cuda = name == cuda.__name__ or name.startswith(f"{cuda.__name__}.")
        if in_cuda and getattr(module, "_lazy_init", None) is torch_lazy_init:
            put(module, "_lazy_init", served)
    # torch's current_device() and set_device() run, over these; CPU-only builds lack both.
    put(torch._C, "_cuda_getDevice", _get_device)
    put(torch._C, "_cuda_setDevice", _set_device)
    put(torch._C, "_cuda_resetPeakMemoryStats", _reset_peak_memory_stats)
    # torch's get_device_name reads get_device_properties(), which the simulation cannot give
    # without giving inductor a device to compile for.
    put(cuda, "get_device_name", _device_name(cuda))
    put(cuda, "_exchange_device", _no_device_switch)
    put(cuda, "_maybe_exchange_device", _no_maybe_device_switch)
    patches.wrap(threading.Thread, "_bootstrap_inner", _served_threads)


def serve_requests() -> None:
    """Rewrite requests for CUDA memory from now on, on this thread and the threads started
    after."""
    global _serving
    _serve_this_thread()
    _serving = True


def stop_serving() -> None:
    """Forward every request untouched again, and take the mode off this thread."""
    global _serving
    _serving = False
    _leave_this_thread()
