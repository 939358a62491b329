"""A simulated CUDA runtime, so torch's own CUDA-graph code runs (and is tested) without a GPU."""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import threading
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

from cgguard._errors import CgguardError
from cgguard._support.patchset import PatchSet

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator
    from types import ModuleType

    from cgguard._core.probes import Device

_SUFFIX = " [simulated CUDA]"
_MODES = ("global", "thread_local", "relaxed")
# CUDA's own error strings (cudaGetErrorString), as torch's AT_CUDA_CHECK words them.
_PROHIBITED = "CUDA error: operation not permitted when stream is capturing"
_CAPTURED_EVENT = (
    "CUDA error: operation not permitted on an event last recorded in a capturing stream"
)
_INVALIDATED = "CUDA error: operation failed due to a previous error during capture"
# cudaErrorStreamCaptureWrongThread, in the words of its documentation (CUDA runtime API,
# cudaStreamEndCapture: a capture not begun in relaxed mode must end on the thread that began
# it); the runtime's own string is what the fidelity probe compares on a GPU.
_WRONG_THREAD = (
    "CUDA error: a stream capture sequence not initiated with the cudaStreamCaptureModeRelaxed "
    "argument to cudaStreamBeginCapture was passed to cudaStreamEndCapture in a different thread"
)
# aten/src/ATen/cuda/CUDAGraph.cpp, CUDAGraph::capture_end: TORCH_WARN when the graph has no node.
_EMPTY = (
    "The CUDA Graph is empty. This usually means that the graph was attempted to be captured "
    "on wrong device or stream."
)
_CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA, what torch reports as Stream.device_type
# The calls a simulation that lasts the whole process keeps (CGGUARD_SIMULATE_CUDA, pytest's
# --cgguard-simulate-cuda): a soak test replays for as long as it runs, at about 120 bytes a call.
SESSION_MAX_CALLS = 10_000


class SimulationError(CgguardError):
    """simulated_cuda() cannot do what was asked (already active, real CUDA, session over)."""


class SimulatedCudaError(RuntimeError):
    """What the simulated CUDA runtime raises where real CUDA or torch would raise.

    A failed TORCH_CHECK in torch's C++ is a plain ``RuntimeError`` on every release; a CUDA
    error (torch's AT_CUDA_CHECK) is ``torch.AcceleratorError`` where the installed torch has
    that type, and the simulation raises a subclass of both for those.
    """


_CUDA_ERROR: list[type[SimulatedCudaError]] = []


def _cuda_error_type() -> type[SimulatedCudaError]:
    # Built once torch is imported: torch.AcceleratorError (a RuntimeError) exists only in
    # recent releases, and older ones raise a plain RuntimeError for CUDA errors.
    if not _CUDA_ERROR:
        import torch

        accelerator_error = getattr(torch, "AcceleratorError", None)
        if isinstance(accelerator_error, type) and issubclass(accelerator_error, RuntimeError):
            _CUDA_ERROR.append(
                type(
                    "SimulatedAcceleratorError",
                    (SimulatedCudaError, accelerator_error),
                    {"__module__": __name__, "__doc__": "A CUDA error, simulated."},
                )
            )
        else:
            _CUDA_ERROR.append(SimulatedCudaError)
    return _CUDA_ERROR[0]


class Call(NamedTuple):
    """One call the simulated runtime received, in order: a name, its arguments, the thread name.

    Names and arguments: ``synchronize ()``, ``host_empty_cache ()``, ``set_stream (stream_id,)``,
    ``stream_synchronize (stream_id,)``, ``event_record (event_id, stream_id)``,
    ``event_wait (event_id, stream_id)``, ``event_synchronize (event_id,)``,
    ``capture_begin (graph_id, stream_id, mode)``, ``capture_invalidated (graph_id,)``,
    ``capture_end (graph_id, ok)``, ``replay (graph_id,)``, ``reset (graph_id,)``,
    ``instantiate (graph_id,)``, ``enable_debug_mode (graph_id,)``,
    ``debug_dump (graph_id, path)``, ``stream_query (stream_id,)``, ``event_query (event_id,)``,
    ``launch (stream_id,)``, ``implicit_sync (op,)``. Calls that then fail are recorded too.
    What torch answers without calling CUDA is not: the synchronize or query of an event never
    recorded, whether the current stream is capturing.
    """

    name: str
    args: tuple[object, ...]
    thread: str


class ActiveCapture(NamedTuple):
    """A capture under way: which graph, on which stream, in which mode, begun by which thread."""

    graph_id: int
    stream_id: int
    mode: str
    thread: int
    invalidated: bool


def _error(message: str) -> SimulatedCudaError:
    """torch's own check failed (TORCH_CHECK): a RuntimeError."""
    return SimulatedCudaError(message + _SUFFIX)


