"""Inspection: each capture watched op by op, from its capture_begin to its capture_end, and each
replay of a graph it made checked for inputs that died.

A ``TorchDispatchMode`` is put on the capturing thread's dispatch-mode stack just before torch's
capture_begin and taken off once its capture_end has returned (or failed): it sees every aten op
the capture's Python code dispatches, as torch's own ``check_input_liveness`` tracker does
(torch/utils/_cuda_debug.py). A dispatch mode is thread-local, so another thread's ops are not
seen; its Python-level synchronizes stay covered by sync_during_capture.

The mode goes at the bottom of the stack, below the program's own modes, and never through
``TorchDispatchMode.__enter__``/``__exit__``: torch's ``__exit__`` pops whatever mode is on top,
and each mode's ``__enter__`` saves and ``__exit__`` restores torch's process-wide "in a mode"
flags in stack order. Kept out of both, the program's modes push, pop and flag exactly as they
would without cgguard, however they nest around the capture. A capture ended on another thread
(a relaxed capture may be) leaves its mode silent on the capturing thread until that thread's
next RNG call or capture_begin takes it off: a thread's mode stack is its own.

- implicit_sync: an op of cgguard._inspect.sync_ops's table on a device tensor is reported before it
  runs, and refused in raise mode, so the capture is not invalidated.
- rng_during_capture: torch.cuda's seeding and RNG-state functions, wrapped while inspection
  is on, are reported before torch refuses them, and only where torch refuses them (see
  ``rng_refused``).
- dead_input: the capture's external inputs are held by weak references (cgguard._inspect.liveness);
  a replay of a graph whose input was freed or moved is reported, and refused in raise mode.
- a capture_end that fails because the capture was invalidated is told the first offending
  call reported since that capture began, or that cgguard saw none.

The mode says ``ignore_compile_internals()``: torch 2.13's dynamo runs a compiled function
eagerly while any other dispatch mode is on the stack (torch/_dynamo/convert_frame.py,
``any_torch_dispatch_mode_on_stack``), which would change what is captured. Compiled code
stays compiled, and the mode does not see the ops inside it (docs/inspection.md).
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import TYPE_CHECKING, Any, cast

from cgguard._core.probes import NO_TORCH
from cgguard._core.watcher import GRAPH_NOTES, Watcher
from cgguard._errors import hidden_by_pytest
from cgguard._inspect import liveness as _liveness
from cgguard._inspect.sync_ops import SYNC_OPS, syncs
from cgguard._rules.record import BEGAN_AT, ENDED, FAILED, MODE, THREAD
from cgguard._support.frames import Stack, resolve, site_of, stack_above
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from cgguard._core.installation import Installation
    from cgguard._core.probes import Probes
    from cgguard._data.schema import ViolationEvent
    from cgguard._errors import CaptureViolation
    from cgguard._inspect.sync_ops import SyncOp
    from cgguard._rules.record import Record
    from cgguard._support.frames import Snapshot

# The traceback of a refused op ends at the user's line (cgguard._errors.hidden_by_pytest).
__tracebackhide__ = hidden_by_pytest

# Where a graph captured under inspection keeps its external inputs
# (cgguard._inspect.liveness.Inputs): on the graph itself, so they go with it, and a replay
# finds them in one look-up.
_INPUTS = GRAPH_NOTES

# torch.cuda's functions that seed the CUDA generator or read or set its state, each judged by
# rng_refused. torch.manual_seed and torch.seed reach manual_seed_all and seed_all through
# torch.cuda's attributes, looked up at each call (torch/random.py).
RNG_FUNCTIONS = (
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "get_rng_state",
    "get_rng_state_all",
    "set_rng_state",
    "set_rng_state_all",
)

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


class Inspections:
    """The inspected captures of the process, across reconfigurations: each thread's own,
    innermost last, and those open on any thread.

    While any is open, one listener among the process's ``listeners`` notes the first violation
    let through on a thread during its inspected capture, for a capture_end that fails.
    """

    def __init__(self, listeners: list[Callable[[ViolationEvent], None]]) -> None:
        self.listeners = listeners
        self.local = threading.local()  # .watches: this thread's inspected captures
        self.open: list[Watch] = []  # on any thread
        self.lock = threading.Lock()

    def watches(self) -> list[Watch]:
        """This thread's inspected captures, innermost last."""
        watches: list[Watch] | None = getattr(self.local, "watches", None)
        if watches is None:
            watches = self.local.watches = []
        return watches

    def forget_closed(self) -> None:
        """Take off this thread's stack the modes of its captures that another thread ended."""
        watches = getattr(self.local, "watches", None)
        if watches:
            for watch in [w for w in watches if w.closed]:
                watch.take_off()

    def judging(self) -> Watch | None:
        """This thread's innermost inspected capture that is still judged, if any."""
        watches: list[Watch] | None = getattr(self.local, "watches", None)
        if not watches:
            return None
        self.forget_closed()
        for watch in reversed(watches):
            if watch.on:
                return watch
        return None

    def listen(self, watch: Watch, *, opened: bool) -> None:
        """``watch`` opened or closed: the listener is subscribed while any is open (one for
        the process, called on the violating thread)."""
        with self.lock:
            if opened:
                self.open.append(watch)
            elif watch in self.open:
                self.open.remove(watch)
            listening = self.offended in self.listeners
            if self.open and not listening:
                self.listeners.append(self.offended)
            elif not self.open and listening:
                self.listeners.remove(self.offended)

    def offended(self, event: ViolationEvent) -> None:
        """The listener: a violation let through during this thread's inspected capture."""
        watches = getattr(self.local, "watches", None)
        if not watches or event.get("action") != "logged":
            return
        for watch in watches:
            if watch.on and watch.offender is None and _thread_of(watch) == event.get("thread_id"):
                watch.offender = event

    def retire(self, inspector: Inspector) -> None:
        """``inspector`` was replaced: its captures still under way stop judging at once."""
        with self.lock:
            watches = list(self.open)
        for watch in watches:
            if watch.inspector is inspector:
                watch.on = False

    def after_fork(self) -> None:
        """A forked child: the forking thread's captures' modes come off its stack, and the
        captures of the threads it lacks are not its own."""
        for watch in list(self.watches()):
            watch.on = False
            watch.take_off()
        self.local = threading.local()
        # Another thread may have held the lock at the fork.
        self.lock = threading.Lock()
        self.open.clear()
        if self.offended in self.listeners:
            self.listeners.remove(self.offended)


