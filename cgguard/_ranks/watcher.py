"""The capture manifest's watcher: each capture of a process that is one rank of a job, in order,
with the collectives its thread issues inside it; and a communication resource's first use
inside a capture (first_use_in_capture).

On only where the process has a rank identity (cgguard._data.manifest.has_identity): any other
process pays nothing for it, on the capture path or in its collectives.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import TYPE_CHECKING, Any

from cgguard import _boot
from cgguard._core.watcher import Watcher
from cgguard._ranks.collectives import PAYLOADS, Signature, argument, described, signature_of
from cgguard._reporting.events import ranks as launcher_identity
from cgguard._rules.record import BEGAN_AT, ENDED, REFUSED, THREAD
from cgguard._support.frames import place_of, site_of, stack_above
from cgguard._support.patchset import PatchSet
from cgguard._support.threads import this_thread
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._core.installation import Installation
    from cgguard._data.manifest import Capture, Manifest
    from cgguard._rules.record import Record
    from cgguard._support.frames import Place

SYMMETRIC_MEMORY = "torch.distributed._symmetric_memory"
_DISTRIBUTED = ("torch.distributed", "torch.distributed.distributed_c10d")
# The default group, however a call names it (None, or the group object itself).
_DEFAULT = "default"

# What a first use inside a capture does (docs/ranks.md#first-use-inside-a-capture cites the
# sources). ProcessGroupNCCL creates a group's communicator at its first collective, and a pair's
# at their first unbatched send or receive (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp,
# ``getNCCLComm``, on a cache miss; no capture check on that path, torch 2.1 to 2.13), unless
# init_process_group(device_id=...) created it eagerly; creating one inside a capture fails on
# RCCL and older NCCL ("operation not permitted when stream is capturing"), unverified on current
# NVIDIA NCCL, whose own allocations switch to relaxed capture. gloo makes its context at
# init_process_group: a first use is no different there, and gloo cannot capture device work at
# all, first use or not; under the simulated runtime a gloo group stands for a device group.
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
_SYMMETRIC = {
    "rendezvous": (
        "a symmetric-memory rendezvous (torch.distributed._symmetric_memory.rendezvous), which "
        "exchanges memory handles with its peers and maps their memory, work CUDA cannot "
        "capture (cudaErrorStreamCaptureUnsupported)"
    ),
    "empty": (
        "a symmetric-memory allocation (torch.distributed._symmetric_memory.empty), which "
        "allocates from the symmetric-memory pool, not the graph's, during the capture"
    ),
}


def identity() -> dict[str, int | str]:
    """The process's rank identity: the launcher's variables, and torch.distributed's rank and
    world size where a default group exists."""
    found = launcher_identity()
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            found["dist_rank"] = dist.get_rank()
            found["dist_world_size"] = dist.get_world_size()
    except Exception as exc:  # a group being torn down
        warn_once("ranks:identity", f"could not read torch.distributed's rank: {exc!r}")
    return found


class RankManifest(Watcher):
    """Records each capture into ``manifest``, keyed by ``inputs_key`` where inspection saw
    the graph's inputs (else by its ordinal at its site), with the collectives issued in it."""

    def __init__(
        self,
        installation: Installation,
        manifest: Manifest,
        inputs_key: Callable[[Any], str | None] | None = None,
    ) -> None:
        self.installation = installation
        self.manifest = manifest
        self.inputs_key = inputs_key
        # The captures under way, by their record's identity: a collective finds its own.
        self._open: dict[int, Capture] = {}
        # Groups that have run a collective outside a capture, held so that an id is not
        # reused; and what first_use_in_capture has already told.
        self._warm: dict[object, object] = {}
        self._told: set[object] = set()
        self._symmetric = PatchSet()
        self._local = threading.local()  # whether this thread is inside a watched call
        # The last capture's (code, instruction, place): one tuple, replaced whole.
        self._last: tuple[Any, int, Place | None] = (None, -1, None)
        self._rendezvoused: set[tuple[int, object]] = set()

    # The capture path.

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        capture = self.manifest.begin(self._place(record))
        self._open[id(record)] = capture
        return (record, capture, graph if self.inputs_key is not None else None)

    def _place(self, record: Record) -> Place | None:
        """Where a capture began, by value; the last one found is remembered, as the census
        remembers its last site: captures made in a loop find theirs at once."""
        code, lasti = site_of(record[BEGAN_AT])
        last = self._last
        if code is last[0] and lasti == last[1]:
            return last[2]
        place = place_of(code, lasti)
        self._last = (code, lasti, place)
        return place

    def closed(self, token: Any, outcome: str, error: BaseException | None) -> None:
        record, capture, graph = token
        self._open.pop(id(record), None)
        capture.outcome = outcome
        if outcome == ENDED and graph is not None and self.inputs_key is not None:
            key = self.inputs_key(graph)
            if key is not None:
                capture.key = key

    def refused(self, record: Record) -> None:
        capture = self.manifest.begin(self._place(record))
        capture.outcome = REFUSED

    def started(self) -> None:
        self.manifest.recording = True
        self.manifest.identify = identity
        _boot.when_ready(SYMMETRIC_MEMORY, self._watch_symmetric)

    def retired(self) -> None:
        # The manifest stays in the report: what was recorded was recorded.
        _boot.cancel(SYMMETRIC_MEMORY, self._watch_symmetric)
        self._symmetric.restore()

    def after_fork(self) -> None:
        self._open.clear()
        self._warm.clear()
        self._told.clear()

    # Collectives.

    def hooks(self) -> list[tuple[Any, str, Callable[[Any], Any]]]:
        """torch.distributed's collectives, under both of their names."""
        owners = [sys.modules.get(name) for name in _DISTRIBUTED]
        return [
            (owner, op, functools.partial(self._collective, op))
            for owner in owners
            if owner is not None
            for op in PAYLOADS
            if callable(vars(owner).get(op))
        ]

    def _collective(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = signature_of(op, original)
        tracker = self.installation.tracker
        active: dict[Any, Any] = tracker.active if tracker is not None else {}
        where, peer = signature.group, signature.peer
        warm = self._warm

        # A plain function, as torch's own decorators wrap these: outside every capture it
        # costs one truth test, and notes the group as used (cgguard's benchmark measures it).
        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if active:
                return self._inside(signature, original, args, kwargs)
            if where is not None:
                group = argument(where, args, kwargs)
                key: object = _DEFAULT if group is None else id(group)
                if peer is not None:
                    key = (key, argument(peer, args, kwargs))
                if key not in warm:
                    warm[key] = group
            return original(*args, **kwargs)

        return collective

    def _inside(
        self, signature: Signature, original: Callable[..., Any], args: tuple[Any, ...], kwargs: Any
    ) -> Any:
        """A watched call while something captures, noted once: torch hands a call to every
        torch-function mode on the stack (``handle_torch_function``), which calls the public
        function, this hook, again."""
        local = self._local
        if getattr(local, "calling", False):
            return original(*args, **kwargs)
        self._issued(signature, args, kwargs)
        local.calling = True
        try:
            return original(*args, **kwargs)
        finally:
            local.calling = False

    def _issued(self, signature: Signature, args: tuple[Any, ...], kwargs: Any) -> None:
        """A watched call while something captures: noted in this thread's capture, if it has
        one; a communication resource's first use there reported."""
        try:
            record = self._capturing()
            group = argument(signature.group, args, kwargs)
            key = self._key(group, signature, args, kwargs)
            if record is None:
                self._warm.setdefault(key, group)
                return
            capture = self._open.get(id(record))
            if capture is not None:
                capture.issued(described(signature, args, kwargs, _ranks_of(group)))
            why = self._first_use(signature, group, key)
            if why is None:
                return
            error = self._violated(record, f"torch.distributed.{signature.op}", why)
        except Exception as exc:
            warn_once("ranks:collective", f"internal error while noting a collective: {exc!r}")
            return
        if error is not None:
            raise error

    def _first_use(self, signature: Signature, group: object, key: object) -> str | None:
        """Why this call, inside a capture, is its group's (or peer pair's) first use; None where
        it is not, or where nothing is known to go wrong at a first use."""
        if signature.group is None or key in self._warm or key in self._told:
            return None
        backend = _backend_of(group)
        said = _group_text(group)
        if backend == "nccl":
            if signature.peer is not None:
                why = f"{said}, sending or receiving {_NCCL_PEER}"
            elif _nccl_ready(group):
                return None
            else:
                why = f"{said}, {_NCCL_GROUP}"
        elif backend == "gloo" and self._simulated():
            why = f"{said}, {_SIMULATED}"
        else:
            return None
        self._told.add(key)
        return why

    def _simulated(self) -> bool:
        """Whether CPU tensors stand for device tensors here (cgguard's simulated runtime)."""
        tracker = self.installation.tracker
        return tracker is not None and tracker.probes.every_tensor

    def _capturing(self) -> Record | None:
        """This thread's innermost capture under way, if any."""
        tracker = self.installation.tracker
        if tracker is None:
            return None
        thread = this_thread()
        found: Record | None = next(
            (r for r in reversed(list(tracker.active.values())) if r[THREAD] is thread), None
        )
        return found

    def _key(
        self, group: object, signature: Signature, args: tuple[Any, ...], kwargs: Any
    ) -> object:
        """The resource a call uses: its group (the default group however named), and for a
        send or receive, the peer too."""
        found: object = id(group)
        if group is None:
            found = _DEFAULT
        else:
            dist = sys.modules.get("torch.distributed")
            try:
                if dist is not None and group is dist.distributed_c10d._get_default_group():
                    found = _DEFAULT
            except Exception:  # noqa: S110 - no default group: the group is its own key
                pass
        if signature.peer is not None:
            return (found, argument(signature.peer, args, kwargs))
        return found

    def _violated(self, record: Record, api: str, why: str) -> Any:
        reporter = self.installation.reporter  # read once: a reconfiguration swaps it whole
        stack = stack_above(4)  # beyond this, the hook and torch's wrapper: the user's call
        return reporter.violated(
            [("first_use_in_capture", record)], api, stack, refuse=True, why=why
        )

    # Symmetric memory, imported by the program when it uses it.

    def _watch_symmetric(self, module: Any) -> None:
        try:
            self._symmetric.apply(
                [
                    (module, name, functools.partial(self._symmetric_call, name))
                    for name in _SYMMETRIC
                    if callable(vars(module).get(name))
                ]
            )
        except Exception as exc:
            warn_once("ranks:symmetric", f"could not watch symmetric memory: {exc!r}")

    def _symmetric_call(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        tracker = self.installation.tracker
        active: dict[Any, Any] = tracker.active if tracker is not None else {}

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            if active:
                self._symmetric_used(name, args, kwargs)
            elif name == "rendezvous" and args:
                # Done outside a capture: the handle is made, and a later rendezvous of the same
                # tensor and group inside one only looks it up.
                self._rendezvoused.add(_rendezvous_key(args, kwargs))
            return original(*args, **kwargs)

        return call

    def _symmetric_used(self, name: str, args: tuple[Any, ...], kwargs: Any) -> None:
        try:
            record = self._capturing()
            if record is None:
                if name == "rendezvous" and args:
                    self._rendezvoused.add(_rendezvous_key(args, kwargs))
                return
            if name == "rendezvous" and _rendezvous_key(args, kwargs) in self._rendezvoused:
                return
            error = self._violated(record, f"{SYMMETRIC_MEMORY}.{name}", _SYMMETRIC[name])
        except Exception as exc:
            warn_once("ranks:symmetric", f"internal error while noting symmetric memory: {exc!r}")
            return
        if error is not None:
            raise error


def _rendezvous_key(args: tuple[Any, ...], kwargs: Any) -> tuple[int, object]:
    tensor = args[0] if args else kwargs.get("tensor")
    group = args[1] if len(args) > 1 else kwargs.get("group")
    pointer = tensor.data_ptr() if hasattr(tensor, "data_ptr") else id(tensor)
    return pointer, group if isinstance(group, str) else id(group)


def _ranks_of(group: object) -> list[int] | None:
    """The global ranks of ``group`` (None: the default group), where torch.distributed says."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            return None
        resolved = group if group is not None else dist.distributed_c10d._get_default_group()
        return [int(rank) for rank in dist.get_process_group_ranks(resolved)]
    except Exception:
        return None


def _group_text(group: object) -> str:
    ranks = _ranks_of(group)
    name = "the default group" if group is None else "a group"
    backend = _backend_of(group)
    said = f"{name} of ranks {ranks}" if ranks is not None else name
    return f"{said} ({backend})" if backend else said


def _backend_of(group: object) -> str:
    dist = sys.modules.get("torch.distributed")
    try:
        return str(dist.get_backend(group)) if dist is not None else ""
    except Exception:
        return ""


def _nccl_ready(group: object) -> bool:
    """Whether ``group``'s NCCL communicator exists: made eagerly (its bound device), or
    initialised (``ProcessGroupNCCL._is_initialized``, torch 2.13); False where not known."""
    dist, torch = sys.modules.get("torch.distributed"), sys.modules.get("torch")
    try:
        if dist is None or torch is None:
            return False
        resolved: Any = group if group is not None else dist.distributed_c10d._get_default_group()
        if getattr(resolved, "bound_device_id", None) is not None:
            return True
        backend = resolved._get_backend(torch.device("cuda"))
        initialized = getattr(backend, "_is_initialized", None)
        return bool(initialized()) if initialized is not None else False
    except Exception:
        return False