def _cuda_error(message: str) -> SimulatedCudaError:
    """CUDA returned an error (AT_CUDA_CHECK): torch.AcceleratorError where torch has it."""
    return _cuda_error_type()(message + _SUFFIX)


class SimulatedCuda:
    """cgguard's simulated CUDA runtime: one fake device, no GPU work, a record of every call.

    Stream 0 is the default stream and each thread starts on it. Captures follow CUDA's
    capture-mode rules for unsafe calls, so code that passes here is not lax on a real GPU.
    docs/cuda-behaviour.md lists which of these rules are CUDA's documented behaviour and which
    are the simulation's pick where the evidence conflicts.

    CPU tensors never reach the simulation, so it sees no kernels: the only work a capture
    holds here is its events' records and waits and what ``launch()`` adds. Set
    ``warn_empty_captures`` where a program launches its simulated work that way, and a capture
    that holds none warns as torch warns of an empty graph.

    ``max_calls``: the latest calls kept, all of them where None.
    """

    def __init__(self, max_calls: int | None = None) -> None:
        self._lock = threading.Lock()
        self._calls: collections.deque[Call] = collections.deque(maxlen=max_calls)
        self._captures: dict[int, ActiveCapture] = {}
        self._nodes: dict[int, int] = {}  # work captured so far, by graph id
        # Each capture under way numbered, by graph id: an event or a joined stream belongs to
        # one capture, not to a graph that may capture again.
        self._serials: dict[int, int] = {}
        # Streams that joined a capture by waiting on an event recorded into it (a fork), as
        # CUDA's cross-stream capture does: stream id -> (graph id, capture number).
        self._joined: dict[int, tuple[int, int]] = {}
        self._counters: dict[str, itertools.count[int]] = {}
        self._local = threading.local()
        self.warn_empty_captures = False

    def __repr__(self) -> str:
        with self._lock:
            return (
                f"<cgguard simulated CUDA runtime (no GPU): {len(self._calls)} calls, "
                f"{len(self._captures)} active captures>"
            )

    @property
    def calls(self) -> list[Call]:
        """A copy of the calls received so far, oldest first: the latest ``max_calls`` of them
        where the runtime keeps no more."""
        with self._lock:
            return list(self._calls)

    def active_captures(self) -> list[ActiveCapture]:
        """The captures under way now, invalidated ones included until their capture_end."""
        with self._lock:
            return list(self._captures.values())

    def discard_captures(self, graph_ids: Collection[int]) -> list[ActiveCapture]:
        """Drop the captures into these graphs as though they had never begun; return them.

        For a test runner, so that the next test starts with no capture open: no CUDA call is
        simulated (none could end a capture on another thread), and none is recorded. The
        calling thread goes back to the default stream if it was on one of their streams.
        """
        with self._lock:
            dropped = [c for c in self._captures.values() if c.graph_id in graph_ids]
            for capture in dropped:
                self._drop_capture_locked(capture.graph_id)
        if self._current_stream_id() in {c.stream_id for c in dropped}:
            self._local.stream_id = 0
        return dropped

    # Everything below is called by the stand-ins; callers of "_locked" helpers hold the lock.

    def _note_locked(self, name: str, *args: object) -> None:
        self._calls.append(Call(name, args, threading.current_thread().name))

    def _note(self, name: str, *args: object) -> None:
        with self._lock:
            self._note_locked(name, *args)

    def device(self) -> Device:
        """What this runtime says where torch cannot, for cgguard's inspection: CPU tensors
        stand for device tensors, an implicit synchronize let through fails the capture as
        CUDA fails it, and torch's caching allocator knows none of its memory."""
        # Imported here: importing cgguard.testing (pytest's plugin does, in every run) loads
        # none of cgguard's capture path.
        from cgguard._core.probes import Device
        from cgguard._inspect.sync_ops import any_tensor

        return Device(
            on_device=any_tensor, every_tensor=True, waited=self.implicit_sync, allocator=False
        )

    def implicit_sync(self, op: str) -> None:
        """An op that waits for the device (cgguard._inspect.sync_ops) on a tensor that stands for a
        device tensor, let through during a capture: fail it, as CUDA fails it.

        On CUDA such an op ends in cudaStreamSynchronize on the current stream (or a
        synchronous cudaMemcpy), which a capture prohibits: a global or thread_local capture of
        this thread, any thread's global capture, and a capture on this very stream in every
        mode (CUDA runtime API, cudaStreamCaptureMode). The CPU op the simulation runs instead
        would succeed, so the inspection tells the simulation before it runs.
        """
        stream_id = self._current_stream_id()
        with _live(self)._lock:
            self._note_locked("implicit_sync", op)
            self._forbid_unsafe_locked(also=self._capture_on_locked(stream_id))

    def launch(self, stream: Any = None) -> None:
        """A kernel launched on ``stream`` (the current stream by default): captured if it
        captures, as one node of its graph."""
        stream_id = self._current_stream_id() if stream is None else int(stream.stream_id)
        with _live(self)._lock:
            self._note_locked("launch", stream_id)
            self._add_node_locked(stream_id)

    def _new_id(self, kind: str) -> int:
        with self._lock:
            return self._next_id_locked(kind)

    def _next_id_locked(self, kind: str) -> int:
        # One sequence per kind, so the ids in calls read graph 1, stream 1, event 1.
        return next(self._counters.setdefault(kind, itertools.count(1)))

    def _add_node_locked(self, stream_id: int) -> ActiveCapture | None:
        capture = self._capture_on_locked(stream_id)
        if capture is not None:
            self._nodes[capture.graph_id] = self._nodes.get(capture.graph_id, 0) + 1
        return capture

    def _current_stream_id(self) -> int:
        stream_id: int = getattr(self._local, "stream_id", 0)
        return stream_id

    def _set_stream(self, stream_id: int) -> None:
        self._note("set_stream", stream_id)
        self._local.stream_id = stream_id

    def _forbid_unsafe_locked(self, also: ActiveCapture | None = None) -> None:
        # CUDA's cudaStreamCaptureMode: an unsafe call fails, and poisons the capture(s) that
        # forbade it, if its own thread captures in global/thread_local mode or any other
        # thread captures in global mode.
        me = threading.get_ident()
        culprits = [
            c
            for c in self._captures.values()
            if (c.thread == me and c.mode != "relaxed") or (c.thread != me and c.mode == "global")
        ]
        if also is not None and also not in culprits:
            culprits.append(also)
        if culprits:
            for capture in culprits:
                self._captures[capture.graph_id] = capture._replace(invalidated=True)
                self._note_locked("capture_invalidated", capture.graph_id)
            raise _cuda_error(_PROHIBITED)

    def _forbid_captured_event_locked(self, event: _EventBackend) -> None:
        # cudaErrorCapturedEvent, in every capture mode (CUDA runtime API, cudaStreamCaptureMode:
        # even relaxed capture prohibits "cudaEventQuery on an event that was last recorded
        # inside a stream capture"). Whether it also invalidates a relaxed capture is not
        # documented: here it does not (docs/cuda-behaviour.md).
        if self._live_capture_locked(event._simcuda_captured_in) is not None:
            raise _cuda_error(_CAPTURED_EVENT)

    def _live_capture_locked(self, which: tuple[int, int] | None) -> ActiveCapture | None:
        """The capture numbered ``which`` (graph id, capture number), if still under way."""
        if which is None or self._serials.get(which[0]) != which[1]:
            return None
        return self._captures.get(which[0])

    def _capture_on_locked(self, stream_id: int) -> ActiveCapture | None:
        began_on = next((c for c in self._captures.values() if c.stream_id == stream_id), None)
        return began_on or self._live_capture_locked(self._joined.get(stream_id))

    def _synchronize(self) -> None:
        with self._lock:
            self._note_locked("synchronize")
            self._forbid_unsafe_locked()

    def _stream_synchronize(self, stream_id: int) -> None:
        with self._lock:
            self._note_locked("stream_synchronize", stream_id)
            self._forbid_unsafe_locked(also=self._capture_on_locked(stream_id))

    def _event_synchronize(self, event: _EventBackend) -> None:
        # torch's CUDAEvent::synchronize calls cudaEventSynchronize only once the event exists,
        # and it is created at its first record(): before that it is no CUDA call at all.
        if event._simcuda_recorded_on is None:
            return
        with self._lock:
            self._note_locked("event_synchronize", event._simcuda_id)
            self._forbid_unsafe_locked()
            self._forbid_captured_event_locked(event)

    def _event_query(self, event: _EventBackend) -> bool:
        # CUDAEvent::query answers true without CUDA before the event's first record().
        # cudaEventQuery is an unsafe call during capture: in global mode a query on another
        # thread invalidates the capture (pytorch PR 104555, the NCCL watchdog's queries).
        if event._simcuda_recorded_on is None:
            return True
        with self._lock:
            self._note_locked("event_query", event._simcuda_id)
            self._forbid_unsafe_locked()
            self._forbid_captured_event_locked(event)
        return True

    def _event_record(self, event: _EventBackend, stream_id: int) -> None:
        with self._lock:
            self._note_locked("event_record", event._simcuda_id, stream_id)
            capture = self._add_node_locked(stream_id)
            event._simcuda_recorded_on = stream_id
            event._simcuda_captured_in = (
                None if capture is None else (capture.graph_id, self._serials[capture.graph_id])
            )

    def _event_wait(self, event: _EventBackend, stream_id: int) -> None:
        with self._lock:
            self._note_locked("event_wait", event._simcuda_id, stream_id)
            # A stream that waits on an event recorded into a capture joins that capture (CUDA
            # programming guide, "Cross-stream Dependencies and Events"): torch.cuda.graph's
            # side streams fork this way, through Stream.wait_stream.
            which = event._simcuda_captured_in
            if (
                which is not None
                and self._capture_on_locked(stream_id) is None
                and self._live_capture_locked(which) is not None
            ):
                self._joined[stream_id] = which
            self._add_node_locked(stream_id)

    def _stream_query(self, stream_id: int) -> bool:
        # Querying the capturing stream itself is invalid in every mode, as synchronizing it is.
        with self._lock:
            self._note_locked("stream_query", stream_id)
            self._forbid_unsafe_locked(also=self._capture_on_locked(stream_id))
        return True

    def _is_capturing(self) -> bool:
        with self._lock:
            return self._capture_on_locked(self._current_stream_id()) is not None

    def _capture_begin(self, graph: _GraphBackend, pool: object, mode: object) -> None:
        stream_id = self._current_stream_id()
        with self._lock:
            self._note_locked("capture_begin", graph._simcuda_id, stream_id, mode)
            # The order of these checks is the order torch makes them (the mode is parsed first,
            # in the Python binding, before CUDAGraph::capture_begin runs).
            if mode not in _MODES:
                raise _error(
                    "Unknown capture error mode. Expected `global`, `thread_local`, or "
                    f"`relaxed`, got {mode}"
                )
            # CUDAGraph::capture_begin: TORCH_CHECK(!has_graph_exec_, ...). A keep_graph=True
            # graph has none until instantiate() or replay(), so it may be captured again.
            if graph._simcuda_exec:
                raise _error(
                    "This CUDAGraph instance already owns a captured graph. "
                    "To capture a new graph, create a new instance."
                )
            if stream_id == 0:
                raise _error(
                    "CUDA graphs must be captured on a non-default stream. "
                    "(However, after capture, it's ok to replay them on the default stream.)"
                )
            busy = self._capture_on_locked(stream_id)
            if busy is not None:
                self._forbid_unsafe_locked(also=busy)
            if graph._simcuda_id in self._captures:
                # torch would begin a second capture into the graph on this other stream and
                # lose track of the first; the simulation keeps one capture per graph.
                raise SimulationError(
                    "the simulation cannot begin a second capture into a graph whose capture "
                    "is under way" + _SUFFIX
                )
            # A shared pool as given; else a private one, numbered in the first half as
            # torch numbers them (graph_pool_handle() numbers the second).
            graph._simcuda_pool = pool if pool is not None else (self._next_id_locked("pool"), 0)
            self._captures[graph._simcuda_id] = ActiveCapture(
                graph._simcuda_id, stream_id, str(mode), threading.get_ident(), False
            )
            self._nodes[graph._simcuda_id] = 0
            self._serials[graph._simcuda_id] = self._next_id_locked("capture")

    def _capture_end(self, graph: _GraphBackend) -> None:
        graph_id = graph._simcuda_id
        with self._lock:
            capture = self._captures.get(graph_id)
            if capture is None:
                self._note_locked("capture_end", graph_id, False)
                raise _error("Called CUDAGraph::capture_end on a graph that is not capturing.")
            if capture.stream_id != self._current_stream_id():
                self._note_locked("capture_end", graph_id, False)
                raise _error("Capture must end on the same stream it began on.")
            if capture.mode != "relaxed" and capture.thread != threading.get_ident():
                self._note_locked("capture_end", graph_id, False)
                raise _cuda_error(_WRONG_THREAD)  # and the capture goes on
            nodes = self._drop_capture_locked(graph_id)
            self._note_locked("capture_end", graph_id, not capture.invalidated)
            if capture.invalidated:
                raise _cuda_error(_INVALIDATED)
            graph._simcuda_captured = True
            # keep_graph=False: capture_end instantiates; keep_graph=True: instantiate() or the
            # first replay() does.
            graph._simcuda_exec = not graph.keep_graph
        if nodes == 0 and self.warn_empty_captures:
            warnings.warn(_EMPTY + _SUFFIX, UserWarning, stacklevel=3)

    def _drop_capture_locked(self, graph_id: int) -> int:
        """Forget the capture into ``graph_id`` and the streams that joined it; its node count."""
        del self._captures[graph_id]
        nodes = self._nodes.pop(graph_id, 0)
        serial = self._serials.pop(graph_id, None)
        # The forked streams leave with it. A fork never joined back makes CUDA fail
        # cudaStreamEndCapture (cudaErrorStreamCaptureUnjoined); that is not simulated.
        for stream_id in [k for k, v in self._joined.items() if v == (graph_id, serial)]:
            del self._joined[stream_id]
        return nodes

    def _instantiate(self, graph: _GraphBackend) -> None:
        with self._lock:
            self._note_locked("instantiate", graph._simcuda_id)
            if not graph._simcuda_captured:
                raise _error("capture_end() must have been called before calling instantiate")
            if graph._simcuda_exec and not graph.keep_graph:
                raise _error(
                    "instantiate() is intended to be called by the user only when keep_graph=true"
                )
            graph._simcuda_exec = True

    def _replay(self, graph: _GraphBackend) -> None:
        with self._lock:
            self._note_locked("replay", graph._simcuda_id)
            if not graph._simcuda_captured:
                raise _error("Called CUDAGraph::replay without a preceding successful capture.")
            graph._simcuda_exec = True

    def _pool(self, graph: _GraphBackend) -> object:
        with self._lock:
            if not graph._simcuda_captured:
                raise _error("Called CUDAGraph::pool() without a preceding successful capture.")
            return graph._simcuda_pool