def _thread_of(watch: Watch) -> int | None:
    return watch.record[THREAD].ident


class Watch:
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
        self.mode = _mode_type()(self)
        _push_below(self.mode)
        self.pushed = True
        inspections.watches().append(self)
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
        """Take the mode off this thread's stack and the watch off its list (its own thread)."""
        watches = self.inspector.inspections.watches()
        if self in watches:
            watches.remove(self)
        if self.pushed:
            self.pushed = False
            _remove_mode(self.mode)

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


@functools.cache
def _mode_type() -> type:
    """The dispatch mode's class, made once torch is imported (cgguard never imports it)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    tensor = torch.Tensor
    # torch.tensor(...) inside the capture: its value is made below the dispatcher, then lifted.
    lift_fresh = torch.ops.aten.lift_fresh.default
    unknown = object()
    # Each op's table entry, found once per OpOverload: then one dictionary look-up per op.
    known: dict[Any, SyncOp | None] = {}

    class InspectionMode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's
        """Forwards every op; tells its capture's Watch before and after."""

        supports_higher_order_operators = True

        def __init__(self, watch: Watch) -> None:
            super().__init__()  # type: ignore[no-untyped-call]  # torch's own, untyped
            self.watch = watch

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # Compiled code runs compiled under this mode (torch 2.13 and later; earlier
            # releases never ask): see the module's docstring.
            return True

        def __torch_dispatch__(  # noqa: PLR0912 - the hot path, inlined on purpose
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            # The hot path of every op inside an inspected capture: inlined, no calls but
            # torch's, one look-up per op and per tensor already seen.
            watch = self.watch
            if kwargs is None:
                kwargs = {}
            if not watch.on:
                return func(*args, **kwargs)
            op = known.get(func, unknown)
            if op is not None:
                if op is unknown:
                    op = known[func] = _entry(func)
                if op is not None:
                    watch.synchronizing(op, func, args, kwargs)  # type: ignore[arg-type]
            inputs = watch.inputs
            if inputs is None:
                return func(*args, **kwargs)
            every, seen = watch.every_tensor, inputs.seen
            if func is lift_fresh:
                # A tensor the capture made (torch.tensor(2.0)): its own, not an input.
                out = func(*args, **kwargs)
                for value in (*args, out):
                    if isinstance(value, tensor):
                        try:
                            inputs.made(value.untyped_storage().data_ptr())
                        except Exception:  # noqa: S112 - no storage of its own: nothing to hold
                            continue
                return out
            # out= tensors are read as inputs too: the graph writes where they live.
            scanned = (*args, *kwargs.values()) if kwargs else args
            try:
                for arg in scanned:
                    # A tensor, or a list or tuple of them (torch.cat's): one level deep.
                    for item in arg if type(arg) is list or type(arg) is tuple else (arg,):
                        if isinstance(item, tensor) and (every or item.is_cuda):
                            try:
                                storage = item.untyped_storage()
                            except Exception:  # noqa: S112 - sparse: no storage to hold
                                continue
                            address = storage.data_ptr()
                            if address and address not in seen:
                                inputs.read(storage, address, item)
            except Exception as exc:
                warn_once("inspect:read", f"internal error while inspecting an op: {exc!r}")
            out = func(*args, **kwargs)
            try:
                for value in out if type(out) is tuple or type(out) is list else (out,):
                    if isinstance(value, tensor) and (every or value.is_cuda):
                        try:
                            address = value.untyped_storage().data_ptr()
                        except Exception:  # noqa: S112 - sparse: no storage to hold
                            continue
                        if address and address not in seen:
                            seen[address] = None  # the capture's own allocation
            except Exception as exc:
                warn_once("inspect:made", f"internal error while inspecting an op: {exc!r}")
            return out

    return InspectionMode


def _entry(func: Any) -> SyncOp | None:
    try:
        return SYNC_OPS.get(str(func._schema.name))
    except Exception:
        return None


def _push_below(mode: Any) -> None:
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


def _remove_mode(mode: Any) -> None:
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

    # The capture path's calls (cgguard._core.watcher).

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        # What an earlier capture into this graph read is gone already
        # (cgguard._core.watcher.forget_graph, at every capture_begin, inspected or not).
        if self.first is not None and not self._counts(record):
            return None
        watch = Watch(self, graph, record, live=not _torch_tracks(args, kwargs))
        watch.enter()
        return watch

    def closed(self, token: Any, outcome: str, error: BaseException | None) -> None:
        if not isinstance(token, Watch):
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
        elif outcome == FAILED and error is not None and _broken(error):
            self._what_broke(token, error)

    def replaying(self, graph: Any) -> None:
        inputs = graph.__dict__.get(_INPUTS)
        if inputs is None or inputs.healthy:  # the one test a healthy graph's replay costs
            return
        self._check_replay(graph, inputs)

    def retired(self) -> None:
        # A reconfiguration took inspection off (or made a new inspector): this one's captures
        # still under way stop judging at once, as its RNG hooks have come off. Their modes
        # come off at their capture_end, as ever.
        self.inspections.retire(self)

    def hooks(self) -> list[tuple[Any, str, Callable[[Any], Any]]]:
        """torch.cuda's RNG functions, wrapped while inspection is on."""
        owners = [sys.modules.get("torch.cuda"), sys.modules.get("torch.cuda.random")]
        return [
            (owner, name, functools.partial(self._rng_hook, name))
            for owner in owners
            if owner is not None
            for name in RNG_FUNCTIONS
            if callable(vars(owner).get(name))
        ]

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
    ) -> CaptureViolation | None:
        # Clamped: a script's top level, or a thread of torch's own, may be shallower.
        stack = stack_above(depth)
        reporter = self.installation.reporter  # read once: a reconfiguration swaps it whole
        return reporter.violated([(rule, record)], api, stack, refuse=True, why=why, more=more)

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
            if getattr(inspections.local, "watches", None):  # nothing inspected here: one test
                error = None
                try:
                    watch = inspections.judging()
                    if watch is not None and rng_refused(name, args, kwargs):
                        error = watch.inspector.violated(
                            "rng_during_capture", watch.record, api, depth=2
                        )
                except Exception as exc:
                    warn_once("inspect:rng", f"internal error while inspecting a call: {exc!r}")
                if error is not None:
                    raise error
            return original(*args, **kwargs)

        return rng

    def _check_replay(self, graph: Any, inputs: _liveness.Inputs) -> None:
        """Report each dead input; refuse the replay at the first where the rule raises. One
        that is only logged is reported once and forgotten: the graph is healthy again, and
        its later replays cost the one test, not a walk and a report each."""
        error = None
        try:
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
                    "dead_input", inputs.record, "CUDAGraph.replay", why=why, more=more
                )
                if error is not None:
                    break
                inputs.forget(item)
            else:
                inputs.healthy = True
        except Exception as exc:
            warn_once("inspect:replay", f"internal error while checking a replay: {exc!r}")
            return
        if error is not None:
            raise error

    def _what_broke(self, watch: Watch, error: BaseException) -> None:
        """Say which call broke the capture whose capture_end failed with ``error``."""
        try:
            began = Stack(watch.record[BEGAN_AT]).where
            offender = watch.offender
            if offender is not None:
                said = f"first offending call seen by cgguard: {offender['message']}"
            else:
                said = NONE_SEEN
            line = f"the capture begun at {began} failed at capture_end ({error}); {said}"
            warn_once(f"inspect:broke:{id(watch)}", line)
            add_note = getattr(error, "add_note", None)  # Python 3.11 and later
            if add_note is not None:
                add_note(f"cgguard: {said}")
        except Exception as exc:
            warn_once("inspect:broke", f"internal error while explaining a capture: {exc!r}")


