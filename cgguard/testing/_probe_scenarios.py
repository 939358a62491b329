"""The fidelity probe's capture scenarios: plain torch code, run alike on a GPU and simulated.

Each scenario sets up a capture with public torch APIs only, makes one probed call (``act``) and
then ends the capture it began, so that its result says both what the call did and whether the
capture survived it. On a GPU each scenario runs in a fresh interpreter started on this file by
path (``python _probe_scenarios.py SCENARIO MODE``), so that no cgguard module is imported there
and a capture that poisons the CUDA context poisons only that process. The last line it prints is
the result as JSON.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import types
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

MODES = ("global", "thread_local", "relaxed")
THREAD_TIMEOUT_S = 20.0

# How errors are named: the first class of the exception's MRO that torch or Python defines, the
# type a caller's `except` clause can name. The simulation's own subclasses read as their base.
_PUBLIC_MODULES = ("builtins", "torch")
_SIMULATED_SUFFIX = " [simulated CUDA]"
# c10_cuda_check_implementation (c10/cuda/CUDAException.cpp) starts a CUDA error's message with it.
_CUDA_PREFIX = "CUDA error: "
# cudaGetErrorString(cudaErrorStreamCaptureInvalidated): what ending a poisoned capture says.
_INVALIDATED = "operation failed due to a previous error during capture"
KEY_LENGTH = 100


def error_key(exc: BaseException) -> str:
    """``Type: first sentence of the message``: stable across torch builds and CUDA versions.

    The rest of torch's message (CUDA_LAUNCH_BLOCKING advice, the C++ location of a warning, a
    second sentence) varies between releases and is left out.
    """
    name = next(
        (k.__name__ for k in type(exc).__mro__ if k.__module__ in _PUBLIC_MODULES),
        type(exc).__name__,
    )
    return f"{name}: {message_key(str(exc))}"


def message_key(message: str) -> str:
    """The first sentence of a torch error or warning message, without CUDA's prefix."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = lines[0] if lines else ""
    text = text.removesuffix(_SIMULATED_SUFFIX).removeprefix(_CUDA_PREFIX)
    text = text.split(". ")[0].rstrip(".")
    return text[:KEY_LENGTH]


def observe(call: Callable[[], object]) -> str:
    """What ``call`` did: ``ok`` or its error key, and any warning it gave, in brackets."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            call()
            outcome = "ok"
        except Exception as exc:
            outcome = error_key(exc)
    heard = sorted({f"{w.category.__name__}: {message_key(str(w.message))}" for w in said})
    return outcome + "".join(f" (warns {w})" for w in heard)


def capture_state(end_result: str) -> str:
    """A capture's fate from what its own capture_end did: ended, invalidated, or the error."""
    if end_result == "ok" or end_result.startswith("ok "):
        return "ended" + end_result[2:]
    if _INVALIDATED in end_result:
        return "invalidated"
    return end_result