_ACTIVE: SimulatedCuda | None = None
_ACTIVATION_LOCK = threading.Lock()


def _new_locks_in_child() -> None:
    # A forked child has only the forking thread: a lock another thread held at the fork (one
    # inside a simulated call, say) would stay held, and the child's first call would hang.
    global _ACTIVATION_LOCK
    _ACTIVATION_LOCK = threading.Lock()
    if _ACTIVE is not None:
        _ACTIVE._lock = threading.Lock()


os.register_at_fork(after_in_child=_new_locks_in_child)


def _active() -> SimulatedCuda:
    if _ACTIVE is None:
        raise SimulationError("the simulated CUDA runtime is not active" + _SUFFIX)
    return _ACTIVE


def _live(sim: SimulatedCuda) -> SimulatedCuda:
    if sim is not _ACTIVE:
        raise SimulationError(
            "this object belongs to a simulated_cuda() session that has ended" + _SUFFIX
        )
    return sim


class _GraphBackend:
    """The C++ half of torch.cuda.CUDAGraph, simulated; the real class's super() calls land here."""

    _simcuda: SimulatedCuda
    _simcuda_id: int
    _simcuda_captured: bool  # capture_ended_ in torch's CUDAGraph
    _simcuda_exec: bool  # has_graph_exec_: instantiated
    _simcuda_pool: object
    keep_graph: bool

    def capture_begin(self, pool: object = None, capture_error_mode: object = "global") -> None:
        _live(self._simcuda)._capture_begin(self, pool, capture_error_mode)

    def capture_end(self) -> None:
        _live(self._simcuda)._capture_end(self)

    def replay(self) -> None:
        _live(self._simcuda)._replay(self)

    def reset(self) -> None:
        sim = _live(self._simcuda)
        with sim._lock:
            sim._note_locked("reset", self._simcuda_id)
            self._simcuda_captured = self._simcuda_exec = False

    def pool(self) -> object:
        return _live(self._simcuda)._pool(self)

    def instantiate(self) -> None:
        _live(self._simcuda)._instantiate(self)

    def enable_debug_mode(self) -> None:
        _live(self._simcuda)._note("enable_debug_mode", self._simcuda_id)

    def debug_dump(self, debug_path: str) -> None:
        _live(self._simcuda)._note("debug_dump", self._simcuda_id, debug_path)


