"""A communication resource's first use inside a capture (first_use_in_capture): which groups,
peer pairs and symmetric-memory buffers this process has used outside every capture, and why a
use inside one is a first use that is not capturable.

What a first use does inside a capture (docs/ranks.md#first-use-inside-a-capture cites the
sources). ProcessGroupNCCL creates a group's communicator at its first collective, and a pair's
at their first unbatched send or receive (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp,
``getNCCLComm``, on a cache miss; no capture check on that path, torch 2.1 to 2.13), unless
init_process_group(device_id=...) created it eagerly; creating one inside a capture fails on RCCL
(ROCm/rccl#2022) and older NCCL ("operation not permitted when stream is capturing", pytorch PR
#78666), unverified on current NVIDIA NCCL, whose own allocations switch to relaxed capture.
gloo makes its context at init_process_group: a first use is no different there, and gloo
cannot capture device work at all, first use or not; under the simulated runtime a gloo group
stands for a device group. A first symmetric-memory rendezvous of a buffer uploads its peers'
pointer tables and synchronizes (pytorch#198140), a cache hit does not; an allocation fails
when the pool must grow.
"""

from __future__ import annotations

import sys
from typing import Any

# The default group, however a call names it (None, or the group object itself).
DEFAULT = "default"
# Rendezvous remembered outside captures; past this, the oldest half are forgotten (a forgotten
# one is at worst reported once, if it is repeated inside a capture).
RENDEZVOUS_KEPT = 4096

_NCCL_GROUP = (
    "whose NCCL communicator does not exist yet: ProcessGroupNCCL creates it at the group's "
    "first collective, here inside the capture (ncclCommInitRank, a store exchange and device "
    "allocations), which RCCL and older NCCL fail"
)
_NCCL_PEER = (
    "to a peer it has not sent to or received from outside a capture: ProcessGroupNCCL creates "
    "a communicator for each pair at their first unbatched send or receive, here inside the "
    "capture"
)
_SIMULATED = (
    "which has run no collective outside a capture since cgguard was installed (under the "
    "simulated runtime a gloo group stands for a device group, whose NCCL communicator would "
    "be created here)"
)
SYMMETRIC = {
    "rendezvous": (
        "a symmetric-memory rendezvous (torch.distributed._symmetric_memory.rendezvous) of a "
        "buffer not rendezvoused outside a capture, which exchanges memory handles with its "
        "peers and maps their memory, work CUDA cannot capture (cudaErrorStreamCaptureUnsupported)"
    ),
    "empty": (
        "a symmetric-memory allocation (torch.distributed._symmetric_memory.empty), which "
        "allocates from the symmetric-memory pool, not the graph's, and fails during a capture "
        "when that pool must grow"
    ),
}