class Scene:
    """One scenario's setting: a mode, a device for tensors, streams and graphs made up front.

    Everything is allocated, and its kernel loaded, before any capture begins, so that the probed
    call is the one thing in the capture that can be unsafe.
    """

    def __init__(
        self,
        mode: str,
        device: str,
        launched: Callable[[Any], None] | None = None,
        synced: Callable[[str], None] | None = None,
    ) -> None:
        import torch

        self.torch: Any = torch
        self.mode = mode
        # Told of each kernel work() launches, where the runtime cannot see it (the simulation
        # sees no CPU tensor's work).
        self.launched = launched
        # Told of each op that waits for the device (cgguard._inspect.sync_ops), just before it
        # runs, where the runtime cannot see it: a CPU op waits for nothing, so the simulation is
        # told, as cgguard's inspection tells it of an implicit synchronize it lets through.
        self.synced = synced
        self.x: Any = self.torch.zeros(4, device=device)
        self.side: Any = self.torch.cuda.Stream()
        self.other: Any = self.torch.cuda.Stream()
        self.graph: Any = self.torch.cuda.CUDAGraph()
        self.outcome: str | None = None
        self._capture: tuple[Any, Any] | None = None
        for stream in (self.side, self.other):
            stream.wait_stream(self.torch.cuda.current_stream())
            with self.torch.cuda.stream(stream):
                self.x.add_(1)
        self.torch.cuda.synchronize()

    def act(self, call: Callable[[], object]) -> None:
        """Make the probed call; its result is the scenario's outcome."""
        self.outcome = observe(call)

    def begin(self, graph: Any = None, stream: Any = None) -> None:
        """Begin capturing ``graph`` (the scene's own) on ``stream`` (the side stream).

        The scene ends that capture after the probed call, to see whether it survived.
        """
        graph = self.graph if graph is None else graph
        stream = self.side if stream is None else stream
        with self.torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode=self.mode)
        self._capture = (graph, stream)

    def work(self, stream: Any = None) -> None:
        """Launch a kernel into ``stream`` (the side stream): a capture with work is not empty."""
        stream = self.side if stream is None else stream
        with self.torch.cuda.stream(stream):
            self.x.add_(1)
        if self.launched is not None:
            self.launched(stream)

    def syncing(self, op: str, call: Callable[[], object]) -> Callable[[], object]:
        """``call``, an op that waits for the device (``op``, its aten name)."""

        def waits() -> object:
            if self.synced is not None:
                self.synced(op)
            return call()

        return waits

    def in_capture(self, call: Callable[[], object]) -> Callable[[], object]:
        """``call`` made with the capturing stream current, as inside ``torch.cuda.graph``."""

        def inside() -> object:
            if self._capture is None:
                raise RuntimeError("in_capture() before begin()")
            with self.torch.cuda.stream(self._capture[1]):
                return call()

        return inside

    def on_thread(self, call: Callable[[], object]) -> Callable[[], object]:
        """``call`` made on a new thread; its error, if any, is raised again on this one."""

        def threaded() -> object:
            failures: list[BaseException] = []

            def run() -> None:
                try:
                    call()
                except BaseException as exc:
                    failures.append(exc)

            worker = threading.Thread(target=run, name="probe-worker", daemon=True)
            worker.start()
            worker.join(THREAD_TIMEOUT_S)
            if worker.is_alive():
                raise TimeoutError(f"the other thread still runs after {THREAD_TIMEOUT_S:g} s")
            if failures:
                raise failures[0]
            return None

        return threaded

    def capture(self) -> str:
        """End the scene's capture on its stream: ended, invalidated, or not capturing."""
        if self._capture is None:
            return "none begun"
        graph, stream = self._capture
        with self.torch.cuda.stream(stream):
            if not self.torch.cuda.is_current_stream_capturing():
                return "not capturing"
            return capture_state(observe(graph.capture_end))


def _device_synchronize(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.in_capture(s.torch.cuda.synchronize))


def _capturing_stream_synchronize(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.in_capture(s.side.synchronize))


def _other_stream_synchronize(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.in_capture(s.other.synchronize))


def _capturing_stream_query(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.in_capture(s.side.query))


def _other_stream_query(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.in_capture(s.other.query))


def _event(s: Scene, recorded: str, method: str) -> None:
    event = s.torch.cuda.Event()
    if recorded == "before":
        event.record(s.other)
        s.torch.cuda.synchronize()
    s.begin()
    s.work()
    if recorded == "inside":
        s.in_capture(event.record)()
    s.act(s.in_capture(getattr(event, method)))


def _captured_event_elsewhere(s: Scene, method: str, external: bool = False) -> None:
    # An event recorded into the capture, then waited on by a thread that does not capture.
    event = s.torch.cuda.Event(enable_timing=method == "elapsed_time", external=external)
    start = s.torch.cuda.Event(enable_timing=True)
    start.record(s.other)
    s.torch.cuda.synchronize()
    s.begin()
    s.work()
    s.in_capture(event.record)()
    call = getattr(event, method)
    if method == "elapsed_time":
        call = functools.partial(start.elapsed_time, event)
    s.act(s.on_thread(call))


def _captured_event_after_the_capture(s: Scene) -> None:
    # What an event recorded into a capture is once that capture has ended.
    event = s.torch.cuda.Event()
    s.begin()
    s.work()
    s.in_capture(event.record)()
    s.in_capture(s.graph.capture_end)()
    s.act(event.query)


def _stream_query_other_thread(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.on_thread(s.side.query))


def _begin_on_capturing_stream(s: Scene) -> None:
    second = s.torch.cuda.CUDAGraph()
    s.begin()
    s.work()
    s.act(s.in_capture(lambda: second.capture_begin(capture_error_mode=s.mode)))


def _end_on_wrong_stream(s: Scene) -> None:
    s.begin()
    s.work()

    def end_elsewhere() -> None:
        with s.torch.cuda.stream(s.other):
            s.graph.capture_end()

    s.act(end_elsewhere)


def _end_on_other_thread(s: Scene) -> None:
    s.begin()
    s.work()
    # The other thread makes the capturing stream its own current stream, as torch requires.
    s.act(s.on_thread(s.in_capture(s.graph.capture_end)))


def _default_stream_capture(s: Scene) -> None:
    default = s.torch.cuda.default_stream()

    def begin_on_default() -> None:
        s.begin(stream=default)

    s.act(begin_on_default)