class _StreamBackend:
    """The C++ half of torch.cuda.Stream, simulated; stream 0 is the default stream."""

    _simcuda: SimulatedCuda
    stream_id: int
    device_index: int
    device_type: int
    priority: int

    @property
    def cuda_stream(self) -> int:
        return self.stream_id

    @property
    def device(self) -> Any:
        import torch

        return torch.device("cuda", self.device_index)

    def query(self) -> bool:
        return _live(self._simcuda)._stream_query(self.stream_id)

    def synchronize(self) -> None:
        _live(self._simcuda)._stream_synchronize(self.stream_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _StreamBackend) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(self.stream_id)

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream stream_id={self.stream_id}{_SUFFIX}>"


class _EventBackend:
    """The C++ half of torch.cuda.Event, simulated: it remembers where it was recorded."""

    _simcuda: SimulatedCuda
    _simcuda_id: int
    _simcuda_timing: bool
    _simcuda_recorded_on: int | None  # the stream of its last record; None: never recorded
    # The capture that took that record, if any: (graph id, capture number).
    _simcuda_captured_in: tuple[int, int] | None

    @property
    def cuda_event(self) -> int:
        return self._simcuda_id if self._simcuda_recorded_on is not None else 0

    def record(self, stream: Any = None) -> None:
        sim = _live(self._simcuda)
        stream_id = sim._current_stream_id() if stream is None else int(stream.stream_id)
        sim._event_record(self, stream_id)

    def wait(self, stream: Any = None) -> None:
        sim = _live(self._simcuda)
        stream_id = sim._current_stream_id() if stream is None else int(stream.stream_id)
        sim._event_wait(self, stream_id)

    def query(self) -> bool:
        return _live(self._simcuda)._event_query(self)

    def synchronize(self) -> None:
        _live(self._simcuda)._event_synchronize(self)

    def elapsed_time(self, end_event: _EventBackend) -> float:
        _live(self._simcuda)
        if not (self._simcuda_timing and end_event._simcuda_timing):
            raise _error("Both events must be created with argument 'enable_timing=True'.")
        if self._simcuda_recorded_on is None or end_event._simcuda_recorded_on is None:
            raise _error("Both events must be recorded before calculating elapsed time.")
        # CUDAEvent::elapsed_time queries both events before it measures.
        for event in (self, end_event):
            _live(self._simcuda)._event_query(event)
        return 0.0

    def __repr__(self) -> str:
        return f"<torch.cuda.Event event_id={self._simcuda_id}{_SUFFIX}>"