class FirstUse:
    """What this process has used outside every capture, and what was told of first uses.

    Each resource is keyed by the group (its id, with the group held, so that the id cannot be
    reused while known; the default group under one key however named) and, for a send or
    receive, the peer.
    """

    def __init__(self) -> None:
        self.warm: dict[object, object] = {}  # key -> the group, held
        self.told: dict[object, object] = {}
        self.rendezvoused: dict[tuple[int, object], object] = {}

    def clear(self) -> None:
        """Nothing used yet, as a forked child starts."""
        self.warm.clear()
        self.told.clear()
        self.rendezvoused.clear()

    def used(self, group: object, peer: object = None) -> None:
        """``group`` (and ``peer``) used outside every capture."""
        key = key_of(group, peer)
        if key not in self.warm:
            self.warm[key] = group

    def collective(self, group: object, peer: object, simulated: bool) -> str | None:
        """Why a use of ``group`` (with ``peer`` for a send or receive) inside a capture is a
        first use that is not capturable, once per resource; None where it is not one."""
        key = key_of(group, peer)
        if key in self.warm or key in self.told:
            return None
        if resolved(group) is None:
            # The default group, named either way here and outside the capture.
            default = default_group()
            names = (key_of(None, peer), key_of(default, peer) if default is not None else key)
            if any(name in self.warm or name in self.told for name in names):
                return None
        backend = backend_of(group)
        said = group_text(group)
        if backend == "nccl":
            if peer is not None:
                why = f"{said}, sending or receiving {_NCCL_PEER}"
            elif nccl_ready(group):
                return None
            else:
                why = f"{said}, {_NCCL_GROUP}"
        elif backend == "gloo" and simulated:
            why = f"{said}, {_SIMULATED}"
        else:
            return None
        self.told[key] = group
        return why

    def rendezvous_outside(self, tensor: object, group: object) -> None:
        """A rendezvous of ``tensor`` over ``group`` outside every capture: its handle is made,
        and the same one inside a capture only looks it up."""
        if len(self.rendezvoused) >= RENDEZVOUS_KEPT:
            for key in list(self.rendezvoused)[: RENDEZVOUS_KEPT // 2]:
                del self.rendezvoused[key]
        self.rendezvoused[rendezvous_key(tensor, group)] = group

    def symmetric(self, name: str, tensor: object, group: object) -> str | None:
        """Why a symmetric-memory call inside a capture is not capturable; None where it is a
        rendezvous already made outside one."""
        if name == "rendezvous" and rendezvous_key(tensor, group) in self.rendezvoused:
            return None
        return SYMMETRIC.get(name)


def key_of(group: object, peer: object = None) -> object:
    """The resource a call uses: the group (the default one under DEFAULT), and the peer."""
    found: object = DEFAULT if group is None else id(group)
    return found if peer is None else (found, peer)


def rendezvous_key(tensor: object, group: object) -> tuple[int, object]:
    """A rendezvous by its buffer's address and its group (a name, or the group's id)."""
    pointer = getattr(tensor, "data_ptr", None)
    address = int(pointer()) if callable(pointer) else id(tensor)
    return address, group if isinstance(group, str) else id(group)


def distributed() -> Any:
    """torch.distributed where it has a default group in this process, else None; never
    imports it."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # noqa: S110 - being torn down: none
        pass
    return None


def default_group() -> object:
    """torch.distributed's default group, None where there is none."""
    dist = distributed()
    try:
        return dist.distributed_c10d._get_default_group() if dist is not None else None
    except Exception:  # being torn down: none
        return None


def resolved(group: object) -> object:
    """``group``, or None where it is the default group named by its object."""
    return None if group is not None and group is default_group() else group


def ranks_of(group: object) -> list[int] | None:
    """The global ranks of ``group`` (None: the default group), where torch.distributed says."""
    dist = distributed()
    try:
        if dist is None:
            return None
        found = group if group is not None else default_group()
        return [int(rank) for rank in dist.get_process_group_ranks(found)]
    except Exception:
        return None


def group_text(group: object) -> str:
    """``the default group of ranks [0, 1] (nccl)``."""
    ranks = ranks_of(group)
    name = "the default group" if resolved(group) is None else "a group"
    backend = backend_of(group)
    said = f"{name} of ranks {ranks}" if ranks is not None else name
    return f"{said} ({backend})" if backend else said


def backend_of(group: object) -> str:
    dist = sys.modules.get("torch.distributed")
    try:
        return str(dist.get_backend(group)) if dist is not None else ""
    except Exception:
        return ""


def nccl_ready(group: object) -> bool:
    """Whether ``group``'s NCCL communicator exists: made eagerly (its bound device), or
    initialised (``ProcessGroupNCCL._is_initialized``, torch 2.13); False where not known."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or distributed() is None:
            return False
        found: Any = group if group is not None else default_group()
        if getattr(found, "bound_device_id", None) is not None:
            return True
        backend = found._get_backend(torch.device("cuda"))
        initialized = getattr(backend, "_is_initialized", None)
        return bool(initialized()) if initialized is not None else False
    except Exception:
        return False
