"""Inspection (cgguard._inspect): implicit synchronizes refused before they run, dead inputs
refused at replay, RNG calls during a capture, and what broke a capture that failed."""

from __future__ import annotations

import _thread
import functools
import gc
import os
import subprocess
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import cgguard
from cgguard import _process
from cgguard._core import patches as _patches
from cgguard._inspect import inspector as _inspect
from cgguard._inspect import liveness as _liveness
from cgguard._inspect import mode as _mode
from cgguard._inspect import rng as _rng
from cgguard._inspect.sync_ops import SYNC_OPS, syncs
from cgguard.testing import capture_violations, simulated_cuda
from cgguard.testing._simcuda import SimulatedCudaError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from conftest import Runtime

    from cgguard._data.schema import ViolationEvent

HERE = __file__
REPLAY_HOOK = "torch.cuda.graphs.CUDAGraph.replay"


def line_of(marker: str) -> int:
    """The line of this file that holds ``marker`` in a comment: expectations written apart
    from what cgguard reports."""
    with open(HERE, encoding="utf-8") as source:
        for number, text in enumerate(source, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return number
    raise AssertionError(marker)


def lines(frames: Any) -> list[int]:
    return [frame["line"] for frame in frames if frame["file"] == HERE]


def innermost(frames: Any) -> int:
    return lines(frames)[-1]


@pytest.fixture
def inspected(runtime: Runtime) -> Runtime:
    """cgguard installed with inspection on, in raise mode, on each runtime."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    return runtime


@pytest.fixture
def sim() -> Iterator[Any]:
    with simulated_cuda() as runtime:
        yield runtime


def tensor(runtime: Runtime, n: int = 5) -> torch.Tensor:
    return torch.arange(float(n), device=runtime.device)


def capture_end_calls(sim: Any) -> list[tuple[object, ...]]:
    return [call.args for call in sim.calls if call.name == "capture_end"]


# implicit_sync


def test_item_is_refused_before_it_runs_and_the_capture_ends_cleanly(inspected: Runtime) -> None:
    """`.item()` inside an inspected capture raises ImplicitSyncError naming the op, what the
    user wrote, the user's line and the capture's begin; the capture then ends unbroken."""
    x = tensor(inspected)
    graph = torch.cuda.CUDAGraph()
    with capture_violations() as events:
        with torch.cuda.graph(graph):  # capture-began
            y = x * 2
            with pytest.raises(cgguard.ImplicitSyncError) as refused:
                y.sum().item()  # item-called
        graph.replay()
    event = refused.value.event
    assert (event["rule"], event["action"], event["api"]) == (
        "implicit_sync",
        "raised",
        "aten::_local_scalar_dense",
    )
    assert ".item(), bool(), int() or float()" in event["message"]
    assert innermost(event["stack"]) == line_of("item-called")
    assert innermost(event["capture_stack"]) == line_of("capture-began")
    assert [e["rule"] for e in events] == ["implicit_sync"]
    if inspected.simulation is not None:
        # Never reached the simulated device; the capture ended successfully.
        assert not any(c.name == "implicit_sync" for c in inspected.simulation.calls)
        assert capture_end_calls(inspected.simulation) == [(1, True)]


@pytest.mark.parametrize(
    ("call", "api"),
    [
        (lambda x: bool(x.sum() > 0), "aten::_local_scalar_dense"),
        (lambda x: int(x[0]), "aten::_local_scalar_dense"),
        (torch.Tensor.nonzero, "aten::nonzero"),
        (torch.unique, "aten::_unique2"),
        (lambda x: x[x > 1], "aten::index"),
        (lambda x: torch.masked_select(x, x > 1), "aten::masked_select"),
        (lambda x: torch.repeat_interleave(x, x.long()), "aten::repeat_interleave"),
        (lambda x: torch.histc(x, 4), "aten::histc"),
        (lambda x: torch.linalg.inv(torch.diag(x + 1)), "aten::_linalg_check_errors"),
        (lambda x: torch.linalg.cholesky(torch.diag(x + 1)), "aten::_linalg_check_errors"),
        (lambda x: torch.allclose(x, x + 1), "aten::allclose"),
    ],
    ids=[
        "bool",
        "int",
        "nonzero",
        "unique",
        "bool-mask",
        "masked_select",
        "repeat_interleave",
        "histc",
        "linalg.inv",
        "linalg.cholesky",
        "allclose",
    ],
)
@pytest.mark.simulated
def test_each_syncing_op_is_refused_on_the_simulation(sim: Any, call: Any, api: str) -> None:
    """Each op the table names, called on a CPU tensor inside a simulated capture, is refused
    under its own aten name."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(5.0)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        with pytest.raises(cgguard.ImplicitSyncError) as refused:
            call(x)
    assert refused.value.event["api"] == api
    assert capture_end_calls(sim) == [(1, True)]


@pytest.mark.simulated
def test_ops_that_do_not_synchronize_pass_untouched(sim: Any) -> None:
    """Arithmetic, integer indexing, and repeat_interleave given its output_size are not
    implicit synchronizes: nothing is reported, and the results are the eager ones."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(5.0)
    with capture_violations() as events, torch.cuda.graph(torch.cuda.CUDAGraph()):
        y = (x * 3 + 1)[torch.tensor([0, 2])]
        z = torch.repeat_interleave(torch.tensor([1.0, 2.0]), torch.tensor([1, 2]), output_size=3)
    assert (events, y.tolist(), z.tolist()) == ([], [1.0, 7.0], [1.0, 2.0, 2.0])


@pytest.mark.simulated
def test_histc_given_its_range_passes_untouched(sim: Any) -> None:
    """torch.histc with min and max given never reads the input's range on the host: not
    reported, and its counts are the eager ones."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.tensor([0.1, 0.4, 0.6, 0.9, 0.95])
    expected = torch.histc(x, 2, min=0, max=1)
    with capture_violations() as events, torch.cuda.graph(torch.cuda.CUDAGraph()):
        counts = torch.histc(x, 2, min=0, max=1)
    assert (events, counts.tolist()) == ([], expected.tolist())
    assert capture_end_calls(sim) == [(1, True)]


@pytest.mark.simulated
def test_assigning_a_number_through_a_mask_is_a_masked_fill(sim: Any) -> None:
    """`x[mask] = 0.0` is torch's masked_fill_ (no nonzero, no wait): not refused; assigning
    a tensor of values through the mask is."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(5.0)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        x[x > 2] = 0.0
        with pytest.raises(cgguard.ImplicitSyncError) as refused:
            x[x > 0] = torch.ones(2)
    assert (x.tolist(), refused.value.event["api"]) == (
        [0.0, 1.0, 2.0, 0.0, 0.0],
        "aten::index_put_",
    )


@pytest.mark.simulated
def test_in_log_mode_a_sync_let_through_breaks_the_capture_which_names_it(
    sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Log mode reports `.item()` and lets it go on: the simulation fails it as CUDA does, the
    capture_end then fails, and the failure names the offending call."""
    cgguard.install(cgguard.Config(inspect=True, mode="log", log_file="/dev/null"))
    x = torch.arange(5.0)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="previous error during capture") as failed:
        with torch.cuda.graph(graph):  # broken-capture
            with pytest.raises(SimulatedCudaError, match="operation not permitted"):
                x.sum().item()  # offender
    err = capsys.readouterr().err
    began = f"{HERE}:{line_of('broken-capture')}"
    offender = f"{HERE}:{line_of('offender')}"
    assert f"the capture begun at {began} (in " in err
    assert "first offending call seen by cgguard: Implicit synchronize" in err
    assert offender in err
    assert capture_end_calls(sim) == [(1, False)]
    if sys.version_info >= (3, 11):
        notes = failed.value.__notes__
        assert len(notes) == 1
        assert offender in notes[0]


