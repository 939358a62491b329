"""Inspection: each capture watched op by op, from its capture_begin to its capture_end, and each
replay of a graph it made checked for inputs that died.

A ``TorchDispatchMode`` is put on the capturing thread's dispatch-mode stack just before torch's
capture_begin and taken off once its capture_end has returned (or failed): it sees every aten op
the capture's Python code dispatches, as torch's own ``check_input_liveness`` tracker does
(torch/utils/_cuda_debug.py). A dispatch mode is thread-local, so another thread's ops are not
seen; its Python-level synchronizes stay covered by sync_during_capture.

The mode (cgguard._inspect.mode) goes at the bottom of the stack, below the program's own
modes. A capture ended on another thread (a relaxed capture may be) leaves its mode silent on
the capturing thread until that thread's next RNG call or capture_begin takes it off: a
thread's mode stack is its own.

- implicit_sync: an op of cgguard._inspect.sync_ops's table on a device tensor is reported before it
  runs, and refused in raise mode, so the capture is not invalidated.
- rng_during_capture: torch.cuda's seeding and RNG-state functions, wrapped while inspection
  is on, are reported before torch refuses them, and only where torch refuses them
  (cgguard._inspect.rng).
- dead_input: the capture's external inputs are held by weak references (cgguard._inspect.liveness);
  a replay of a graph whose input was freed or moved is reported, and refused in raise mode.
- a capture_end that fails because the capture was invalidated is told the first offending
  call reported since that capture began, or that cgguard saw none.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import TYPE_CHECKING, Any, cast

from cgguard._core.probes import NO_TORCH
from cgguard._core.watcher import GRAPH_NOTES, Watcher
from cgguard._errors import hidden_by_pytest
from cgguard._gate.profiles import PROFILES
from cgguard._inspect import bindings as _bindings
from cgguard._inspect import lifecycle as _lifecycle
from cgguard._inspect import liveness as _liveness
from cgguard._inspect import rebinding as _rebinding
from cgguard._inspect.mode import mode_type, prepare, push_below, remove_mode
from cgguard._inspect.rng import RNG_FUNCTIONS, rng_refused
from cgguard._inspect.sync_ops import syncs
from cgguard._rules.record import BEGAN_AT, ENDED, FAILED, MODE
from cgguard._support.frames import Stack, resolve, site_of, stack_above
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from cgguard._core.installation import Installation
    from cgguard._core.probes import Probes
    from cgguard._data.schema import ViolationEvent
    from cgguard._errors import CaptureViolation
    from cgguard._inspect.inspections import Inspections
    from cgguard._inspect.sync_ops import SyncOp
    from cgguard._rules.record import Record
    from cgguard._support.frames import Snapshot

# The traceback of a refused op ends at the user's line (cgguard._errors.hidden_by_pytest).
__tracebackhide__ = hidden_by_pytest

# Where a graph captured under inspection keeps its external inputs
# (cgguard._inspect.liveness.Inputs): on the graph itself, so they go with it, and a replay
# finds them in one look-up.
_INPUTS = GRAPH_NOTES

# What CUDA says of a capture that a prohibited call broke: cudaErrorStreamCaptureInvalidated
# and cudaErrorStreamCaptureUnsupported (cudaGetErrorString).
_BROKEN = (
    "operation failed due to a previous error during capture",
    "operation not permitted when stream is capturing",
    "invalidated",
)
NONE_SEEN = (
    "no offending call seen by cgguard: a C++ extension, another thread, or a kernel "
    "launched outside torch's dispatcher"
)


class InspectedCapture:
    """One inspected capture: its dispatch mode, its inputs, and the first offending call."""

    def __init__(self, inspector: Inspector, graph: Any, record: Record, *, live: bool) -> None:
        self.inspector = inspector
        self.graph = graph
        self.record = record
        self.on = True  # False once the capture is over or its inspector retired: it forwards
        self.closed = False  # the capture is over: the mode comes off its thread's stack
        self.pushed = False  # whether the mode is on its thread's dispatch-mode stack
        # None where torch's own check_input_liveness tracks this capture's inputs.
        self.inputs = _liveness.Inputs(record) if live else None
        self.offender: ViolationEvent | None = None  # the first call reported and let through
        # The thread itself, not its id: an id is reused once its thread has ended.
        self.thread = threading.current_thread()
        self.mode: Any = None
        # What stands for a device tensor, as the probes say: a CUDA tensor, or any tensor
        # where a runtime standing in for CUDA's keeps device memory on the host.
        probes = inspector.probes()
        self.every_tensor = probes.every_tensor
        self.on_device = probes.on_device
        self.waited = probes.waited

    def enter(self) -> None:
        inspections = self.inspector.inspections
        inspections.forget_closed()  # captures of this thread that another thread ended
        self.mode = mode_type()(self)
        push_below(self.mode)
        self.pushed = True
        inspections.captures().append(self)
        inspections.listen(self, opened=True)

    def leave(self) -> None:
        """The capture is over: silence the mode, and take it off its thread's stack if this
        is that thread; otherwise that thread's next RNG call or capture_begin does."""
        self.on = False
        self.closed = True
        self.inspector.inspections.listen(self, opened=False)
        if self.thread is threading.current_thread():
            self.take_off()

    def take_off(self) -> None:
        """Take the mode off this thread's stack and the capture off its list (its own thread)."""
        captures = self.inspector.inspections.captures()
        if self in captures:
            captures.remove(self)
        if self.pushed:
            self.pushed = False
            remove_mode(self.mode)

    # The dispatch mode's work, each op.

    def synchronizing(self, op: SyncOp, func: Any, args: tuple[Any, ...], kwargs: Any) -> None:
        """Report ``op`` if this call synchronizes; raise the refusal, or fail as CUDA does."""
        name = str(func._schema.name)
        try:
            if not syncs(op, args, kwargs, self.on_device):
                return
            # A relaxed capture lets the thread synchronize streams that do not capture.
            if self.record[MODE] == "relaxed" and not self.inspector.probe_capturing():
                return
            error = self.inspector.violated("implicit_sync", self.record, name, why=op.wrote)
        except Exception as exc:
            warn_once(
                "inspect:sync", f"internal error while inspecting an op, not checked: {exc!r}"
            )
            return
        if error is not None:
            raise error
        # Let through: CUDA fails the op and invalidates the capture, and a runtime standing in
        # for CUDA's, whose host op would succeed, is told so that it fails it as CUDA does.
        self.waited(name)


