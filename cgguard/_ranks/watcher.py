"""The capture manifest's watcher: each capture of a process that is one rank of a job, in order,
with the collectives its thread issues inside it; and a communication resource's first use
inside a capture (first_use_in_capture, cgguard._ranks.first_use).

On only where the process has a rank identity (a launcher's RANK, LOCAL_RANK or WORLD_SIZE,
or a default group at install): any other
process pays nothing for it, on the capture path or in its collectives. One watcher serves an
installation through its reconfigurations, so that what it knows of the groups used, and the
hooks that tell it, stay one.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import TYPE_CHECKING, Any

from cgguard import _boot
from cgguard._core.watcher import Watcher
from cgguard._ranks.collectives import (
    PAYLOADS,
    Signature,
    argument,
    described,
    peer_of,
    signature_of,
)
from cgguard._ranks.first_use import DEFAULT, FirstUse, distributed, ranks_of
from cgguard._reporting.events import ranks as launcher_identity
from cgguard._rules.record import BEGAN_AT, ENDED, REFUSED, THREAD
from cgguard._support.frames import place_of, site_of, stack_above
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
# torch.compile's table of torch.distributed's functions it traces as functional collectives
# (torch/_dynamo/variables/functions.py reads it): each wrapper joins its function there, so
# that compiled code is traced as it was without cgguard.
_REMAPS = "torch.distributed._functional_collectives"


def distributed_identity() -> dict[str, int]:
    """torch.distributed's rank and world size, where a default group exists now."""
    dist = distributed()
    try:
        if dist is not None:
            return {"dist_rank": dist.get_rank(), "dist_world_size": dist.get_world_size()}
    except Exception as exc:  # a group being torn down
        warn_once("ranks:identity", f"could not read torch.distributed's rank: {exc!r}")
    return {}


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
        self.first_use = FirstUse()
        self._local = threading.local()  # whether this thread is inside a watched call
        self._distributed: dict[str, int] = {}  # torch.distributed's rank, once seen
        # One wrapper per torch function, put under each of its names; and the wrappers added
        # to torch.compile's table, taken out again when the watcher retires.
        self._wrappers: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        self._remapped: list[Callable[..., Any]] = []

    # The capture path.

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        if not self._distributed:  # until a default group is seen, a look at each capture
            self._distributed.update(distributed_identity())
        capture = self.manifest.begin(self._place(record))
        self._open[id(record)] = capture
        return (record, capture, graph if self.inputs_key is not None else None)

    def _place(self, record: Record) -> Place | None:
        """Where a capture began, by value (place_of caches per code object)."""
        return place_of(*site_of(record[BEGAN_AT]))

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

    def identity(self) -> dict[str, int | str]:
        """The process's rank identity: the launcher's variables, and torch.distributed's rank
        and world size as last seen (at a capture, or now): a report written at exit, after the
        program destroyed its group, still names its rank."""
        self._distributed.update(distributed_identity())
        return {**launcher_identity(), **self._distributed}

    def started(self) -> None:
        self.manifest.recording = True
        self.manifest.identify = self.identity
        # Imported by torch.compile when it first meets a collective, often after install.
        _boot.when_ready(_REMAPS, self._remap_when_imported)

    def retired(self) -> None:
        # The manifest stays in the report: what was recorded was recorded.
        _boot.cancel(_REMAPS, self._remap_when_imported)
        remaps = _remaps()
        for wrapper in self._remapped:
            remaps.pop(wrapper, None)
        self._remapped.clear()
        self._wrappers.clear()

    def after_fork(self) -> None:
        self._open.clear()
        self.first_use.clear()

    # Collectives.

    # Symmetric memory, which a program imports when it uses it.
    hook_modules = (SYMMETRIC_MEMORY,)

    def hooks(self) -> list[tuple[Any, str, Callable[[Any], Any]]]:
        """torch.distributed's collectives, under both of their names (one wrapper each), and
        symmetric memory's rendezvous and allocation once imported."""
        owners = [sys.modules.get(name) for name in _DISTRIBUTED]
        hooks: list[tuple[Any, str, Callable[[Any], Any]]] = [
            (owner, op, functools.partial(self._collective, op))
            for owner in owners
            if owner is not None
            for op in PAYLOADS
            if callable(vars(owner).get(op))
        ]
        symmetric = sys.modules.get(SYMMETRIC_MEMORY)
        if symmetric is not None:
            hooks += [
                (symmetric, name, functools.partial(self._symmetric_call, name))
                for name in ("rendezvous", "empty")
                if callable(vars(symmetric).get(name))
            ]
        return hooks

    def _collective(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        made = self._wrappers.get(id(original))
        if made is not None and made[0] is original:
            return made[1]  # the same function under its other name: the same wrapper
        wrapper = self._wrap(signature_of(op, original), original)
        self._wrappers[id(original)] = (original, wrapper)
        self._remap(_remaps())
        return wrapper

    def _remap(self, remaps: dict[Any, Any]) -> None:
        """Put each wrapper in torch.compile's table beside the function it wraps. Where torch
        made the table while cgguard was installed, its keys are the wrappers (the names it read
        then): torch's own functions join them, and stay, so that compiled code traces them
        after uninstall too."""
        for original, wrapper in list(self._wrappers.values()):
            if original in remaps and wrapper not in remaps:
                remaps[wrapper] = remaps[original]
                self._remapped.append(wrapper)
            elif wrapper in remaps and original not in remaps:
                remaps[original] = remaps[wrapper]

    def _remap_when_imported(self, module: Any) -> None:
        table = getattr(module, "traceable_collective_remaps", None)
        if isinstance(table, dict):
            self._remap(table)

    def _wrap(self, signature: Signature, original: Callable[..., Any]) -> Callable[..., Any]:
        tracker = self.installation.tracker
        active: dict[Any, Any] = tracker.active if tracker is not None else {}
        where, peered = signature.group, signature.peer is not None
        used, warm = self.first_use.used, self.first_use.warm

        # A plain function, as torch's own decorators wrap these: outside every capture it
        # costs one truth test and a note of the group used (benchmarks/collectives_overhead.py),
        # FirstUse.used inline for a collective, which names no peer.
        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if active:
                return self._inside(signature, original, args, kwargs)
            if where is not None:
                group = argument(where, args, kwargs)
                if peered:
                    used(group, peer_of(signature, args, kwargs))
                elif (DEFAULT if group is None else id(group)) not in warm:
                    used(group)
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
            uses = _uses(signature, args, kwargs)
            if record is None:
                for group, peer in uses:
                    self.first_use.used(group, peer)
                return
            capture = self._open.get(id(record))
            if capture is not None:
                group = uses[0][0] if uses else argument(signature.group, args, kwargs)
                capture.issued(described(signature, args, kwargs, ranks_of(group)))
            simulated = self._simulated()
            why = next(
                (
                    found
                    for group, peer in uses
                    if (found := self.first_use.collective(group, peer, simulated)) is not None
                ),
                None,
            )
            if why is None:
                return
            # Beyond _issued, _inside and the hook: the program's call.
            error = self._violated(record, f"torch.distributed.{signature.op}", why, 4)
        except Exception as exc:
            warn_once("ranks:collective", f"internal error while noting a collective: {exc!r}")
            return
        if error is not None:
            raise error

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

    def _violated(self, record: Record, api: str, why: str, depth: int) -> Any:
        """Report ``api``'s call, ``depth`` frames above this one, as first_use_in_capture."""
        reporter = self.installation.reporter  # read once: a reconfiguration swaps it whole
        stack = stack_above(depth)
        return reporter.violated(
            [("first_use_in_capture", record)], api, stack, refuse=True, why=why
        )

    # Symmetric memory.

    def _symmetric_call(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        installation = self.installation

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            # The tracker read at each call: the module may be watched before torch is patched.
            tracker = installation.tracker
            if tracker is not None and tracker.active:
                self._symmetric_used(name, args, kwargs)
            elif name == "rendezvous":
                self._rendezvous_outside(args, kwargs)
            return original(*args, **kwargs)

        return call

    def _rendezvous_outside(self, args: tuple[Any, ...], kwargs: Any) -> None:
        try:
            tensor, group = _rendezvous_arguments(args, kwargs)
            self.first_use.rendezvous_outside(tensor, group)
        except Exception as exc:
            warn_once("ranks:symmetric", f"internal error while noting symmetric memory: {exc!r}")

    def _symmetric_used(self, name: str, args: tuple[Any, ...], kwargs: Any) -> None:
        try:
            record = self._capturing()
            if record is None:
                if name == "rendezvous":
                    self._rendezvous_outside(args, kwargs)
                return
            tensor, group = _rendezvous_arguments(args, kwargs)
            why = self.first_use.symmetric(name, tensor, group)
            if why is None:
                return
            # Beyond _symmetric_used and the hook: the program's call.
            error = self._violated(record, f"{SYMMETRIC_MEMORY}.{name}", why, 3)
        except Exception as exc:
            warn_once("ranks:symmetric", f"internal error while noting symmetric memory: {exc!r}")
            return
        if error is not None:
            raise error


def _uses(signature: Signature, args: tuple[Any, ...], kwargs: Any) -> list[tuple[Any, Any]]:
    """The (group, peer) pairs a call uses: one, or each P2POp of a batch (its group and peer:
    a batch's sends and receives create their pairs' communicators as unbatched ones do not,
    but a group's first use is still the group's)."""
    if signature.op == "batch_isend_irecv":
        ops = argument(signature.payload, args, kwargs) or ()
        return [(getattr(op, "group", None), None) for op in ops]
    if signature.group is None:
        return []
    return [(argument(signature.group, args, kwargs), peer_of(signature, args, kwargs))]


def _rendezvous_arguments(args: tuple[Any, ...], kwargs: Any) -> tuple[Any, Any]:
    """The tensor and group of a rendezvous (or of an allocation: none)."""
    tensor = args[0] if args else kwargs.get("tensor")
    group = args[1] if len(args) > 1 else kwargs.get("group")
    return tensor, group


def _remaps() -> dict[Any, Any]:
    """torch.compile's table of traceable collectives; empty where torch has none."""
    module = sys.modules.get(_REMAPS)
    table = getattr(module, "traceable_collective_remaps", None)
    return table if isinstance(table, dict) else {}