def _replay_before_capture(s: Scene) -> None:
    s.act(s.graph.replay)


def _replay_during_capture(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.in_capture(s.graph.replay))


def _pool_before_capture(s: Scene) -> None:
    s.act(s.graph.pool)


def _pool_during_capture(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.in_capture(s.graph.pool))


def _recapture(s: Scene, *, keep_graph: bool, instantiate: bool = False) -> None:
    graph = s.torch.cuda.CUDAGraph(keep_graph=keep_graph)
    s.begin(graph)
    s.work()
    s.in_capture(graph.capture_end)()
    if instantiate:
        graph.instantiate()
    s.act(lambda: s.begin(graph))
    s.work()


def _empty_capture(s: Scene) -> None:
    s.begin()
    s.act(s.in_capture(s.graph.capture_end))


def _two_threads_capture(s: Scene) -> None:
    second = s.torch.cuda.CUDAGraph()
    s.begin()
    s.work()

    def capture_alongside() -> None:
        with s.torch.cuda.stream(s.other):
            second.capture_begin(capture_error_mode=s.mode)
            s.work(s.other)
            second.capture_end()

    s.act(s.on_thread(capture_alongside))


def _device_synchronize_other_thread(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.on_thread(s.torch.cuda.synchronize))


# What inspection's rules rest on: an op that waits for the device fails during a capture as a
# synchronize does (implicit_sync); torch refuses RNG calls during a capture, or lets some
# through (rng_during_capture); a replay after an input was freed runs, silently
# (dead_input). On the simulation the RNG scenarios are torch's CPU paths: the simulation does
# not model CUDAGeneratorImpl, and the GPU run says what it does.


def _item(s: Scene, *, other_stream: bool = False) -> None:
    s.begin()
    s.work()
    call = s.syncing("aten::_local_scalar_dense", lambda: s.x.sum().item())
    if other_stream:
        s.act(s.in_capture(lambda: _on(s, s.other, call)))
    else:
        s.act(s.in_capture(call))


def _on(s: Scene, stream: Any, call: Callable[[], object]) -> object:
    with s.torch.cuda.stream(stream):
        return call()


def _nonzero(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.in_capture(s.syncing("aten::nonzero", s.x.nonzero)))


def _unique(s: Scene) -> None:
    s.begin()
    s.work()
    s.act(s.in_capture(s.syncing("aten::_unique2", lambda: s.torch.unique(s.x))))


def _rng(s: Scene, call: str) -> None:
    cuda = s.torch.cuda
    # A generator state of the size torch's CUDAGeneratorImpl takes (its seed and offset, 16
    # bytes): made here, so that no RNG call but the probed one is made.
    state = s.torch.zeros(16, dtype=s.torch.uint8)
    calls: dict[str, Callable[[], object]] = {
        "manual_seed": lambda: cuda.manual_seed(1234),
        "seed": cuda.seed,
        "get_rng_state": cuda.get_rng_state,
        "set_rng_state": lambda: cuda.set_rng_state(state),
    }
    s.begin()
    s.work()
    s.act(s.in_capture(calls[call]))


def _replay_after_input_freed(s: Scene) -> None:
    weight = s.x.clone()
    out = s.x.clone()
    s.begin()
    with s.torch.cuda.stream(s.side):
        out.copy_(weight * 2)
    if s.launched is not None:
        s.launched(s.side)
    s.in_capture(s.graph.capture_end)()
    del weight
    s.act(s.graph.replay)


def _replay_after_rebind(s: Scene) -> None:
    # A name rebound to a new tensor after the capture (stale_binding): the graph keeps reading
    # the old one, whose memory still holds its values, so the replay runs, silently.
    holder = types.SimpleNamespace(weight=s.x.clone())
    out = s.x.clone()
    s.begin()
    with s.torch.cuda.stream(s.side):
        out.copy_(holder.weight * 2)
    if s.launched is not None:
        s.launched(s.side)
    s.in_capture(s.graph.capture_end)()
    holder.weight = s.x.clone()
    s.act(s.graph.replay)