def inputs_key(graph: Any) -> str | None:
    """What a graph captured under inspection read from outside it, as one key: the number of
    its external inputs and a digest of their dtypes and shapes, in the order first read (the
    capture manifest's key, cgguard._ranks). None where the capture noted no inputs."""
    inputs = getattr(graph, "__dict__", {}).get(_INPUTS)
    if inputs is None:
        return None
    import hashlib

    described = "\n".join(item.described for item in inputs.external)
    digest = hashlib.blake2b(described.encode(), digest_size=6).hexdigest()
    return f"{len(inputs.external)} inputs {digest}"


class Inspector(Watcher):
    """The watcher of every capture while inspection is on (``Config(inspect=True)``)."""

    wants_replays = True
    notes_graphs = True

    def __init__(
        self, installation: Installation, inspections: Inspections, first: int | None = None
    ) -> None:
        self.installation = installation
        self.inspections = inspections
        self.first = first  # inspect only the first N captures of each site; None: all
        self.sites: dict[int, tuple[object, int]] = {}  # id(code) -> (code, captures seen)
        # The built-in profiles' lifecycle functions, each followed by a check of bindings.
        self.lifecycle = _lifecycle.Lifecycle(self._after_lifecycle)

    # The capture path's calls (cgguard._core.watcher).

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        # What an earlier capture into this graph read is gone already
        # (cgguard._core.watcher.forget_graph, at every capture_begin, inspected or not).
        if self.first is not None and not self._counts(record):
            return None
        # torch's one-time set-up, before capture_begin (the census, told first, did it before
        # its clock where it counts).
        prepare()
        capture = InspectedCapture(self, graph, record, live=not _torch_tracks(args, kwargs))
        capture.enter()
        return capture

    def closed(self, token: Any, outcome: str, error: BaseException | None) -> None:
        if not isinstance(token, InspectedCapture):
            return
        token.leave()
        if outcome == ENDED and token.inputs is not None:
            inputs = token.inputs
            # The record with its begin stack walked now: a live frame moves on once the
            # capture's with statement ends, and a replay may report it much later.
            record = token.record
            began = resolve(record[BEGAN_AT])
            inputs.record = cast("Record", (*record[:BEGAN_AT], began, *record[BEGAN_AT + 1 :]))
            vars(token.graph)[_INPUTS] = inputs
            self._bind(inputs, sys._getframe(1))
        elif outcome == FAILED and error is not None and _broken(error):
            self._what_broke(token, error)

    def replaying(self, graph: Any) -> None:
        inputs = graph.__dict__.get(_INPUTS)
        # The two tests a healthy graph's replay costs: no input died, no name was rebound.
        if inputs is None or (inputs.healthy and inputs.epoch == self.inspections.epoch.value):
            return
        self._check_replay(graph, inputs)

    def _bind(self, inputs: _liveness.Inputs, frame: Any) -> None:
        """Name the inputs of a capture that ended, from the frames that ended it outwards."""
        inspections = self.inspections
        inputs.epoch = inspections.epoch.value
        try:
            torch = sys.modules["torch"]
            inputs.bindings = _bindings.name_inputs(
                inputs, frame, torch.Tensor, getattr(torch.nn, "Module", None)
            )
        except Exception as exc:
            warn_once("inspect:bind", f"internal error while naming a graph's inputs: {exc!r}")
            return
        if inputs.bindings:
            inspections.bound.add(inputs)

    def check_bindings(
        self, *, refuse: bool, api: str = "cgguard.check_bindings"
    ) -> list[_bindings.StaleBinding]:
        """Every live graph's bindings, checked now: each stale one reported (refused where
        ``refuse`` and the rule raises: the first such error is raised after all are told)."""
        inspections = self.inspections
        inspections.epoch.moved()
        found: list[_bindings.StaleBinding] = []
        error = None
        for inputs in list(inspections.bound):
            stale, raised = self._stale_bindings(inputs, api, refuse=refuse, forget=False, depth=3)
            found.extend(stale)
            error = error or raised
        if error is not None:
            raise error
        return found

    def _stale_bindings(
        self, inputs: _liveness.Inputs, api: str, *, refuse: bool, forget: bool, depth: int
    ) -> tuple[list[_bindings.StaleBinding], CaptureViolation | None]:
        """Report each of ``inputs``' bindings whose name holds another tensor now; with
        ``forget``, one only logged is forgotten (told once; a refused one refuses each
        replay). The error to raise, if the rule raises: the first, after which none is
        looked at."""
        inspections = self.inspections
        tensor_type = sys.modules["torch"].Tensor
        site = Stack(inputs.record[BEGAN_AT]).where
        found = []
        error = None
        for binding, change in _bindings.changed(inputs.bindings, tensor_type):
            rebound_at = binding.rebound_at(inspections.epoch)
            rebound = Stack(rebound_at).where if rebound_at is not None else None
            found.append(_bindings.StaleBinding(binding.name, site, change, rebound))
            why = f"{binding.name}, which {change}"
            if rebound_at is not None:
                why += ", rebound at {rebound_stack}"
            error = self.violated(
                "stale_binding",
                inputs.record,
                api,
                why=why,
                more={"rebound_stack": rebound_at},
                depth=depth,
                refuse=refuse,
            )
            if error is not None:
                break
            if forget:
                inputs.bindings.remove(binding)
        return found, error

    def started(self) -> None:
        if self.installation.reporter.config.profiles != "off":
            self.lifecycle.watch(tuple(e for p in PROFILES for e in p.lifecycle))

    def retired(self) -> None:
        # A reconfiguration took inspection off (or made a new inspector): this one's captures
        # still under way stop judging at once, as its RNG hooks have come off. Their modes
        # come off at their capture_end, as ever.
        self.inspections.retire(self)
        self.lifecycle.undo()

    def _after_lifecycle(self, entry: str) -> None:
        self.check_bindings(refuse=False, api=entry)

    def hooks(self) -> list[tuple[Any, str, Callable[[Any], Any]]]:
        """torch.cuda's RNG functions, and what can rebind a name a graph reads, wrapped
        while inspection is on."""
        owners = [sys.modules.get("torch.cuda"), sys.modules.get("torch.cuda.random")]
        hooks: list[tuple[Any, str, Callable[[Any], Any]]] = [
            (owner, name, functools.partial(self._rng_hook, name))
            for owner in owners
            if owner is not None
            for name in RNG_FUNCTIONS
            if callable(vars(owner).get(name))
        ]
        torch = sys.modules.get("torch")
        module = getattr(getattr(torch, "nn", None), "Module", None)
        if torch is not None and module is not None:
            compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
            hooks += _rebinding.hooks(self.inspections.epoch, torch.Tensor, module, compiling)
        return hooks

    # Reporting.

    def violated(
        self,
        rule: str,
        record: Record,
        api: str,
        *,
        why: str = "",
        more: Mapping[str, Snapshot | None] | None = None,
        depth: int = 3,
        refuse: bool = True,
    ) -> CaptureViolation | None:
        # Clamped: a script's top level, or a thread of torch's own, may be shallower.
        stack = stack_above(depth)
        reporter = self.installation.reporter  # read once: a reconfiguration swaps it whole
        return reporter.violated([(rule, record)], api, stack, refuse=refuse, why=why, more=more)

    def probes(self) -> Probes:
        """What the capture path asks torch and the device, as in effect now."""
        tracker = self.installation.tracker
        return tracker.probes if tracker is not None else NO_TORCH

    def probe_capturing(self) -> bool:
        try:
            return self.installation.tracker is None or self.probes().is_capturing()
        except Exception:
            return True

    def _counts(self, record: Record) -> bool:
        """Whether this capture is among the first ``first`` of its site."""
        try:
            code, _ = site_of(record[BEGAN_AT])
        except Exception:
            return True
        key = id(code)
        seen = self.sites.get(key)
        count = 1 if seen is None or seen[0] is not code else seen[1] + 1
        self.sites[key] = (code, count)  # the code kept: its id is not reused meanwhile
        return count <= (self.first or 0)

    def _rng_hook(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        api = f"torch.cuda.{name}"

        @functools.wraps(original)
        def rng(*args: Any, **kwargs: Any) -> Any:
            inspections = self.inspections
            if getattr(inspections.local, "captures", None):  # nothing inspected here: one test
                error = None
                try:
                    capture = inspections.judging()
                    if capture is not None and rng_refused(name, args, kwargs):
                        error = capture.inspector.violated(
                            "rng_during_capture", capture.record, api, depth=2
                        )
                except Exception as exc:
                    warn_once("inspect:rng", f"internal error while inspecting a call: {exc!r}")
                if error is not None:
                    raise error
            return original(*args, **kwargs)

        return rng

    def _check_replay(self, graph: Any, inputs: _liveness.Inputs) -> None:
        """Report each stale binding, then each dead input; refuse the replay at the first
        where the rule raises. One that is only logged is reported once and forgotten: the
        graph is healthy again, and its later replays cost the two tests, not a walk and a
        report each."""
        try:
            error = self._rebound(inputs)
            if error is None and not inputs.healthy:
                error = self._dead(graph, inputs)
        except Exception as exc:
            warn_once("inspect:replay", f"internal error while checking a replay: {exc!r}")
            return
        if error is not None:
            raise error

    def _rebound(self, inputs: _liveness.Inputs) -> CaptureViolation | None:
        """The bindings of a graph about to replay, where the epoch moved since their check:
        a name rebound is told first, since its old tensor may be freed too and the name says
        more than dead_input would. Its input is then not told again as dead."""
        epoch = self.inspections.epoch.value
        if inputs.epoch == epoch:
            return None
        before = {b.address for b in inputs.bindings}
        _, error = self._stale_bindings(
            inputs, "CUDAGraph.replay", refuse=True, forget=True, depth=5
        )
        if error is not None:
            return error
        inputs.epoch = epoch
        left = {b.address for b in inputs.bindings}
        for address in before - left:
            item = inputs.seen.get(address)
            if item is not None:
                inputs.forget(item)
        return None

    def _dead(self, graph: Any, inputs: _liveness.Inputs) -> CaptureViolation | None:
        error = None
        allocator = self.probes().allocator
        dead = [(i, how) for i, how in inputs.dead() if not _in_pool(graph, i, how, allocator)]
        for item, how in dead:
            if how == "freed":
                why = (
                    f"was freed at {{freed_stack}} ({item.described}, first read by the "
                    f"capture at {{read_stack}})"
                )
            else:
                why = (
                    f"now has another address, its storage resized or replaced "
                    f"({item.described}, first read by the capture at {{read_stack}})"
                )
            more = {"read_stack": item.read_at, "freed_stack": item.freed_at}
            error = self.violated(
                "dead_input", inputs.record, "CUDAGraph.replay", why=why, more=more, depth=4
            )
            if error is not None:
                return error
            inputs.forget(item)
        inputs.healthy = True
        return None

    def _what_broke(self, capture: InspectedCapture, error: BaseException) -> None:
        """Say which call broke the capture whose capture_end failed with ``error``."""
        try:
            began = Stack(capture.record[BEGAN_AT]).where
            offender = capture.offender
            if offender is not None:
                said = f"first offending call seen by cgguard: {offender['message']}"
            else:
                said = NONE_SEEN
            line = f"the capture begun at {began} failed at capture_end ({error}); {said}"
            warn_once(f"inspect:broke:{id(capture)}", line)
            add_note = getattr(error, "add_note", None)  # Python 3.11 and later
            if add_note is not None:
                add_note(f"cgguard: {said}")
        except Exception as exc:
            warn_once("inspect:broke", f"internal error while explaining a capture: {exc!r}")


def _torch_tracks(args: tuple[Any, ...], kwargs: Any) -> bool:
    """Whether the caller passed torch's own check_input_liveness (torch 2.13 and later): its
    tracker reports dead inputs at replay, and cgguard leaves them to it, not to tell twice."""
    # capture_begin(pool=None, capture_error_mode="global", check_input_liveness=False)
    if isinstance(kwargs, dict) and "check_input_liveness" in kwargs:
        return bool(kwargs["check_input_liveness"])
    return len(args) > 2 and bool(args[2])


def _broken(error: BaseException) -> bool:
    text = str(error)
    return any(words in text for words in _BROKEN)


def _in_pool(graph: Any, item: _liveness.Input, how: str, allocator: bool) -> bool:
    """Whether a freed input's memory was the graph's own: an allocation its capture made
    below the dispatcher (inside compiled code, say), which the pool keeps for replays.

    Asked of the caching allocator on CUDA only, on the slow path; a block found is forgotten.
    """
    if how != "freed" or not allocator:
        return False
    try:
        import torch

        pool = tuple(graph.pool())
        for segment in torch.cuda.memory_snapshot():  # type: ignore[no-untyped-call]
            start = segment["address"]
            if (
                tuple(segment.get("segment_pool_id", ())) == pool
                and start <= item.address < start + segment["total_size"]
            ):
                item.inputs.forget(item)
                return True
    except Exception:
        return False
    return False