@pytest.mark.simulated
def test_a_broken_capture_with_no_offender_seen_says_so(
    sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A capture broken behind cgguard's back (a call the dispatcher never saw) fails at
    capture_end with cgguard's word that it saw no offending call."""
    cgguard.install(cgguard.Config(inspect=True, mode="log", log_file="/dev/null"))
    with pytest.raises(RuntimeError, match="previous error during capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            with pytest.raises(SimulatedCudaError):
                sim.implicit_sync("a C++ extension's own cudaMemcpy")
    assert _inspect.NONE_SEEN in capsys.readouterr().err


# dead_input


def test_a_dead_input_is_refused_at_replay_with_the_stacks_it_knows(inspected: Runtime) -> None:
    """A tensor made before the capture, read in it, then freed: replay() raises DeadInputError
    with where the capture first read it, where the capture began, the replay's line and where
    it was freed; the replay does not run."""
    weight = tensor(inspected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # dead-capture
        out = weight * 2  # first-read
    graph.replay()  # healthy: nothing to say
    del weight  # freed-here
    gc.collect()
    replays = _replays(inspected)
    with pytest.raises(cgguard.DeadInputError) as refused:
        graph.replay()  # dead-replay
    event = refused.value.event
    assert (event["rule"], event["api"]) == ("dead_input", "CUDAGraph.replay")
    assert innermost(event["stack"]) == line_of("dead-replay")
    assert innermost(event["capture_stack"]) == line_of("dead-capture")
    assert innermost(event["read_stack"]) == line_of("first-read")
    assert innermost(event["freed_stack"]) == line_of("freed-here")
    assert "a float32 tensor of shape (5,)" in event["message"]
    assert _replays(inspected) == replays
    del out


def test_the_graphs_own_allocations_are_not_inputs(inspected: Runtime) -> None:
    """Tensors the capture itself made and let go are the graph's: its replays say nothing."""
    x = tensor(inspected)
    graph = torch.cuda.CUDAGraph()
    with capture_violations() as events:
        with torch.cuda.graph(graph):
            temporary = x * 2
            out = temporary + 1
            del temporary
        gc.collect()
        graph.replay()
        graph.replay()
    assert events == []
    del out


@pytest.mark.simulated
def test_in_log_mode_a_dead_input_is_reported_and_the_replay_runs(sim: Any) -> None:
    """Log mode: a dead input is reported at the first replay, once, and every replay runs."""
    cgguard.install(cgguard.Config(inspect=True, mode="log", log_file="/dev/null"))
    x = torch.arange(3.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    del x
    with capture_violations() as events:
        graph.replay()
        graph.replay()
    assert [(e["rule"], e["action"]) for e in events] == [("dead_input", "logged")]
    assert [c.name for c in sim.calls].count("replay") == 2


@pytest.mark.simulated
def test_a_storage_resized_after_the_capture_is_found_at_the_first_replay(sim: Any) -> None:
    """A storage resized to nothing (as FSDP frees a parameter) lives on at another address:
    found by the first replay's one walk, its freeing place unknown."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(3.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
    x.untyped_storage().resize_(0)
    with pytest.raises(cgguard.DeadInputError) as refused:
        graph.replay()
    assert refused.value.event["freed_stack"] is None
    assert "now has another address" in refused.value.event["message"]
    del y


def _replays(runtime: Runtime) -> int:
    if runtime.simulation is None:
        return 0
    return [c.name for c in runtime.simulation.calls].count("replay")


# rng_during_capture


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.manual_seed(2),
        lambda: torch.cuda.manual_seed(2),
        lambda: torch.cuda.manual_seed_all(2),
        # Looked up at the call: cgguard wraps them after collection.
        lambda: torch.cuda.seed(),  # noqa: PLW0108
        lambda: torch.cuda.seed_all(),  # noqa: PLW0108
    ],
    ids=["torch.manual_seed", "manual_seed", "manual_seed_all", "seed", "seed_all"],
)
def test_an_rng_call_during_a_capture_names_the_capture(inspected: Runtime, call: Any) -> None:
    """Each call that torch refuses during a capture (a changed seed, a new random seed),
    made during an inspected capture, is refused before torch sees it, naming where the
    capture began."""
    torch.manual_seed(1)  # outside any capture: the seed the calls above change
    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # rng-capture
        with pytest.raises(cgguard.RngDuringCaptureError) as refused:
            call()
    event = refused.value.event
    assert event["rule"] == "rng_during_capture"
    assert innermost(event["capture_stack"]) == line_of("rng-capture")
    assert f"{HERE}:{line_of('rng-capture')}" in event["message"]


def _state(seed: int, offset: int) -> torch.Tensor:
    """A CUDA RNG state as torch lays it out: the seed, then the Philox offset, 8 bytes each."""
    raw = seed.to_bytes(8, sys.byteorder) + offset.to_bytes(8, sys.byteorder)
    return torch.tensor(list(raw), dtype=torch.uint8)


# What CUDAGeneratorImpl.cpp refuses during a capture from torch 2.10, the current seed being 7.
RNG_SINCE_2_10 = [
    ("get_rng_state", (), False),
    ("get_rng_state_all", (), False),
    ("manual_seed", (7,), False),
    ("manual_seed", (8,), True),
    ("manual_seed_all", (7,), False),
    ("manual_seed_all", (8,), True),
    ("seed", (), True),
    ("seed_all", (), True),
    ("set_rng_state", (_state(7, 4),), False),  # checkpoint rewinding the offset
    ("set_rng_state", (_state(8, 0),), True),
    ("set_rng_state_all", ([_state(7, 8)],), False),
    ("set_rng_state_all", ([_state(9, 8)],), True),
]


@pytest.mark.parametrize(("name", "args", "expected"), RNG_SINCE_2_10)
@pytest.mark.parametrize("version", [(2, 13), (2, 9)])
def test_only_the_rng_calls_torch_refuses_in_a_capture_are_refused(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    args: tuple[Any, ...],
    expected: bool,
    version: tuple[int, int],
) -> None:
    """From torch 2.10 a capture may read the RNG state and set it with an unchanged seed;
    before, torch refuses every call; seed() is always refused."""
    monkeypatch.setattr(_rng, "_torch_version", lambda: version)
    monkeypatch.setattr(_rng, "current_seed", lambda index: 7)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert _rng.rng_refused(name, args, {}) is (expected if version >= (2, 10) else True)


@pytest.mark.simulated
def test_an_unchanged_seed_set_during_a_capture_passes(
    sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.cuda.manual_seed with the seed the generator already has is a no-op torch allows
    during a capture (torch 2.10 and later): it is not reported."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    monkeypatch.setattr(_rng, "_torch_version", lambda: (2, 13))
    monkeypatch.setattr(_rng, "current_seed", lambda index: 7)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with capture_violations() as events, torch.cuda.graph(torch.cuda.CUDAGraph()):
        torch.cuda.manual_seed(7)
    assert events == []


@pytest.mark.simulated
def test_rng_calls_outside_a_capture_pass(sim: Any) -> None:
    """Outside any capture, torch.manual_seed and friends are torch's own calls, unreported."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    with capture_violations() as events:
        torch.manual_seed(0)
        torch.cuda.manual_seed_all(0)
    assert events == []


# Off, first N, threads, other modes, failures


@pytest.mark.simulated
def test_inspection_off_adds_nothing(sim: Any) -> None:
    """Without inspection: no dispatch mode during a capture, replay and the RNG functions as
    torch has them, and `.item()` is torch's own business."""
    real_seed = torch.cuda.manual_seed
    cgguard.install(cgguard.Config(log_file="/dev/null"))
    patched = cgguard.status().patched
    assert REPLAY_HOOK not in patched
    assert not any("manual_seed" in target for target in patched)
    assert torch.cuda.manual_seed is real_seed
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        modes = torch._C._len_torch_dispatch_stack()
        torch.arange(3.0).sum().item()
    assert modes == 0


@pytest.mark.simulated
def test_inspection_on_is_shown_and_comes_off_with_uninstall(sim: Any) -> None:
    """status() shows the configuration and the hooks; uninstall() takes them all off."""
    real_seed = torch.cuda.manual_seed
    cgguard.install(cgguard.Config(inspect=True, inspect_first=3, log_file="/dev/null"))
    status = cgguard.status()
    assert status.config is not None
    assert (status.config.inspect, status.config.inspect_first) == (True, 3)
    assert REPLAY_HOOK in status.patched
    assert "torch.cuda.manual_seed" in status.patched
    cgguard.uninstall()
    assert torch.cuda.manual_seed is real_seed
    assert "replay" not in vars(torch.cuda.graphs.CUDAGraph) or not hasattr(
        vars(torch.cuda.graphs.CUDAGraph)["replay"], "__wrapped__"
    )


@pytest.mark.simulated
def test_only_the_first_n_captures_of_a_site_are_inspected(sim: Any) -> None:
    """inspect_first=2: the third capture made at one line is not watched."""
    cgguard.install(cgguard.Config(inspect=True, inspect_first=2, log_file="/dev/null"))
    x = torch.arange(3.0)
    refused = []
    for _ in range(3):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            try:
                x.sum().item()
                refused.append(False)  # not inspected: on CPU, nothing else can tell
            except cgguard.ImplicitSyncError:
                refused.append(True)
    assert refused == [True, True, False]


@pytest.mark.simulated
def test_another_threads_ops_are_not_judged(sim: Any) -> None:
    """A thread that calls `.item()` while the main thread captures is not inspected: a dispatch
    mode is thread-local."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    results: list[float] = []
    worker = threading.Thread(target=lambda: results.append(torch.arange(3.0).sum().item()))
    with capture_violations() as events, torch.cuda.graph(torch.cuda.CUDAGraph()):
        worker.start()
        worker.join()
    assert (results, events) == ([3.0], [])


class Counting(TorchDispatchMode):
    """A user's own dispatch mode: counts the ops it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func._schema.name))
        return func(*args, **(kwargs or {}))


@pytest.mark.simulated
def test_a_users_mode_inside_and_around_the_capture_sees_what_it_saw(sim: Any) -> None:
    """A user's mode around the capture and another inside it see their ops, and the mode
    stack is as the user left it once the capture ends."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(3.0)
    with Counting() as outer:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            with Counting() as inner:
                x.mul(2)
            with pytest.raises(cgguard.ImplicitSyncError):
                x.sum().item()
        depth = torch._C._len_torch_dispatch_stack()
    assert (inner.ops, depth, torch._C._len_torch_dispatch_stack()) == (["aten::mul"], 1, 0)
    assert outer.ops[:2] == ["aten::mul", "aten::sum"]


def mode_left_open_past_capture_end() -> Counting:
    """An inspected raw capture whose code enters a user's mode and leaves it open past
    capture_end: the mode, still entered."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    user = Counting()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        user.__enter__()
        graph.capture_end()
    return user


@pytest.mark.simulated
def test_a_mode_left_open_past_capture_end_stays_on_the_stack(sim: Any) -> None:
    """A raw capture whose code enters a mode and leaves it open past capture_end: cgguard's
    mode comes off from under it, and the user's stays, in place."""
    user = mode_left_open_past_capture_end()
    try:
        torch.arange(2.0).sum().item()  # no capture: nothing refused
        assert torch._C._len_torch_dispatch_stack() == 1
    finally:
        user.__exit__(None, None, None)
    assert torch._C._len_torch_dispatch_stack() == 0


@pytest.mark.simulated
def test_a_mode_left_open_past_capture_end_keeps_torchs_mode_flags(sim: Any) -> None:
    """A user's mode (one that does not ignore compile internals) entered inside an inspected
    capture and left open past capture_end: torch's "in such a mode" flag stays set while it
    is on the stack, and is clear once it leaves, as without cgguard."""
    from torch.utils._python_dispatch import is_in_any_mode_without_ignore_compile_internals

    user = mode_left_open_past_capture_end()
    during = is_in_any_mode_without_ignore_compile_internals()
    user.__exit__(None, None, None)
    after = is_in_any_mode_without_ignore_compile_internals()
    assert (during, after, _stack_depth()) == (True, False, 0)


@pytest.mark.simulated
def test_autograd_keep_graph_and_shared_pools_still_capture(sim: Any) -> None:
    """Autograd inside an inspected capture, keep_graph=True and two graphs sharing one pool
    capture and replay as without inspection."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    w = torch.ones(3, requires_grad=True)
    first = torch.cuda.CUDAGraph(keep_graph=True)
    with capture_violations() as events:
        with torch.cuda.graph(first):
            loss = (w * 2).sum()
            loss.backward()
        first.replay()
        second = torch.cuda.CUDAGraph()
        with torch.cuda.graph(second, pool=first.pool()):
            w.detach().mul(3)
        second.replay()
    assert w.grad is not None
    assert (events, w.grad.tolist()) == ([], [2.0, 2.0, 2.0])


@pytest.mark.simulated
def test_torchs_own_liveness_check_is_left_the_inputs(sim: Any) -> None:
    """A capture that passed torch's check_input_liveness (torch 2.13) is not tracked for dead
    inputs by cgguard too: one tensor is never reported twice."""
    if "check_input_liveness" not in torch.cuda.graph.__init__.__code__.co_varnames:
        pytest.skip("torch before 2.13 has no check_input_liveness")
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(3.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, check_input_liveness=True):
        y = x * 2
    del x
    gc.collect()
    with capture_violations() as events:
        graph.replay()  # torch's tracker sees no CUDA tensor on the simulation: silent too
    assert events == []
    del y


@pytest.mark.simulated
def test_an_error_inside_the_watcher_is_one_warning_and_the_op_runs(
    sim: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure of cgguard's own inspection is one warning line; the ops give their results."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))

    def broken(*_: object) -> None:
        raise ValueError("inspection broke")

    monkeypatch.setattr(_liveness.Inputs, "read", broken)
    x = torch.arange(3.0)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        y = x * 2
        z = y + 1
    err = capsys.readouterr().err
    assert z.tolist() == [1.0, 3.0, 5.0]
    assert err.count("inspection broke") == 1
    assert len(err.strip().splitlines()) == 1


@pytest.mark.simulated
def test_make_graphed_callables_runs_inspected(sim: Any) -> None:
    """torch.cuda.make_graphed_callables captures its forward and backward under inspection,
    and the graphed module computes what the module computes."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    module = torch.nn.Linear(3, 2)
    x = torch.ones(4, 3, requires_grad=True)
    expected = module(x).detach()
    with capture_violations() as events:
        graphed = torch.cuda.make_graphed_callables(module, (x,))
    assert events == []
    assert callable(graphed)
    del expected


def violations(events: list[ViolationEvent]) -> list[str]:
    return [e["rule"] for e in events]


@pytest.mark.simulated
def test_a_relaxed_capture_judges_only_syncs_of_its_own_stream(sim: Any) -> None:
    """In a relaxed capture, `.item()` with the capturing stream current is refused; with
    another stream current it is let through, as CUDA lets that synchronize through."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(3.0)
    graph, other = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with capture_violations() as events:
        with torch.cuda.graph(graph, capture_error_mode="relaxed"):
            with pytest.raises(cgguard.ImplicitSyncError):
                x.sum().item()
            with torch.cuda.stream(other):
                total = x.sum().item()
    assert (violations(events), total) == (["implicit_sync"], 3.0)


@pytest.mark.simulated
def test_a_synchronize_let_through_is_named_when_the_capture_fails(
    sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first offender need not be inspection's own: a torch.cuda.synchronize() that
    sync_during_capture logged is what the failed capture_end names."""
    cgguard.install(cgguard.Config(inspect=True, mode="log", log_file="/dev/null"))
    with pytest.raises(RuntimeError, match="previous error during capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            with pytest.raises(RuntimeError, match="operation not permitted"):
                torch.cuda.synchronize()  # synchronize-offender
    err = capsys.readouterr().err
    assert "first offending call seen by cgguard: Synchronize during CUDA graph capture" in err
    assert f"{HERE}:{line_of('synchronize-offender')}" in err


@pytest.mark.simulated
def test_an_exemption_lets_one_implicit_sync_through(sim: Any) -> None:
    """implicit_sync=PLACE exempts the op called there, counted as exempted, as for any rule;
    the simulation then fails it as CUDA would."""
    cgguard.install(
        cgguard.Config(inspect=True, exempt=f"implicit_sync={HERE}", log_file="/dev/null")
    )
    x = torch.arange(3.0)
    with pytest.raises(RuntimeError, match="previous error during capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            with pytest.raises(SimulatedCudaError):
                x.sum().item()
    assert cgguard.status().exempted == {"implicit_sync": 1}


@pytest.mark.simulated
def test_the_inspection_rules_take_their_actions_from_the_rule_table(sim: Any) -> None:
    """CGGUARD_INSPECT=1 with CGGUARD_RULE_IMPLICIT_SYNC=off: inspection is on, and that rule
    alone is off, as for any rule."""
    config = cgguard.Config.from_environ(
        {
            "CGGUARD_INSPECT": "1",
            "CGGUARD_RULE_IMPLICIT_SYNC": "off",
            "CGGUARD_LOG_FILE": "/dev/null",
        }
    )
    cgguard.install(config)
    x = torch.arange(3.0)
    with capture_violations() as events:
        with pytest.raises(RuntimeError, match="previous error during capture"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                with pytest.raises(cgguard.RngDuringCaptureError):
                    torch.cuda.manual_seed(1)
                with pytest.raises(SimulatedCudaError):
                    x.sum().item()  # not reported: the simulation fails it as CUDA would
    assert violations(events) == ["rng_during_capture"]


# On a GPU only: what the simulation cannot show.


@pytest.mark.cuda
def test_a_copy_to_the_host_is_refused_on_cuda() -> None:
    """x.cpu() of a CUDA tensor inside an inspected capture is refused before it runs (a copy
    into pageable memory waits for the stream); the capture ends cleanly and replays."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(4.0, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
        with pytest.raises(cgguard.ImplicitSyncError) as refused:
            y.cpu()
    graph.replay()
    torch.cuda.synchronize()
    assert refused.value.event["api"] == "aten::_to_copy"
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.cuda
def test_a_freed_allocation_of_the_graphs_own_pool_is_not_a_dead_input() -> None:
    """A tensor allocated inside the capture below the dispatch mode (as compiled code does),
    read by a later op and then freed, lies in the graph's pool: its replays say nothing."""
    from torch.utils._python_dispatch import _disable_current_modes

    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(4.0, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with _disable_current_modes():
            hidden = x * 2  # not seen: no mode on the stack
        out = hidden + 1
        del hidden
    gc.collect()
    with capture_violations() as events:
        graph.replay()
    torch.cuda.synchronize()
    assert (events, out.tolist()) == ([], [1.0, 3.0, 5.0, 7.0])


@pytest.mark.cuda
def test_inductors_cudagraph_trees_capture_under_inspection() -> None:
    """mode="reduce-overhead" records its graphs through CUDAGraph.capture_begin, inspected
    like any capture: the compiled function's results are the eager ones, nothing reported."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(4.0, device="cuda")
    compiled = torch.compile(lambda t: torch.sin(t * 3), mode="reduce-overhead")
    with capture_violations() as events:
        results = [compiled(x).clone() for _ in range(3)]
    expected = torch.sin(x * 3)
    for result in results:
        torch.testing.assert_close(result, expected)
    assert events == []


@pytest.mark.simulated
def test_uninstall_during_an_inspected_capture_takes_the_mode_off(sim: Any) -> None:
    """uninstall() while this thread captures: the inspection's mode leaves the thread's
    stack, and the capture goes on as torch's own."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert torch._C._len_torch_dispatch_stack() == 1
        cgguard.uninstall()
        depth = torch._C._len_torch_dispatch_stack()
        torch.arange(2.0).sum().item()  # torch's own business now
    assert depth == 0


# Threads, forks, reconfigurations and the program's own modes


def _stack_depth() -> int:
    return int(torch._C._len_torch_dispatch_stack())


@pytest.mark.simulated
def test_a_relaxed_capture_ended_on_another_thread_leaves_no_mode_behind(sim: Any) -> None:
    """A relaxed capture that another thread ends: the capturing thread's next RNG call finds
    no capture open (nothing refused), and the mode is off its stack."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="relaxed")

    def end() -> None:
        with torch.cuda.stream(stream):
            graph.capture_end()

    ender = threading.Thread(target=end)
    ender.start()
    ender.join()
    with capture_violations() as events:
        torch.cuda.manual_seed(1)
    assert (events, _stack_depth()) == ([], 0)


@pytest.mark.simulated
def test_uninstall_on_another_thread_then_install_leaves_no_capture_judged(sim: Any) -> None:
    """uninstall() on another thread during an inspected capture, then install() again once
    the capture is over: this thread's RNG calls are not refused, and its stack is empty."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        other = threading.Thread(target=cgguard.uninstall)
        other.start()
        other.join()
        graph.capture_end()
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    with capture_violations() as events:
        torch.cuda.manual_seed(1)
    assert (events, _stack_depth()) == ([], 0)


@pytest.mark.simulated
def test_a_users_mode_left_inside_the_capture_leaves_the_stack_as_without_cgguard(
    sim: Any,
) -> None:
    """A mode entered before capture_begin and exited before capture_end: its own exit takes
    it off (not cgguard's mode), the rest of the capture is still inspected, and the stack is
    empty afterwards."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    user = Counting()
    with torch.cuda.stream(stream):
        user.__enter__()
        graph.capture_begin()
        user.__exit__(None, None, None)
        inside = _stack_depth()
        with pytest.raises(cgguard.ImplicitSyncError):
            torch.arange(3.0).sum().item()
        graph.capture_end()
    torch.arange(2.0).mul(2)
    assert (inside, _stack_depth(), user.ops) == (1, 0, [])


@pytest.mark.simulated
def test_inspection_turned_off_during_a_capture_stops_judging_it(sim: Any) -> None:
    """install(inspect=False) while a capture is inspected: the rest of it is not judged,
    as its RNG calls are not, and the mode leaves at capture_end."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    with capture_violations() as events:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            cgguard.install(cgguard.Config(inspect=False, log_file="/dev/null"))
            total = torch.arange(3.0).sum().item()  # torch's own business now
    assert (total, events, _stack_depth()) == (3.0, [], 0)


@pytest.mark.simulated
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_during_an_inspected_capture_has_no_mode_left(sim: Any) -> None:
    """fork() during an inspected capture: the child's (forking) thread has no dispatch mode
    left on its stack."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: a threaded fork
            pid = os.fork()
        if pid == 0:
            os._exit(10 + _stack_depth())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 10


# Inputs: re-captures, tensors made in the capture, out=


@pytest.mark.simulated
@pytest.mark.parametrize("reinstalled", [False, True], ids=["reconfigured", "reinstalled"])
def test_a_graph_re_captured_without_inspection_keeps_no_old_inputs(
    sim: Any, reinstalled: bool
) -> None:
    """A graph captured inspected, reset and captured again with inspection off, replayed once
    inspection is on again: the first capture's freed input is not its input any more, whether
    inspection went off by reconfiguring or by a fresh installation (whose capture path has
    never had an inspector of its own)."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x, y = torch.arange(3.0), torch.arange(3.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    if reinstalled:
        cgguard.uninstall()
    cgguard.install(cgguard.Config(log_file="/dev/null"))
    graph.reset()
    with torch.cuda.graph(graph):
        y.add_(1)
    del x
    gc.collect()
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    with capture_violations() as events:
        graph.replay()
    assert events == []


@pytest.mark.simulated
def test_a_tensor_the_capture_made_with_torch_tensor_is_not_an_input(sim: Any) -> None:
    """`x * torch.tensor(2.0)` inside the capture: the scalar is the capture's own (lifted by
    aten::lift_fresh), so its going away is no dead input."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(3.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * torch.tensor(2.0)
    gc.collect()
    with capture_violations() as events:
        graph.replay()
    assert events == []
    del y


@pytest.mark.simulated
def test_an_out_tensor_freed_after_the_capture_is_a_dead_input(sim: Any) -> None:
    """An out= tensor the capture writes into is one of its inputs: freed, the replay is
    refused."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x, out = torch.arange(3.0), torch.empty(3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.add(x, 1, out=out)
    del out
    gc.collect()
    with pytest.raises(cgguard.DeadInputError):
        graph.replay()


# Tensor subclasses


class Pair(torch.Tensor):
    """A wrapper tensor subclass in the shape of torch's own test one
    (torch/testing/_internal/two_tensor.py's TwoTensor), as DTensor, float8 and NF4 tensors are:
    no memory of its own, two inner tensors that __tensor_flatten__ names, each op run on both."""

    a: torch.Tensor
    b: torch.Tensor

    @staticmethod
    def __new__(cls, a: torch.Tensor, b: torch.Tensor) -> Pair:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[no-any-return]
            cls,
            a.shape,
            strides=a.stride(),
            storage_offset=a.storage_offset(),
            dtype=a.dtype,
            device=a.device,
            layout=a.layout,
        )

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.a, self.b = a, b

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["a", "b"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], *_: object) -> Pair:
        return Pair(inner["a"], inner["b"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        args_a, kwargs_a = pytree.tree_map_only(Pair, lambda p: p.a, (args, kwargs or {}))
        args_b, kwargs_b = pytree.tree_map_only(Pair, lambda p: p.b, (args, kwargs or {}))
        out_a, out_b = func(*args_a, **kwargs_a), func(*args_b, **kwargs_b)
        return Pair(out_a, out_b) if isinstance(out_a, torch.Tensor) else out_a


@pytest.mark.simulated
@pytest.mark.parametrize("wrapper_first", [True, False], ids=["wrapper-first", "wrapper-second"])
def test_a_tensor_read_beside_a_wrapper_subclass_is_held(
    sim: Any, capsys: pytest.CaptureFixture[str], wrapper_first: bool
) -> None:
    """A wrapper subclass (no memory of its own) beside a plain tensor, in either order: the
    plain tensor is still an input, and its freeing refuses the replay; no internal error."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    wrapped, x = Pair(torch.ones(3), torch.zeros(3)), torch.ones(2, 3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = torch.add(wrapped, x) if wrapper_first else torch.add(x, wrapped)
    graph.replay()
    del x
    gc.collect()
    with pytest.raises(cgguard.DeadInputError) as refused:
        graph.replay()
    described = "(a float32 tensor of shape (2, 3), first read" in refused.value.event["message"]
    assert (capsys.readouterr().err, described) == ("", True)
    del y, wrapped


@pytest.mark.simulated
def test_a_freed_inner_tensor_of_a_wrapper_subclass_is_a_dead_input(sim: Any) -> None:
    """The memory a wrapper subclass reads is its inner tensors' (its __tensor_flatten__): one
    freed after the capture refuses the replay."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    a, b = torch.ones(4), torch.zeros(4)
    wrapped = Pair(a, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = wrapped * 2
    graph.replay()
    wrapped.b = torch.zeros(4)  # the wrapper rebound: the graph still reads the old b
    del b
    gc.collect()
    with pytest.raises(cgguard.DeadInputError) as refused:
        graph.replay()
    assert "(a float32 tensor of shape (4,), first read" in refused.value.event["message"]
    del y, a


@pytest.mark.simulated
def test_a_wrapper_subclass_the_capture_made_holds_no_input(sim: Any) -> None:
    """A wrapper subclass an op of the capture returned holds the capture's own memory: read by
    a later op and let go, its inner tensors are no dead inputs; the two of the wrapper it was
    made from are."""
    cgguard.install(cgguard.Config(inspect=True, mode="log", log_file="/dev/null"))
    wrapped = Pair(torch.ones(4), torch.zeros(4))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        temporary = wrapped + 1
        out = temporary * 2
        del temporary
    del wrapped
    gc.collect()
    with capture_violations() as events:
        graph.replay()
    assert (violations(events), out.a.tolist(), out.b.tolist()) == (
        ["dead_input", "dead_input"],
        [4.0] * 4,
        [2.0] * 4,
    )


@pytest.mark.simulated
def test_a_wrapper_subclass_inside_another_is_looked_through(sim: Any) -> None:
    """A wrapper subclass whose inner tensor is a wrapper subclass (a DTensor of float8
    tensors): the innermost tensors are the inputs, and one freed refuses the replay."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    b = torch.zeros(2, 2)
    nested = Pair(Pair(torch.ones(2, 2), b), torch.ones(2, 2))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = nested * 2
    graph.replay()
    nested.a.b = torch.zeros(2, 2)
    del b
    gc.collect()
    with pytest.raises(cgguard.DeadInputError) as refused:
        graph.replay()
    assert "(a float32 tensor of shape (2, 2), first read" in refused.value.event["message"]
    del y


class Looped(Pair):
    """A wrapper subclass whose __tensor_flatten__ names itself: a look-through must stop."""

    flattened = 0

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        Looped.flattened += 1
        return ["itself", "b"], None

    @property
    def itself(self) -> Looped:
        return self


@pytest.mark.simulated
def test_a_wrapper_subclass_that_names_itself_is_looked_through_a_bounded_depth(
    sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrapper subclass that names itself among its inner tensors: the look-through stops at
    its bound (the wrapper and its nestings to that depth flattened, once each), with no
    internal error, and the inner tensor it names is still an input."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    b = torch.zeros(3)
    looped = Looped(torch.ones(3), b)
    Looped.flattened = 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = looped + 1
    flattened = Looped.flattened
    looped.b = torch.zeros(3)
    del b
    gc.collect()
    with pytest.raises(cgguard.DeadInputError):
        graph.replay()
    assert (capsys.readouterr().err, flattened) == ("", _mode._DEPTH + 1)
    del y


# Meta and fake tensors: no memory, no kernel


@pytest.fixture
def warn_always() -> Iterator[None]:
    """torch's own warnings each time, not once per process (torch.set_warn_always): the
    FakeTensor data_ptr warning comes from C++ once per process otherwise."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        yield
    finally:
        torch.set_warn_always(before)


@pytest.mark.simulated
def test_an_op_on_a_meta_tensor_is_no_implicit_sync(sim: Any) -> None:
    """A meta tensor runs no kernel on any device: torch.histc and nonzero on one inside a
    capture are let through, not reported, and the capture ends."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    meta = torch.ones(4, device="meta")
    # nonzero on meta is refused unless torch is told to assume every element is non-zero
    # (torch/_meta_registrations.py: nonzero).
    assume = torch.fx.experimental._config.patch(meta_nonzero_assume_all_nonzero=True)
    with capture_violations() as events, assume:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            counts, positions = torch.histc(meta), meta.nonzero()
    assert (events, counts.shape, positions.shape) == ([], (100,), (4, 1))


@pytest.mark.simulated
@pytest.mark.usefixtures("warn_always")
def test_fake_tensors_in_a_capture_are_not_read(sim: Any) -> None:
    """Fake tensors (torch's FakeTensorMode) have no memory: inside an inspected capture their
    data pointers are not read, so torch warns of no read, and none is an input."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.ones(4)
    with FakeTensorMode():
        fake = torch.ones(4)
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught, capture_violations() as events:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph):
            with FakeTensorMode(allow_non_fake_inputs=True):
                inside = torch.ones(4) * 2 + x
            doubled = fake * 2  # told by the fake tensor's own mode
            y = x * 2
        del fake, inside, doubled
        gc.collect()
        graph.replay()
    assert ([str(w.message) for w in caught], events, y.tolist()) == ([], [], [2.0] * 4)


@pytest.mark.simulated
def test_an_op_on_a_fake_tensor_is_no_implicit_sync(sim: Any) -> None:
    """A fake tensor runs no kernel on any device: torch.histc on one inside a capture is let
    through, not reported."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    with FakeTensorMode():
        fake = torch.ones(4)
    with capture_violations() as events:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            counts = torch.histc(fake)  # told by the fake tensor's own mode
    assert (events, counts.shape) == ([], (100,))


# What stands for a device tensor, and shallow stacks


def test_the_cuda_predicate_takes_any_argument() -> None:
    """An op's non-tensor arguments (torch.unique's bools) and sparse tensors are no device
    tensors to the sync table; a dense CPU tensor is not one either."""
    sparse = torch.zeros(3).to_sparse()
    assert [_patches._is_cuda(v) for v in (True, None, [1], sparse, torch.zeros(2))] == [False] * 5


def test_a_fake_or_meta_tensor_is_no_device_tensor_to_the_sync_table() -> None:
    """A fake CUDA tensor (its storage is meta) and a meta tensor run no kernel on any device:
    neither is a device tensor to the sync table, whatever device it says."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ones(3, device="cuda")
    meta = torch.ones(3, device="meta")
    assert (fake.is_cuda, [_patches._is_cuda(v) for v in (fake, meta)]) == (True, [False] * 2)


def test_the_sync_table_judges_torch_uniques_arguments_with_the_cuda_predicate() -> None:
    """torch.unique's aten::_unique2 gets bools beside its tensor: with the CUDA predicate a
    host call is judged not to synchronize, with no error."""
    op = SYNC_OPS["aten::_unique2"]
    assert syncs(op, (torch.zeros(3), True, False, False), {}, _patches._is_cuda) is False


@pytest.mark.simulated
def test_a_sparse_tensor_in_a_capture_is_no_internal_error(
    sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sparse tensor read inside an inspected capture has no storage to hold: it is passed
    over without a warning."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    sparse = torch.zeros(3).to_sparse()
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        doubled = sparse * 2
    assert (capsys.readouterr().err, doubled.to_dense().tolist()) == ("", [0.0] * 3)


def test_an_rng_call_at_a_scripts_top_level_during_a_capture_is_refused(tmp_path: Any) -> None:
    """torch.cuda.manual_seed at a script's top level (a shallow stack) during an inspected
    capture is refused, not an internal error."""
    script = tmp_path / "toplevel_rng.py"
    script.write_text(
        "import torch, cgguard\n"
        "from cgguard.testing import simulated_cuda\n"
        "sim = simulated_cuda(); sim.__enter__()\n"
        "cgguard.install(cgguard.Config(inspect=True, log_file='/dev/null'))\n"
        "torch.manual_seed(1)\n"
        "g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()\n"
        "torch.cuda.set_stream(s)\n"
        "g.capture_begin()\n"
        "try:\n"
        "    torch.cuda.manual_seed(2)\n"
        "except cgguard.RngDuringCaptureError:\n"
        "    print('refused', flush=True)\n"
        "import os; os._exit(0)  # the capture left open: no clean-up to run\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert (done.stdout, done.stderr) == ("refused\n", "")


@pytest.mark.simulated
def test_an_op_from_a_thread_with_no_python_frames_is_inspected(
    sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """An op dispatched to the mode from a thread with no Python frames of its own (as
    autograd's device threads call it): its input is held, with the stack there is (torch's
    _disable_dynamo wrapper's frames), and no internal error."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    x = torch.arange(3.0)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        watch = _process.PROCESS.inspections.captures()[-1]
        assert watch.inputs is not None
        seen = watch.inputs.seen
        # functools.partial is no Python frame: the mode's own is the thread's first.
        entry = functools.partial(watch.mode.__torch_dispatch__, torch.ops.aten.add.Tensor, ())
        _thread.start_new_thread(entry, ((x, x),))
        deadline = time.monotonic() + 20
        while x.untyped_storage().data_ptr() not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
    held = seen.get(x.untyped_storage().data_ptr())
    assert (type(held), capsys.readouterr().err) == (_liveness.Input, "")