# torch's own Python layer over its C classes, as torch/cuda/graphs.py and torch/cuda/streams.py
# write it (CUDAGraph.capture_begin, Stream.wait_event/wait_stream/record_event, Event.record/
# wait), for CUDA builds only. There torch's CUDAGraph and Stream extend C types whose constructors
# need a working driver, so a stand-in cannot extend them, and their methods' zero-argument super()
# works only for their own subclasses: the stand-ins carry this copy of the layer instead. On
# CPU builds the C bases are empty placeholders, and the stand-ins extend torch's classes and run
# this layer from torch itself.


class _GraphLayer:
    """torch.cuda.CUDAGraph's Python layer, for CUDA builds (torch/cuda/graphs.py)."""

    def capture_begin(
        self,
        pool: object = None,
        capture_error_mode: object = "global",
        check_input_liveness: bool = False,
    ) -> None:
        # check_input_liveness (torch 2.13+) only arms a tracker of tensors on the real device;
        # torch.cuda.graph passes it on every capture.
        super().capture_begin(pool=pool, capture_error_mode=capture_error_mode)  # type: ignore[misc]


class _StreamLayer:
    """torch.cuda.Stream's Python layer, for CUDA builds (torch/cuda/streams.py)."""

    def wait_event(self, event: Any) -> None:
        event.wait(self)

    def wait_stream(self, stream: Any) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: Any = None) -> Any:
        if event is None:
            event = _STANDINS["Event"]()
        event.record(self)
        return event