# What torch's CUDAGeneratorImpl refuses during a capture
# (aten/src/ATen/cuda/CUDAGeneratorImpl.cpp):
# - seed() (torch.cuda.seed, seed_all): assertNotCapturing("Cannot call CUDAGeneratorImpl::seed"),
#   in every release.
# - Before torch 2.10, everything else too: set_current_seed (manual_seed, and set_state through
#   it) and current_seed (which get_state reads) each call assertNotCapturing.
# - From torch 2.10 (pytorch/pytorch#162505, "Make torch.cuda.rng_set_state() and
#   torch.cuda.rng_get_state() work during stream capture"), current_seed() checks nothing, so
#   get_state (get_rng_state) is allowed; set_current_seed, during a capture, only
#   TORCH_CHECKs that the seed is unchanged ("can be called during stream capture only if new
#   seed is the same as the original seed"), a no-op; set_philox_offset_per_thread stores the
#   offset into the capture's own state. So manual_seed and set_rng_state are refused only
#   when they change the seed: torch.utils.checkpoint(preserve_rng_state=True) inside a graph
#   rewinds the offset with get/set_rng_state and is allowed.
# The release is inferred from the pull request's merge date (September 2025), not read from a
# tagged release's source: a GPU run of the probe's RNG scenarios on each release settles it.
_RNG_IN_CAPTURE_SINCE = (2, 10)