SCENARIOS: dict[str, Callable[[Scene], None]] = {
    "device_synchronize": _device_synchronize,
    "capturing_stream_synchronize": _capturing_stream_synchronize,
    "other_stream_synchronize": _other_stream_synchronize,
    "capturing_stream_query": _capturing_stream_query,
    "other_stream_query": _other_stream_query,
    **{
        f"event_{method}_recorded_{recorded}": functools.partial(
            _event, recorded=recorded, method=method
        )
        for method in ("synchronize", "query")
        for recorded in ("before", "inside", "never")
    },
    "begin_on_capturing_stream": _begin_on_capturing_stream,
    "end_on_wrong_stream": _end_on_wrong_stream,
    "end_on_other_thread": _end_on_other_thread,
    "default_stream_capture": _default_stream_capture,
    "replay_before_capture": _replay_before_capture,
    "replay_during_capture": _replay_during_capture,
    "pool_before_capture": _pool_before_capture,
    "pool_during_capture": _pool_during_capture,
    "recapture": functools.partial(_recapture, keep_graph=False),
    "recapture_keep_graph": functools.partial(_recapture, keep_graph=True),
    "recapture_keep_graph_instantiated": functools.partial(
        _recapture, keep_graph=True, instantiate=True
    ),
    "empty_capture": _empty_capture,
    "two_threads_capture": _two_threads_capture,
    "device_synchronize_other_thread": _device_synchronize_other_thread,
    "capturing_stream_query_other_thread": _stream_query_other_thread,
    **{
        f"event_{method}_recorded_inside_other_thread": functools.partial(
            _captured_event_elsewhere, method=method
        )
        for method in ("synchronize", "query", "elapsed_time")
    },
    "event_query_recorded_inside_external_other_thread": functools.partial(
        _captured_event_elsewhere, method="query", external=True
    ),
    "event_query_after_its_capture_ended": _captured_event_after_the_capture,
    "item_during_capture": _item,
    "item_on_other_stream_during_capture": functools.partial(_item, other_stream=True),
    "nonzero_during_capture": _nonzero,
    "unique_during_capture": _unique,
    **{
        f"{call}_during_capture": functools.partial(_rng, call=call)
        for call in ("manual_seed", "seed", "get_rng_state", "set_rng_state")
    },
    "replay_after_input_freed": _replay_after_input_freed,
    "replay_after_rebind": _replay_after_rebind,
}


def run(
    scenario: str,
    mode: str,
    device: str,
    launched: Callable[[Any], None] | None = None,
    synced: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Run one scenario in this process: its outcome and its capture's fate.

    A failure before the probed call is the outcome too (``setup failed: ...``), so a scenario
    that cannot even be set up on some runtime shows as a disagreement, not as a crash. Warnings
    outside the probed call and the final capture_end are ignored, whatever the caller's warning
    filters (pytest turns them into errors): the result must not depend on who runs it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            scene = Scene(mode, device, launched, synced)
        except Exception as exc:
            return {"outcome": f"setup failed: {error_key(exc)}", "capture": "none begun"}
        try:
            SCENARIOS[scenario](scene)
        except Exception as exc:
            if scene.outcome is None:
                scene.outcome = f"setup failed: {error_key(exc)}"
        outcome = scene.outcome if scene.outcome is not None else "setup failed: no probed call"
        try:
            capture = scene.capture()
        except Exception as exc:
            capture = f"check failed: {error_key(exc)}"
    return {"outcome": outcome, "capture": capture}


def run_simulated(scenario: str, mode: str) -> dict[str, str]:
    """Run one scenario in this process on a fresh session of cgguard's simulated CUDA runtime."""
    from cgguard.testing import simulated_cuda

    with simulated_cuda(force=True) as simulation:
        # The scene tells the simulation of its kernels, so an empty capture warns as on a GPU.
        simulation.warn_empty_captures = True
        return run(scenario, mode, "cpu", simulation.launch, simulation.implicit_sync)


def _cgguard_modules() -> list[str]:
    return sorted(m for m in sys.modules if m == "cgguard" or m.startswith("cgguard."))


def main(argv: list[str]) -> int:
    """``[--simulated] SCENARIO MODE``: run it on CUDA (or the simulation), print JSON."""
    simulated = argv[:1] == ["--simulated"]
    args = argv[1:] if simulated else argv
    if len(args) != 2 or args[0] not in SCENARIOS or args[1] not in MODES:
        print(
            f"usage: _probe_scenarios.py [--simulated] SCENARIO MODE; got {argv!r}; "
            f"scenarios: {', '.join(SCENARIOS)}; modes: {', '.join(MODES)}",
            file=sys.stderr,
        )
        return 2
    if simulated:
        result = run_simulated(*args)
    else:
        # The probe observes torch and CUDA alone; cgguard activated by its .pth would not.
        loaded = _cgguard_modules()
        if loaded:
            print(f"cgguard is loaded in the probe's process: {', '.join(loaded)}", file=sys.stderr)
            return 3
        result = run(args[0], args[1], "cuda")
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    import os

    # Run by path, this file's folder comes first on sys.path; its modules must not shadow any
    # that torch imports.
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]
    # os._exit: a thread stuck in a CUDA call, or a poisoned context's teardown, must not keep
    # the process from ending once its result is out.
    os._exit(main(sys.argv[1:]))