class _EventLayer:
    """torch.cuda.Event's Python layer, for CUDA builds (torch/cuda/streams.py)."""

    def record(self, stream: Any = None) -> None:
        if stream is None:
            stream = _current_stream()
        super().record(stream)  # type: ignore[misc]

    def wait(self, stream: Any = None) -> None:
        if stream is None:
            stream = _current_stream()
        super().wait(stream)  # type: ignore[misc]


def _ignore_init(self: object, *args: object, **kwargs: object) -> None:
    """Stand-ins are set up in __new__; torch's dummy bases would refuse __init__."""


def _graph_new(cls: type, keep_graph: bool = False) -> Any:
    sim = _active()
    self: Any = object.__new__(cls)
    self._tracker = None  # what the real CUDAGraph.__new__ sets, for its __del__ and replay
    self._simcuda, self._simcuda_id = sim, sim._new_id("graph")
    self._simcuda_captured = self._simcuda_exec = False
    self._simcuda_pool = None  # set by capture_begin; pool() refuses until capture_end
    self.keep_graph = keep_graph
    return self


def _stream_new(
    cls: type,
    device: object = None,
    priority: int = 0,
    *,
    stream_id: int | None = None,
    device_index: int = 0,
    device_type: int = _CUDA_DEVICE_TYPE,
) -> Any:
    sim = _active()
    self: Any = object.__new__(cls)
    self._simcuda = sim
    self.stream_id = sim._new_id("stream") if stream_id is None else stream_id
    self.device_index, self.device_type, self.priority = device_index, device_type, priority
    return self


def _event_new(
    cls: type,
    enable_timing: bool = False,
    blocking: bool = False,
    interprocess: bool = False,
    external: bool = False,
) -> Any:
    sim = _active()
    self: Any = object.__new__(cls)
    self._simcuda, self._simcuda_id = sim, sim._new_id("event")
    self._simcuda_timing, self._simcuda_recorded_on = enable_timing, None
    self._simcuda_captured_in = None
    return self