def rng_refused(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether torch refuses ``torch.cuda.<name>(*args, **kwargs)`` during a capture."""
    if name in ("seed", "seed_all"):
        return True
    if _torch_version() < _RNG_IN_CAPTURE_SINCE:
        return True
    if name in ("get_rng_state", "get_rng_state_all"):
        return False
    try:
        return any(seed != current_seed(index) for index, seed in _seeds_set(name, args, kwargs))
    except Exception:
        return True  # not known (no CUDA generator to read): reported, as torch may refuse it


def _seeds_set(
    name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[tuple[int, int]]:
    """The (device index, seed) pairs a manual_seed or set_rng_state call would set."""
    torch = sys.modules["torch"]
    count = torch.cuda.device_count()
    if name in ("manual_seed", "manual_seed_all"):
        seed = int(args[0] if args else kwargs["seed"]) & 0xFFFF_FFFF_FFFF_FFFF
        if name == "manual_seed":
            return [(torch.cuda.current_device(), seed)]
        # No device counted (a runtime standing in for CUDA's): device 0's, whose seed is then
        # not known.
        return [(index, seed) for index in range(count or 1)]
    if name == "set_rng_state":
        state = args[0] if args else kwargs["new_state"]
        device = args[1] if len(args) > 1 else kwargs.get("device", "cuda")
        if isinstance(device, int):
            index: int | None = device
        else:
            index = torch.device(device).index
        if index is None:
            index = torch.cuda.current_device()
        return [(index, _seed_in(state))]
    # set_rng_state_all(new_states)
    states = args[0] if args else kwargs["new_states"]
    return [(index, _seed_in(state)) for index, state in enumerate(states)]


def _seed_in(state: Any) -> int:
    """The seed a CUDA RNG state holds: its first 8 bytes (CUDAGeneratorImpl::set_state)."""
    return int.from_bytes(state.numpy().tobytes()[:8], sys.byteorder)


def current_seed(index: int) -> int:
    """The seed of device ``index``'s default CUDA generator (allowed during a capture from
    torch 2.10)."""
    torch = sys.modules["torch"]
    return int(torch.cuda.default_generators[index].initial_seed())


def _torch_version() -> tuple[int, int]:
    version = str(getattr(sys.modules.get("torch"), "__version__", "0.0"))
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c in "0123456789") or 0)


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
