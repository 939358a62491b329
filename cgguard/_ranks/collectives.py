"""torch.distributed's collectives as the capture manifest sees them: which of its Python entry
points are watched, and what a call says of itself (its group and its payload).

Every name here is a function of ``torch.distributed.distributed_c10d``, re-exported by
``torch.distributed`` as the same object (torch 2.1 to 2.13): both names are wrapped, so that
``dist.all_reduce`` and ``distributed_c10d.all_reduce`` are seen alike. A name bound before
cgguard was installed (``from torch.distributed import all_reduce``) keeps torch's function,
and torch's functional collectives (``torch.distributed._functional_collectives``, what
torch.compile traces) and frameworks' own communicators (vLLM's PyNccl and custom all-reduce,
SGLang's) do not go through these entry points: docs/ranks.md says what is not seen.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._data.schema import ManifestCollective

# Each watched function, and the parameter that holds what it sends (None: a barrier). Calls
# into these, the list and their tensor, coalesced and ``_base`` forms, are what a
# rank's collective sequence is made of.
PAYLOADS: dict[str, str | None] = {
    "all_reduce": "tensor",
    "all_reduce_coalesced": "tensors",
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "all_gather_single": "input_tensor",  # torch 2.13's name for all_gather_into_tensor
    "_all_gather_base": "input_tensor",
    "all_gather_coalesced": "input_tensor_list",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
    "reduce_scatter_single": "input",  # torch 2.13's name for reduce_scatter_tensor
    "_reduce_scatter_base": "input",
    "broadcast": "tensor",
    "reduce": "tensor",
    "gather": "tensor",
    "scatter": "tensor",
    "all_to_all": "input_tensor_list",
    "all_to_all_single": "input",
    # Not isend and irecv: torch checks a P2POp's function by identity against its own
    # (``_check_op``, ``batch_isend_irecv``'s ``op.op is isend``), which a wrapper, or a name bound
    # before install, would fail. Their batches are seen through batch_isend_irecv.
    "send": "tensor",
    "recv": "tensor",
    "barrier": None,
    "monitored_barrier": None,
    "batch_isend_irecv": "p2p_op_list",
}


# Point-to-point calls, and the parameters naming the peer (its global rank, or from torch 2.6
# its rank in the group): ProcessGroupNCCL makes a communicator for each pair of ranks at their
# first unbatched send or receive.
PEERS = {"send": ("dst", "group_dst"), "recv": ("src", "group_src")}


class Signature(NamedTuple):
    """Where a watched function takes its group, payload and peer: (position, name)."""

    op: str
    group: tuple[int, str] | None
    payload: tuple[int, str] | None
    peer: tuple[int, str] | None = None  # the peer's global rank
    group_peer: tuple[int, str] | None = None  # its rank in the group (torch 2.6 on)


def signature_of(op: str, function: Callable[..., Any]) -> Signature:
    """Where ``function`` (torch's ``op``) takes its group and payload, read once from its
    signature, so that a call finds them without binding its arguments."""
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        names = []
    payload = PAYLOADS.get(op)

    def at(name: str | None) -> tuple[int, str] | None:
        return (names.index(name), name) if name is not None and name in names else None

    peer, group_peer = PEERS.get(op, (None, None))
    return Signature(op, at("group"), at(payload), at(peer), at(group_peer))


def peer_of(signature: Signature, args: tuple[Any, ...], kwargs: Any) -> object:
    """The peer a send or receive names: its global rank, or ("group", its rank in the
    group); None for any other call, or a receive from any source."""
    if signature.peer is None and signature.group_peer is None:
        return None
    peer = argument(signature.peer, args, kwargs)
    if peer is not None:
        return peer
    in_group = argument(signature.group_peer, args, kwargs)
    return ("group", in_group) if in_group is not None else None


def argument(where: tuple[int, str] | None, args: tuple[Any, ...], kwargs: Any) -> Any:
    """The argument at ``where`` (position, name) of a call, None where not given."""
    if where is None:
        return None
    position, name = where
    if kwargs and name in kwargs:
        return kwargs[name]
    return args[position] if position < len(args) else None


def described(
    signature: Signature, args: tuple[Any, ...], kwargs: Any, ranks: list[int] | None
) -> ManifestCollective:
    """A call of a watched function, as the manifest keeps it: op, group ranks, dtype and
    element count of its payload (a list of tensors summed, a P2P list counted by its ops)."""
    payload = argument(signature.payload, args, kwargs)
    tensors = payload if isinstance(payload, (list, tuple)) else [payload]
    dtype: str | None = None
    numel = 0
    for item in tensors:
        tensor: Any = getattr(item, "tensor", item)  # a P2POp holds its tensor
        count = getattr(tensor, "numel", None)
        if tensor is None or count is None:
            continue
        numel += int(count())
        if dtype is None:
            dtype = str(tensor.dtype).removeprefix("torch.")
    return {"op": signature.op, "ranks": ranks, "dtype": dtype, "numel": numel}
