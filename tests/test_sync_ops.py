"""cgguard._inspect.sync_ops: the table of ops that wait for the device, and each entry's condition,
checked on plain stand-ins for tensors (no torch)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from cgguard._inspect.sync_ops import SYNC_OPS, syncs


class Fake:
    """A tensor as the table's conditions read one: where it lives, its dtype, pinned or not."""

    def __init__(
        self,
        device: str = "cuda",
        dtype: str = "torch.float32",
        *,
        pinned: bool = False,
        shape: tuple[int, ...] = (4,),
    ):
        self.device, self.dtype, self.pinned, self.shape = device, dtype, pinned, shape

    def is_pinned(self) -> bool:
        return self.pinned

    def numel(self) -> int:
        return math.prod(self.shape)

    def dim(self) -> int:
        return len(self.shape)


def on_device(value: Any) -> bool:
    return isinstance(value, Fake) and value.device == "cuda"


GPU, HOST, PINNED = Fake(), Fake("cpu"), Fake("cpu", pinned=True)
MASK, INDEX = Fake(dtype="torch.bool"), Fake(dtype="torch.int64")
# `x[mask] = 0.0` passes the number as a 0-dim host tensor; a device scalar; many values.
NUMBER, GPU_SCALAR = Fake("cpu", shape=()), Fake(shape=())


@pytest.mark.parametrize(
    ("op", "args", "kwargs", "expected"),
    [
        ("aten::_local_scalar_dense", (GPU,), {}, True),
        ("aten::_local_scalar_dense", (HOST,), {}, False),
        ("aten::nonzero", (GPU,), {}, True),
        ("aten::index", (GPU, [MASK]), {}, True),
        ("aten::index", (GPU, [INDEX]), {}, False),
        ("aten::index", (GPU, [None, MASK]), {}, True),
        ("aten::index_put_", (GPU, [MASK], GPU), {}, True),
        # canDispatchToMaskedFill: one mask, one host value, no accumulate -> masked_fill_.
        ("aten::index_put_", (GPU, [MASK], NUMBER), {}, False),
        ("aten::index_put_", (GPU, [MASK], NUMBER, False), {}, False),
        ("aten::index_put", (GPU, [None, MASK], NUMBER), {}, False),
        ("aten::index_put_", (GPU, [MASK], NUMBER, True), {}, True),  # accumulate
        ("aten::index_put_", (GPU, [MASK], GPU_SCALAR), {}, True),  # the value on the device
        ("aten::index_put_", (GPU, [MASK, MASK], NUMBER), {}, True),  # two masks
        ("aten::index_put_", (GPU, [INDEX], NUMBER), {}, False),  # no mask at all
        ("aten::repeat_interleave", (GPU,), {}, True),
        ("aten::repeat_interleave", (GPU,), {"output_size": 6}, False),
        ("aten::_to_copy", (GPU,), {"device": "cpu"}, True),
        ("aten::_to_copy", (GPU,), {"dtype": "torch.float16"}, False),
        ("aten::_to_copy", (HOST,), {"device": "cpu"}, False),
        # Non-blocking to the host: _to_copy pins its result (pin_out), the copy stays async.
        ("aten::_to_copy", (GPU,), {"device": "cpu", "non_blocking": True}, False),
        # cpu_t.cuda(): a blocking upload waits for the stream, as copy_ does.
        ("aten::_to_copy", (HOST,), {"device": "cuda"}, True),
        ("aten::_to_copy", (HOST,), {"device": "cuda:0", "non_blocking": True}, False),
        ("aten::_to_copy", (GPU,), {"device": "cuda"}, False),
        ("aten::_to_copy", (HOST,), {"device": "meta"}, False),
        ("aten::copy_", (HOST, GPU), {}, True),
        ("aten::copy_", (HOST, GPU, True), {}, True),  # into pageable memory: waits anyway
        ("aten::copy_", (PINNED, GPU, True), {}, False),
        ("aten::copy_", (GPU, HOST), {}, True),  # a blocking upload waits for the stream
        ("aten::copy_", (GPU, PINNED), {"non_blocking": True}, False),
        ("aten::copy_", (GPU, GPU), {}, False),
        # histc(self, bins=100, min=0, max=0): equal bounds make it read self's min and max.
        ("aten::histc", (GPU, 4), {}, True),
        ("aten::histc", (GPU, 4, 1.5, 1.5), {}, True),
        ("aten::histc", (GPU, 4, 0, 1), {}, False),
        ("aten::histc", (GPU, 4), {"min": -1.0, "max": 1.0}, False),
        ("aten::histc", (Fake(shape=(0,)), 4), {}, False),  # empty: no min() to read
        ("aten::histc", (HOST, 4), {}, False),
        # Bounds compared as the kernel's type holds them: 0.2 and 0.7 are both 0 as integers,
        # and two doubles one float32 apart from nothing are one float32.
        ("aten::histc", (Fake(dtype="torch.int64"), 4, 0.2, 0.7), {}, True),
        ("aten::histc", (Fake(dtype="torch.int64"), 4, 0.2, 1.7), {}, False),
        ("aten::histc", (GPU, 4, 1.0, 1.0 + 1e-12), {}, True),
        ("aten::histc", (Fake(dtype="torch.float64"), 4, 1.0, 1.0 + 1e-12), {}, False),
        ("aten::_linalg_check_errors", (Fake(dtype="torch.int32"), "linalg.inv"), {}, True),
        ("aten::_linalg_check_errors", (Fake("cpu", dtype="torch.int32"), "linalg.inv"), {}, False),
        ("aten::allclose", (GPU, GPU), {}, True),
        ("aten::allclose", (HOST, HOST), {}, False),
    ],
)
def test_each_entry_syncs_only_where_its_torch_source_says(
    op: str, args: tuple[Any, ...], kwargs: dict[str, Any], expected: bool
) -> None:
    """Each entry's condition: a device tensor, and the arguments that make the kernel wait."""
    assert syncs(SYNC_OPS[op], args, kwargs, on_device) is expected


def test_every_entry_says_what_users_write_and_cites_torch() -> None:
    """Each entry names the user's words and a torch source file, so a report can say both."""
    for name, op in SYNC_OPS.items():
        assert name.startswith("aten::")
        assert op.wrote
        assert op.source.startswith(("aten/src/ATen/", "c10/")), name