def _standin(name: str, real: type, bases: tuple[type, ...], new: Callable[..., Any]) -> type:
    # Built with type() because the real classes only exist once torch is imported. The backend
    # comes last, so torch's super() calls (CPU builds) or the copied layer's (CUDA builds) reach
    # it. _cgguard_stands_for names torch's class for cgguard._core.patches.real_class, which a
    # stand-in on a CUDA build does not extend.
    backend = bases[-1]
    return type(
        name,
        bases,
        {
            "__module__": __name__,
            "__doc__": f"cgguard's stand-in for torch.cuda.{real.__name__}{_SUFFIX}.",
            "__new__": new,
            "__init__": _ignore_init,
            "_cgguard_stands_for": real,
            # The real classes define __repr__ too; the stand-in's must win and say "simulated".
            "__repr__": vars(backend).get("__repr__", bases[0].__repr__),
        },
    )


_STANDINS: dict[str, type] = {}


def _standins(torch: ModuleType) -> dict[str, type]:
    """The stand-ins for CUDAGraph, Stream and Event, by name: on a CPU build subclasses of
    torch's own classes; on a CUDA build classes of cgguard's own, with torch's Python layer."""
    # Built once, so objects from one session still pass isinstance checks in the next.
    if not _STANDINS:
        cuda = torch.cuda
        backends: Any = torch.backends  # untyped in torch
        table = (
            ("CUDAGraph", cuda.graphs.CUDAGraph, _GraphLayer, _GraphBackend, _graph_new),
            ("Stream", cuda.streams.Stream, _StreamLayer, _StreamBackend, _stream_new),
            ("Event", cuda.streams.Event, _EventLayer, _EventBackend, _event_new),
        )
        extend_torch = not backends.cuda.is_built()
        for name, real, layer, backend, new in table:
            first = real if extend_torch else layer
            _STANDINS[name] = _standin(f"_Simulated{name}", real, (first, backend), new)
    return _STANDINS


def _make_stream(stream_id: int) -> Any:
    return _STANDINS["Stream"](stream_id=stream_id, device_index=0, device_type=_CUDA_DEVICE_TYPE)


def _current_stream(device: object = None) -> Any:
    return _make_stream(_active()._current_stream_id())


def _default_stream(device: object = None) -> Any:
    _active()
    return _make_stream(0)


def _set_stream(stream: Any) -> None:
    if stream is not None:
        _active()._set_stream(int(stream.stream_id))


