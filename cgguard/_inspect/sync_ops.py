"""Which aten operators synchronize the device or its stream: one table, each entry citing the
torch source that makes it wait for the GPU.

An op in this table, called on a device tensor by a thread whose capture prohibits it, makes a
synchronous CUDA call (``cudaMemcpy`` without ``Async``, ``cudaStreamSynchronize`` through
``at::cuda::memcpy_and_sync`` or ``at::cuda::stream_synchronize``): CUDA fails it during a
capture ("operation not permitted when stream is capturing") and invalidates the capture. Any
op not in the table passes untouched. The table knows nothing of torch: each entry's ``when``
is a plain predicate over the op's arguments, given what stands for a device tensor.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, NamedTuple

from cgguard._core.probes import runs_kernels

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    # Whether a value is a tensor that stands for a device tensor.
    OnDevice = Callable[[Any], bool]


class SyncOp(NamedTuple):
    """One synchronizing operator: what users write to reach it, and why it synchronizes."""

    wrote: str  # what the user's code says, in the user's words
    source: str  # the torch source that makes it synchronize
    # Whether a call with these (args, kwargs) synchronizes; None: any call on a device tensor.
    when: Callable[[tuple[Any, ...], Mapping[str, Any], OnDevice], bool] | None = None


def _on_device(args: tuple[Any, ...], on_device: OnDevice) -> bool:
    return any(on_device(a) for a in args)


def _bool_index(args: tuple[Any, ...], kwargs: Mapping[str, Any], on_device: OnDevice) -> bool:
    # index.Tensor(self, indices) / index_put(self, indices, values, accumulate): a bool or
    # uint8 index is turned into positions by nonzero() before indexing.
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return on_device(args[0]) and any(
        index is not None and str(getattr(index, "dtype", "")) in ("torch.bool", "torch.uint8")
        for index in indices or ()
    )


def _no_output_size(args: tuple[Any, ...], kwargs: Mapping[str, Any], on_device: OnDevice) -> bool:
    # repeat_interleave.Tensor(repeats, *, output_size=None)
    return kwargs.get("output_size") is None and _on_device(args[:1], on_device)


def _to_copy(args: tuple[Any, ...], kwargs: Mapping[str, Any], on_device: OnDevice) -> bool:
    # _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format): x.cpu(),
    # x.to("cpu"), x.tolist(), cpu_t.cuda(). aten/src/ATen/native/TensorConversions.cpp: _to_copy
    # allocates the result and calls r.copy_(self, non_blocking); a non-blocking copy from the
    # device to the host allocates that result pinned (pin_out), so the copy stays asynchronous.
    # Judged as that copy_ is, into a fresh host tensor that is pinned exactly when non_blocking.
    device = kwargs.get("device")
    if device is None or not args:
        return False
    target = str(device)
    if not target.startswith(("cpu", "cuda")):
        return False  # meta, another accelerator: no CUDA copy
    to_device = target.startswith("cuda")
    from_device = on_device(args[0])
    if to_device == from_device:
        return False  # device to device (or host to host): no host wait
    return not kwargs.get("non_blocking", False)


def _blocking_copy(args: tuple[Any, ...], kwargs: Mapping[str, Any], on_device: OnDevice) -> bool:
    # copy_(self, src, non_blocking=False). aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda
    # issues cudaMemcpyAsync between host and device and, for non_blocking=False, then waits for
    # the stream (at::cuda::stream_synchronize), whichever way the copy goes; a copy into pageable
    # host memory waits whatever non_blocking says (CUDA Runtime API, API synchronization
    # behavior: a device-to-pageable-host copy returns once it is done).
    if len(args) < 2:
        return False
    dst, src = args[0], args[1]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    dst_device, src_device = on_device(dst), on_device(src)
    if dst_device == src_device:
        return False  # device to device (or host to host): no host wait
    if not non_blocking:
        return True
    return not dst_device and not _pinned(dst)


def _mask_index_put(args: tuple[Any, ...], kwargs: Mapping[str, Any], on_device: OnDevice) -> bool:
    # index_put_(self, indices, values, accumulate=False): `x[mask] = 0.0`. torch's
    # _index_put_impl_ (aten/src/ATen/native/TensorAdvancedIndexing.cpp) first asks
    # canDispatchToMaskedFill (TensorAdvancedIndexingUtils.h): with accumulate False, a value of
    # one element on the CPU, and exactly one defined index, bool or uint8 and on self's device,
    # it runs self.masked_fill_(mask, value.item()) - no nonzero(), no host wait (the value's
    # item() reads host memory). Otherwise the bool index goes through nonzero() as for index.
    if not _bool_index(args, kwargs, on_device):
        return False
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    value = args[2] if len(args) > 2 else kwargs.get("values")
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    defined = [index for index in indices or () if index is not None]
    return bool(accumulate) or len(defined) != 1 or not _host_scalar(value, on_device)


def _histc_range(args: tuple[Any, ...], kwargs: Mapping[str, Any], on_device: OnDevice) -> bool:
    # histc(self, bins=100, min=0, max=0). aten/src/ATen/native/cuda/SummaryOps.cu:
    # _histc_cuda converts min and max to the accumulate type of self's dtype (acc_type<scalar_t,
    # true>) and _histc_cuda_template, `if (min == max && self.numel() > 0)`, reads the range as
    # self.min().cpu() and self.max().cpu(). Given a range, the histogram runs on the device.
    if not args or not on_device(args[0]):
        return False
    self = args[0]
    low = args[2] if len(args) > 2 else kwargs.get("min", 0)
    high = args[3] if len(args) > 3 else kwargs.get("max", 0)
    return _same_bound(low, high, str(getattr(self, "dtype", ""))) and self.numel() > 0


def _same_bound(low: Any, high: Any, dtype: str) -> bool:
    """Whether ``low == high`` as CUDA's accumulate type of ``dtype`` holds them (c10's
    AccumulateType.h): int64_t for integers (Scalar::to truncates), float for float32, float16
    and bfloat16, double for float64."""
    try:
        if dtype.startswith(("torch.int", "torch.uint")):
            return int(low) == int(high)
        if dtype in ("torch.float32", "torch.float16", "torch.bfloat16"):
            return bool(_FLOAT32.unpack(_FLOAT32.pack(low)) == _FLOAT32.unpack(_FLOAT32.pack(high)))
        return bool(float(low) == float(high))
    except (TypeError, ValueError, OverflowError, struct.error):
        return bool(low == high)


def _host_scalar(value: Any, on_device: OnDevice) -> bool:
    """Whether ``value`` is one element in host memory (what `x[mask] = 0.0` passes)."""
    try:
        if value is None or value.numel() != 1:
            return False
        if on_device is any_tensor:
            # Device memory on the host: every tensor stands for a device tensor, so the Python
            # number that `x[mask] = 0.0` wraps (a 0-dim host tensor on CUDA too) is told by its
            # shape.
            return bool(value.dim() == 0)
        return not on_device(value)
    except Exception:
        return False


def any_tensor(value: Any) -> bool:
    """What stands for a device tensor where a runtime standing in for CUDA's keeps device
    memory on the host: any tensor (told by duck type) but one whose storage is on meta."""
    return hasattr(value, "untyped_storage") and runs_kernels(value)


def _pinned(tensor: Any) -> bool:
    try:
        return bool(tensor.is_pinned())
    except Exception:
        return False


_MEMCPY_AND_SYNC = "at::cuda::memcpy_and_sync (c10/cuda/CUDAFunctions.h)"
_FLOAT32 = struct.Struct("f")
# The sources two overloads each share.
_MASK_INDEX_PUT = (
    "aten/src/ATen/native/IndexingUtils.h: expandTensors turns a bool or uint8 index into "
    "positions with nonzero(), which reads its count on the host, unless _index_put_impl_ "
    "(TensorAdvancedIndexing.cpp) dispatches to masked_fill_ (canDispatchToMaskedFill)"
)
_UNIQUE = (
    "aten/src/ATen/native/cuda/Unique.cu: the number of unique elements is copied to the host "
    "to size the output"
)
_UNIQUE_RUNS = (
    "aten/src/ATen/native/cuda/Unique.cu: the number of runs is copied to the host to size the "
    "output"
)

# By the op's schema name, as a TorchDispatchMode sees it (OpOverload._schema.name).
SYNC_OPS: dict[str, SyncOp] = {
    "aten::_local_scalar_dense": SyncOp(
        ".item(), bool(), int() or float() of a device tensor",
        "aten/src/ATen/native/cuda/CUDAScalar.cu: _local_scalar_dense_cuda copies the value to "
        f"the host through {_MEMCPY_AND_SYNC}",
    ),
    "aten::nonzero": SyncOp(
        "torch.nonzero(), x.nonzero(), torch.where(cond) or torch.argwhere()",
        "aten/src/ATen/native/cuda/Nonzero.cu: nonzero_out_cuda copies the number of nonzero "
        "elements to the host and synchronizes the stream to size its output",
    ),
    "aten::masked_select": SyncOp(
        "torch.masked_select() or x.masked_select(mask)",
        "aten/src/ATen/native/cuda/IndexKernel.cu: masked_select sizes its output from the "
        "mask's nonzero count, read on the host",
    ),
    "aten::index": SyncOp(
        "x[mask], indexing with a boolean mask",
        "aten/src/ATen/native/IndexingUtils.h: expandTensors turns a bool or uint8 index into "
        "positions with nonzero(), which reads its count on the host",
        _bool_index,
    ),
    "aten::index_put_": SyncOp(
        "x[mask] = value, assigning through a boolean mask a value that is not one host number",
        _MASK_INDEX_PUT,
        _mask_index_put,
    ),
    "aten::index_put": SyncOp(
        "x.index_put(indices, value) with a boolean mask and a value that is not one host number",
        _MASK_INDEX_PUT,
        _mask_index_put,
    ),
    "aten::_unique2": SyncOp(
        "torch.unique() or x.unique()",
        _UNIQUE,
    ),
    "aten::_unique": SyncOp(
        "torch.unique() or x.unique()",
        _UNIQUE,
    ),
    "aten::unique_dim": SyncOp(
        "torch.unique(x, dim=...)",
        "aten/src/ATen/native/cuda/Unique.cu: the number of unique slices is copied to the host "
        "to size the output",
    ),
    "aten::unique_consecutive": SyncOp(
        "torch.unique_consecutive()",
        _UNIQUE_RUNS,
    ),
    "aten::unique_dim_consecutive": SyncOp(
        "torch.unique_consecutive(x, dim=...)",
        _UNIQUE_RUNS,
    ),
    "aten::repeat_interleave": SyncOp(
        "torch.repeat_interleave(x, repeats) with a tensor of repeats and no output_size",
        "aten/src/ATen/native/Repeat.cpp: repeat_interleave_cpu/cuda read repeats.sum() on "
        "the host when output_size is not given",
        _no_output_size,
    ),
    "aten::bincount": SyncOp(
        "torch.bincount()",
        "aten/src/ATen/native/cuda/SummaryOps.cu: _bincount_cuda sizes its output from "
        "self.max(), read on the host, whatever minlength says",
    ),
    "aten::equal": SyncOp(
        "torch.equal()",
        "aten/src/ATen/native/cuda/Equal.cpp: cuda_equal returns eq(self, other).all().item()",
    ),
    "aten::histc": SyncOp(
        "torch.histc() or x.histc() without a range (min == max, as by default)",
        "aten/src/ATen/native/cuda/SummaryOps.cu: _histc_cuda_template reads self.min().cpu() "
        "and self.max().cpu() on the host when min == max",
        _histc_range,
    ),
    "aten::_linalg_check_errors": SyncOp(
        "torch.linalg.inv(), torch.linalg.cholesky(), torch.linalg.solve() or another linalg "
        "function that checks its result (not the _ex variants)",
        "aten/src/ATen/native/BatchLinearAlgebra.cpp: _linalg_check_errors reads "
        "infos.any().item<bool>() on the host (linalg_inv, linalg_cholesky and the other "
        "checked linalg functions call it after their _ex kernel)",
    ),
    "aten::allclose": SyncOp(
        "torch.allclose() or x.allclose(other)",
        "aten/src/ATen/native/TensorCompare.cpp: allclose returns "
        "isclose(self, other, ...).all().item<uint8_t>(), a host read below the dispatch mode",
    ),
    "aten::_to_copy": SyncOp(
        "x.cpu(), x.to('cpu'), x.tolist() or x.numpy() of a device tensor, or cpu_t.cuda(), "
        "without non_blocking=True",
        "aten/src/ATen/native/TensorConversions.cpp: _to_copy copies with r.copy_(self, "
        "non_blocking), into pinned host memory when non_blocking (pin_out); "
        "aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda ends a blocking copy with "
        "at::cuda::stream_synchronize",
        _to_copy,
    ),
    "aten::copy_": SyncOp(
        "dst.copy_(src) between host and device with non_blocking=False, or into pageable "
        "host memory",
        "aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda ends a blocking copy with "
        "at::cuda::stream_synchronize, and a copy into pageable host memory is synchronous in "
        "CUDA itself (CUDA Runtime API, API synchronization behavior)",
        _blocking_copy,
    ),
}


def syncs(
    op: SyncOp, args: tuple[Any, ...], kwargs: Mapping[str, Any], on_device: OnDevice
) -> bool:
    """Whether this call of ``op`` synchronizes: it reaches the device and its condition holds."""
    if op.when is None:
        return _on_device(args, on_device)
    return op.when(args, kwargs, on_device)
