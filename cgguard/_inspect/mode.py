"""The dispatch mode that watches an inspected capture op by op, and its place at the bottom of
the capturing thread's dispatch-mode stack, below the program's own modes.

The mode goes on and off without ``TorchDispatchMode.__enter__``/``__exit__``: torch's
``__exit__`` pops whatever mode is on top, and each mode's ``__enter__`` saves and ``__exit__``
restores torch's process-wide "in a mode" flags in stack order. Kept out of both, the program's
modes push, pop and flag exactly as they would without cgguard, however they nest around the
capture.

The mode says ``ignore_compile_internals()``: torch 2.13's dynamo runs a compiled function
eagerly while any other dispatch mode is on the stack (torch/_dynamo/convert_frame.py,
``any_torch_dispatch_mode_on_stack``), which would change what is captured. Compiled code
stays compiled, and the mode does not see the ops inside it (docs/inspection.md).

While the mode's ``__torch_dispatch__`` runs, torch has taken the mode off the stack
(torch/csrc/utils/torch_dispatch_mode.h, ``StashTorchDispatchModeGuard``), so what it asks of a
tensor subclass, and the op it forwards, never come back to it: a wrapper subclass's own ops on
its inner tensors are not seen. Its inner tensors are read where the wrapper is.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Protocol

from cgguard._inspect.sync_ops import SYNC_OPS
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cgguard._inspect.liveness import Inputs
    from cgguard._inspect.sync_ops import SyncOp


# How deep inspection looks through wrapper subclasses nested in one another (a DTensor of
# float8 tensors is two): deeper ones, or one that names itself, are not followed further.
_DEPTH = 8


class Watched(Protocol):
    """What the mode tells of each op: the inspected capture it watches for
    (cgguard._inspect.inspector)."""

    on: bool  # false once the capture is over: the mode only forwards
    # Both set before the mode is made, and read by it then, once.
    inputs: Inputs | None  # the capture's external inputs, where cgguard tracks them
    every_tensor: bool  # every tensor stands for a device tensor

    def synchronizing(
        self, op: SyncOp, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None: ...


@functools.cache
def mode_type() -> type:  # noqa: PLR0915 - the class and the helpers it closes over
    """The dispatch mode's class, made once torch is imported (cgguard never imports it)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

    tensor = torch.Tensor
    # A Parameter is made of a plain tensor only (torch/nn/parameter.py, Parameter.__new__: a
    # subclass's data keeps its own class): both take the hot path, any other subclass held().
    parameter = torch.nn.Parameter
    # The types of what an op's arguments hold when not a tensor (sizes, scalars, dtypes, None),
    # told by one set look-up: isinstance(value, torch.Tensor) of any other value goes through
    # the metaclass's __instancecheck__ (Tensor's is torch._C._TensorMeta), several times that.
    plain = frozenset(
        {
            int,
            float,
            bool,
            complex,
            str,
            type(None),
            torch.dtype,
            torch.device,
            torch.layout,
            torch.memory_format,
        }
    )
    # torch.tensor(...) inside the capture: its value is made below the dispatcher, then lifted.
    lift_fresh = torch.ops.aten.lift_fresh.default
    unknown = object()
    lifted = object()  # lift_fresh's entry
    # What an op needs besides the scan, found once per OpOverload: None for most, its sync table
    # entry, or ``lifted``. Keyed by id(func): an OpOverload's __hash__ is a Python method
    # (torch/_ops.py, OpOverload.__hash__), one more frame each op. Each op is kept in
    # ``learned``, so that its id names no other object while it is a key.
    known: dict[int, Any] = {}
    learned: list[Any] = []

    def learn(func: Any) -> Any:
        entry = lifted if func is lift_fresh else _entry(func)
        learned.append(func)
        known[id(func)] = entry
        return entry

    def lift(inputs: Inputs | None, func: Any, args: Any, kwargs: Mapping[str, Any]) -> Any:
        """A tensor the capture made (torch.tensor(2.0)): its own, not an input."""
        out = func(*args, **kwargs)
        if inputs is not None:
            for value in (*args, out):
                if isinstance(value, tensor):
                    for _, _, address in held(value, True):
                        inputs.made(address)
        return out

    def held(value: Any, every: bool) -> list[tuple[Any, Any, int]]:
        """The memory a tensor subclass reads, as (tensor, storage, address): its own, or a
        wrapper subclass's inner tensors', each looked at alone."""
        found: list[tuple[Any, Any, int]] = []
        gather(value, every, found, 0)
        return found

    def spread(value: Any, every: bool) -> list[tuple[Any, Any, int]]:
        """What a list or tuple of tensors (torch.cat's, one level deep) or a tensor subclass
        holds, as held() tells it: the scan's slow path."""
        found: list[tuple[Any, Any, int]] = []
        for item in value if type(value) is list or type(value) is tuple else (value,):
            kind = type(item)
            if kind is tensor or kind is parameter:
                if every or item.is_cuda:
                    try:
                        storage = item.untyped_storage()
                        address = storage.data_ptr()
                    except Exception:  # noqa: S112 - sparse: no storage to hold
                        continue
                    if address:
                        found.append((item, storage, address))
            elif kind not in plain and isinstance(item, tensor):
                gather(item, every, found, 0)
        return found

    def gather(value: Any, every: bool, found: list[tuple[Any, Any, int]], depth: int) -> None:
        try:
            # A wrapper subclass (DTensor, float8, NF4) has no memory of its own (its storage's
            # data_ptr raises); torch's own look-through is its __tensor_flatten__, the names
            # of its inner tensors (torch/_subclasses/fake_tensor.py: get_plain_tensors).
            names = value.__tensor_flatten__()[0] if is_traceable_wrapper_subclass(value) else None
        except Exception:
            return
        if names is not None:
            if depth < _DEPTH:
                for name in names:
                    try:
                        inner = getattr(value, name)
                    except Exception:  # noqa: S112 - a subclass's own failure: skip that one
                        continue
                    gather(inner, every, found, depth + 1)
            return
        if not isinstance(value, tensor):
            return  # an opaque inner value, no tensor
        try:
            storage = value.untyped_storage()
            # A meta storage is no memory: a meta tensor's, and a fake tensor's (FakeTensor is
            # its meta elem's, torch/_subclasses/fake_tensor.py FakeTensor.__new__), whose
            # data_ptr warns (_set_warn_deprecated_on_mutable_data_ptr there): never read it.
            where = storage.device.type
            if where == "meta" or not (every or where == "cuda"):
                return
            address = storage.data_ptr()
        except Exception:
            return  # sparse, or a subclass that refuses its data pointer: nothing to hold
        if address:
            found.append((value, storage, address))

    class InspectionMode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's
        """Forwards every op; tells the capture it watches for before and after."""

        supports_higher_order_operators = True

        def __init__(self, capture: Watched) -> None:
            super().__init__()  # type: ignore[no-untyped-call]  # torch's own, untyped
            self.capture = capture
            # Fixed for the capture (Watched): read once here, not at each op.
            self.inputs = capture.inputs
            self.every = capture.every_tensor

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # Compiled code runs compiled under this mode (torch 2.13 and later; earlier
            # releases never ask): see the module's docstring.
            return True

        def __torch_dispatch__(  # noqa: PLR0912, PLR0915 - the hot path, inlined on purpose
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            # The hot path of every op inside an inspected capture: inlined, no Python calls
            # for plain tensors, one look-up per op and per tensor already seen. Lists, tuples
            # and tensor subclasses go through spread(). Inputs.read is called from here only:
            # the stack it notes counts its frames from this one.
            if kwargs is None:
                kwargs = {}
            if not self.capture.on:
                return func(*args, **kwargs)
            entry = known.get(id(func), unknown)
            if entry is not None:
                if entry is unknown:
                    entry = learn(func)
                if entry is lifted:
                    return lift(self.inputs, func, args, kwargs)
                if entry is not None:
                    self.capture.synchronizing(entry, func, args, kwargs)
            inputs = self.inputs
            if inputs is None:
                return func(*args, **kwargs)
            every = self.every
            seen = inputs.seen
            try:
                # out= tensors are read as inputs too: the graph writes where they live.
                for arg in (*args, *kwargs.values()) if kwargs else args:
                    kind = type(arg)
                    if kind is tensor or kind is parameter:
                        if every or arg.is_cuda:
                            # Each tensor alone: one that has no memory to read leaves the
                            # op's other tensors read. Its storage's address is its own data
                            # pointer where it has elements and starts its storage
                            # (c10/core/TensorImpl.h, data_impl: null for no elements, else
                            # the storage's data plus storage_offset elements), read without
                            # making the storage's Python object as untyped_storage() does.
                            try:
                                address = arg.data_ptr()
                                if not address or arg.storage_offset():
                                    address = arg.untyped_storage().data_ptr()
                            except Exception:  # noqa: S112 - sparse: no storage to hold
                                continue
                            if address and address not in seen:
                                try:  # the storage itself, held from its first read on
                                    storage = arg.untyped_storage()
                                except Exception:  # noqa: S112 - as above
                                    continue
                                inputs.read(storage, address, arg)
                    elif kind in plain:
                        continue
                    elif kind is list or kind is tuple or isinstance(arg, tensor):
                        for leaf, storage, address in spread(arg, every):
                            if address not in seen:
                                inputs.read(storage, address, leaf)
            except Exception as exc:
                warn_once("inspect:read", f"internal error while inspecting an op: {exc!r}")
            out = func(*args, **kwargs)
            try:
                kind = type(out)
                if kind is tensor or kind is parameter:
                    if every or out.is_cuda:
                        try:  # its storage's address, as for an input
                            address = out.data_ptr()
                            if not address or out.storage_offset():
                                address = out.untyped_storage().data_ptr()
                        except Exception:  # sparse: no storage to hold
                            address = 0
                        if address and address not in seen:
                            seen[address] = None  # the capture's own allocation
                elif kind in plain:
                    pass
                elif kind is tuple or kind is list or isinstance(out, tensor):
                    for _, _, address in spread(out, every):
                        if address not in seen:
                            seen[address] = None
            except Exception as exc:
                warn_once("inspect:made", f"internal error while inspecting an op: {exc!r}")
            return out

    return InspectionMode


@functools.cache
def prepare() -> None:
    """torch's one-time set-up of the mode, done once, outside any capture.

    torch wraps a dispatch mode's ``__torch_dispatch__`` so that dynamo skips it
    (torch/utils/_python_dispatch.py, ``TorchDispatchMode.__init_subclass__``, through
    ``torch._disable_dynamo``), and that wrapper imports torch._dynamo at its first call
    (torch/_compile.py, ``_disable_dynamo``): about a second here, which the first op of the
    first inspected capture would otherwise pay between capture_begin and capture_end, in the
    census's time of that capture. Where torch does not wrap it, there is nothing to do.
    Cached: each later call is one look-up.
    """
    try:
        dispatch = vars(mode_type()).get("__torch_dispatch__")
        if getattr(dispatch, "__wrapped__", None) is not None:
            import torch._dynamo  # noqa: F401 - the import is the set-up
    except Exception as exc:
        warn_once("inspect:prepare", f"could not prepare inspection's dispatch mode: {exc!r}")


def _entry(func: Any) -> SyncOp | None:
    try:
        return SYNC_OPS.get(str(func._schema.name))
    except Exception:
        return None


def push_below(mode: Any) -> None:
    """Put ``mode`` at the bottom of this thread's dispatch-mode stack, the program's modes back
    above it in their order, without torch's __enter__ (see the module's docstring)."""
    from torch._C import (
        _len_torch_dispatch_stack,
        _pop_torch_dispatch_stack,
        _push_on_torch_dispatch_stack,
    )
    from torch.utils._python_dispatch import _push_mode

    above = [_pop_torch_dispatch_stack(None) for _ in range(_len_torch_dispatch_stack())]
    try:
        _push_on_torch_dispatch_stack(mode)
    finally:
        for other in reversed(above):
            _push_mode(other)


def remove_mode(mode: Any) -> None:
    """Take ``mode`` off this thread's dispatch-mode stack, wherever it is on it, and put the
    modes above it back in their order; torch's "in a mode" flags are left as they are."""
    try:
        from torch._C import _len_torch_dispatch_stack, _pop_torch_dispatch_stack
        from torch.utils._python_dispatch import _push_mode

        above = []
        for _ in range(_len_torch_dispatch_stack()):
            top = _pop_torch_dispatch_stack(None)
            if top is mode:
                break
            above.append(top)
        # Put back, found or not (a forked child's stack may not hold it).
        for other in reversed(above):
            _push_mode(other)
    except Exception as exc:
        warn_once("inspect:leave", f"internal error while ending an inspection: {exc!r}")