class _StreamContext:
    """torch.cuda.stream(s), simulated: torch's own StreamContext does nothing on CPU builds."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.previous: Any = None

    def __enter__(self) -> None:
        if self.stream is not None:
            self.previous = _current_stream()
            _set_stream(self.stream)

    def __exit__(self, *exc_info: object) -> None:
        if self.stream is not None:
            _set_stream(self.previous)


def _stream(stream: Any) -> _StreamContext:
    return _StreamContext(stream)


def _cuda_synchronize() -> None:
    # Where torch's own torch.cuda.synchronize() lands, as on a CUDA build.
    _active()._synchronize()


def _is_current_stream_capturing() -> bool:
    return _active()._is_capturing()


def _graph_pool_handle() -> tuple[int, int]:
    return (0, _active()._new_id("pool"))


def _host_empty_cache() -> None:
    _active()._note("host_empty_cache")


def _install(torch: ModuleType) -> PatchSet:
    """Put the stand-ins in place; return the patches that put every replaced attribute back."""
    # Imported here: importing cgguard.testing (pytest's plugin does, in every run) loads only
    # what it needs to name the simulation.
    from cgguard.testing._simdevice import answer_device_calls

    patches = PatchSet()
    put = patches.replace
    # A failure half-way must not leave torch half patched.
    try:
        cuda = torch.cuda
        classes = _standins(torch)
        for name in ("CUDAGraph", "Stream", "Event"):
            put(cuda, name, classes[name])
        # Stream.record_event() builds an Event through torch.cuda.streams' own global name.
        put(cuda.streams, "Event", classes["Event"])
        for owner in (cuda, cuda.graphs):
            put(owner, "is_current_stream_capturing", _is_current_stream_capturing)
            put(owner, "graph_pool_handle", _graph_pool_handle)
        put(cuda, "current_stream", _current_stream)
        put(cuda, "default_stream", _default_stream)
        put(cuda, "set_stream", _set_stream)
        put(cuda, "stream", _stream)
        # torch's own synchronize() runs: it initialises CUDA, enters torch.cuda.device(None)
        # and calls torch._C._cuda_synchronize, which CPU builds lack. Only synchronize and
        # current_device find CUDA initialised: anything else would take CUDA paths the
        # simulation does not have (cgguard.testing._simdevice).
        put(torch._C, "_cuda_synchronize", _cuda_synchronize)
        answer_device_calls(torch, patches, invalid_device=_cuda_error)
        put(torch._C, "_host_emptyCache", _host_empty_cache)
        # torch.cuda.graph caches its side stream on the class; a stream from another runtime
        # (or an ended session) must not be used for captures here.
        put(cuda.graphs.graph, "default_capture_stream", None)
    except BaseException:
        patches.restore()
        raise
    return patches


def _nothing() -> None:
    """No hooks to move."""


def _told(device: Device | None) -> None:
    """No hooks to move, and nobody to tell of the device."""


def active() -> SimulatedCuda | None:
    """The simulated runtime in place now, if any."""
    return _ACTIVE


@contextlib.contextmanager
def simulated_runtime(
    *,
    force: bool = False,
    unhook: Callable[[], None] = _nothing,
    rehook: Callable[[Device | None], None] = _told,
    max_calls: int | None = None,
) -> Iterator[SimulatedCuda]:
    """Run torch's CUDA-graph code over cgguard's simulated CUDA runtime (no GPU).

    Replaces torch.cuda's graph, stream and event entry points with stand-ins for the duration
    and restores every one on exit; while it lasts, requests for CUDA memory get host memory
    (cgguard.testing._simdevice). Refuses where real CUDA is available unless ``force``.
    ``unhook`` runs before each swap and ``rehook`` after it (both under the activation lock):
    cgguard's hooks come off what is about to be replaced and go on what replaced it.
    ``max_calls``: the latest calls its record keeps, every call where None.

    Which code is torch's own:

    - on every build: ``torch.cuda.graph`` (``__init__``, ``__enter__``, ``__exit__``),
      ``torch.cuda.synchronize`` and ``torch.cuda.empty_cache``, over simulated
      ``torch._C._cuda_synchronize``, ``torch._C._host_emptyCache``, device switches and
      ``torch.cuda._lazy_init``, which succeeds for ``synchronize`` and ``current_device``
      alone: torch.cuda's other functions (``get_device_properties``, ``mem_get_info``, ...)
      fail with the type they fail with without the simulation, so torch's subsystems
      (inductor, dynamo) take their CPU paths; ``current_device`` and ``set_device`` over a
      simulated ``torch._C._cuda_getDevice`` and ``_cuda_setDevice`` (device 0 alone);
    - on a CPU-only build, also the Python methods of ``CUDAGraph``, ``Stream`` and ``Event``:
      the stand-ins extend torch's classes, whose C bases are empty placeholders there;
    - on a CUDA build, not those methods: torch's classes extend C types that need a working
      driver, so the stand-ins are cgguard's own classes with a copy of torch's Python layer
      (``capture_begin``'s arguments, ``Stream.wait_event``/``wait_stream``/``record_event``,
      ``Event.record``/``wait``); torch's later additions to ``CUDAGraph`` (capture hooks,
      ``capture_end_pre``/``capture_end_post``, ``raw_cuda_graph``) are absent there;
    - never: ``torch.cuda.stream``, ``current_stream``, ``default_stream``, ``set_stream``,
      ``is_current_stream_capturing`` and ``graph_pool_handle``. torch's ``StreamContext``
      switches nothing where no device index is known (``_get_device_index(None, True)`` is
      None on both kinds of build without a device), so the simulation keeps its own.
    """
    global _ACTIVE
    if max_calls is not None and (type(max_calls) is not int or max_calls < 0):
        raise ValueError(
            f"simulated_cuda(max_calls={max_calls!r}): None (every call) or a whole number of 0 "
            "or more expected"
        )
    import torch

    from cgguard.testing._simdevice import serve_requests, stop_serving

    with _ACTIVATION_LOCK:
        if _ACTIVE is not None:
            raise SimulationError("simulated_cuda() is already active" + _SUFFIX)
        if torch.cuda.is_available() and not force:
            raise SimulationError(
                "real CUDA is available and simulated_cuda() would shadow it; "
                "pass force=True to simulate anyway" + _SUFFIX
            )
        sim = SimulatedCuda(max_calls)
        unhook()
        device = None
        try:
            patches = _install(torch)
            try:
                serve_requests()
            except BaseException:
                patches.restore()
                raise
            device = sim.device()
        finally:
            rehook(device)
        _ACTIVE = sim
    try:
        yield sim
    finally:
        with _ACTIVATION_LOCK:
            _ACTIVE = None
            unhook()
            try:
                stop_serving()
            finally:
                try:
                    patches.restore()
                finally:
                    rehook(None)
