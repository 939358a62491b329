"""cgguard._sync_ops: the table of ops that wait for the device, and each entry's condition,
checked on plain stand-ins for tensors (no torch)."""

from __future__ import annotations

from typing import Any

import pytest

from cgguard._sync_ops import SYNC_OPS, syncs


class Fake:
    """A tensor as the table's conditions read one: where it lives, its dtype, pinned or not."""

    def __init__(self, device: str = "cuda", dtype: str = "torch.float32", *, pinned: bool = False):
        self.device, self.dtype, self.pinned = device, dtype, pinned

    def is_pinned(self) -> bool:
        return self.pinned


def on_device(value: Any) -> bool:
    return isinstance(value, Fake) and value.device == "cuda"


GPU, HOST, PINNED = Fake(), Fake("cpu"), Fake("cpu", pinned=True)
MASK, INDEX = Fake(dtype="torch.bool"), Fake(dtype="torch.int64")


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
        ("aten::repeat_interleave", (GPU,), {}, True),
        ("aten::repeat_interleave", (GPU,), {"output_size": 6}, False),
        ("aten::_to_copy", (GPU,), {"device": "cpu"}, True),
        ("aten::_to_copy", (GPU,), {"dtype": "torch.float16"}, False),
        ("aten::_to_copy", (HOST,), {"device": "cpu"}, False),
        ("aten::copy_", (HOST, GPU), {}, True),
        ("aten::copy_", (HOST, GPU, True), {}, True),  # into pageable memory: waits anyway
        ("aten::copy_", (PINNED, GPU, True), {}, False),
        ("aten::copy_", (GPU, HOST), {}, True),  # a blocking upload waits for the stream
        ("aten::copy_", (GPU, PINNED), {"non_blocking": True}, False),
        ("aten::copy_", (GPU, GPU), {}, False),
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
