"""cgguard.testing._simdevice: GPU code's requests for CUDA memory, given host memory on the
simulated CUDA runtime, and torch.cuda's device calls answered for its one device."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from helpers import clean_environ
from torch.overrides import TorchFunctionMode

import cgguard
from cgguard.testing import capture_violations, simulated_cuda
from cgguard.testing._simcuda import SimulatedCudaError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from cgguard.testing import SimulatedCuda

pytest_plugins = ["pytester"]
pytestmark = [
    pytest.mark.simulated,
    # Inductor's first import reaches torch/utils/mkldnn.py, which uses the deprecated decorator.
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

REPO = Path(__file__).resolve().parent.parent
HOST = torch.device("cpu")
DEVICE_NAME = "cgguard simulated CUDA device (no GPU)"
# What torch raises for a CUDA error: torch.AcceleratorError where this torch has it.
CUDA_ERROR_TYPE: type[RuntimeError] = getattr(torch, "AcceleratorError", RuntimeError)


def ordinal(index: int) -> str:
    return (
        f"CUDA error: invalid device ordinal (cuda:{index}; cgguard's simulated CUDA runtime has "
        "one device, cuda:0) [simulated CUDA]"
    )


@pytest.fixture(autouse=True)
def no_mode_left() -> Iterator[None]:
    """Fail any test that leaves a function mode on this thread's stack."""
    yield
    assert torch._C._len_torch_function_stack() == 0


@pytest.fixture
def sim() -> Iterator[SimulatedCuda]:
    """An active simulated runtime, torch restored afterwards."""
    with simulated_cuda() as runtime:
        yield runtime


def failure(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    """The type and message of what ``call`` raises where torch has no CUDA: an AssertionError
    on a CPU-only build, a RuntimeError without a driver."""
    with pytest.raises((AssertionError, RuntimeError)) as info:
        call()
    return type(info.value), str(info.value)


def linear(weight: float, bias: float) -> torch.nn.Linear:
    """A 2 -> 1 linear layer of known weights."""
    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.fill_(weight)
        layer.bias.fill_(bias)
    return layer


# --- GPU code as written --------------------------------------------------------------------

FORMS: dict[str, Callable[[], torch.Tensor]] = {
    "factory": lambda: torch.zeros(4, device="cuda"),
    "cuda_method": lambda: torch.arange(4.0).cuda(),
    "to_cuda_0": lambda: torch.arange(4.0).to("cuda:0"),
    "torch_device": lambda: torch.full((4,), 2.0, device=torch.device("cuda", 0)),
    "model_cuda": lambda: linear(1.0, 0.5).cuda()(torch.ones(1, 2, device="cuda")).flatten(),
}


@pytest.mark.parametrize("form", FORMS)
def test_gpu_codes_requests_for_cuda_memory_get_host_memory(sim: SimulatedCuda, form: str) -> None:
    """torch.zeros(device="cuda"), .cuda(), .to("cuda:0"), torch.device("cuda", 0) and
    model.cuda() run unchanged: their tensors are CPU tensors with the values asked for."""
    expected = {
        "factory": [0.0] * 4,
        "cuda_method": [0.0, 1.0, 2.0, 3.0],
        "to_cuda_0": [0.0, 1.0, 2.0, 3.0],
        "torch_device": [2.0] * 4,
        "model_cuda": [2.5],
    }
    made = FORMS[form]()
    assert (made.device, made.is_cuda, made.tolist()) == (HOST, False, expected[form])


def test_a_model_moved_with_cuda_computes_what_it_computes_on_the_host(sim: SimulatedCuda) -> None:
    """model.cuda() keeps its Parameter objects and their values; forward and backward on
    device tensors give the host model's outputs and gradients."""
    torch.manual_seed(0)
    host = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    model = copy.deepcopy(host)
    params = list(model.parameters())
    assert model.cuda() is model
    inputs = torch.arange(6.0).reshape(2, 3)
    model(inputs.cuda()).sum().backward()
    host(inputs).sum().backward()
    assert [p is q for p, q in zip(params, model.parameters(), strict=True)] == [True] * 4
    assert [(p.device, p.tolist(), p.grad.tolist()) for p in model.parameters()] == [
        (HOST, p.tolist(), p.grad.tolist()) for p in host.parameters()
    ]


MOVES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "cuda": lambda t: t.cuda(),
    "cuda_0": lambda t: t.cuda(0),
    "to": lambda t: t.to("cuda"),
    "to_device": lambda t: t.to(torch.device("cuda", 0)),
    "to_dtype": lambda t: t.to("cuda", torch.float64),
    "to_keywords": lambda t: t.to(device="cuda", dtype=torch.float16, non_blocking=True),
    "to_index": lambda t: t.to(0),
    "pin_memory": torch.Tensor.pin_memory,
}


@pytest.mark.parametrize("move", MOVES)
def test_a_move_to_the_device_gets_new_memory(sim: SimulatedCuda, move: str) -> None:
    """A move to the device copies, as a host tensor's does on a GPU: writing to the copy
    leaves the host tensor as it was; the dtype asked for is the copy's."""
    dtypes = {"to_dtype": torch.float64, "to_keywords": torch.float16}
    host = torch.arange(4.0)
    moved = MOVES[move](host)
    moved.add_(1)
    assert (moved.device, moved.dtype, moved.tolist(), host.tolist()) == (
        HOST,
        dtypes.get(move, torch.float32),
        [1.0, 2.0, 3.0, 4.0],
        [0.0, 1.0, 2.0, 3.0],
    )


def test_a_move_to_the_device_passes_gradients_back(sim: SimulatedCuda) -> None:
    """The copy a move makes is part of autograd's graph, as torch's own copy is."""
    leaf = torch.ones(3, requires_grad=True)
    (leaf.cuda() * torch.arange(3.0, device="cuda")).sum().backward()
    assert leaf.grad is not None
    assert leaf.grad.tolist() == [0.0, 1.0, 2.0]


def test_pinned_memory_requests_get_plain_host_memory(sim: SimulatedCuda) -> None:
    """pin_memory=True, which a CPU-only torch refuses without an accelerator, gives host
    memory: nothing is pinned, as is_pinned() says."""
    made = [torch.zeros(2, pin_memory=True), torch.empty(2, device="cuda", pin_memory=False)]
    assert [(t.device, t.is_pinned()) for t in made] == [(HOST, False)] * 2


def test_the_default_device_cuda_gets_host_memory(sim: SimulatedCuda) -> None:
    """torch.set_default_device("cuda") and `with torch.device("cuda"):` make host tensors,
    parameters included."""
    torch.set_default_device("cuda")
    try:
        default = [torch.zeros(2).device, torch.nn.Linear(2, 2).weight.device]
    finally:
        torch.set_default_device(None)
    with torch.device("cuda"):
        scoped = torch.ones(2).device
    assert [*default, scoped] == [HOST] * 3


def test_a_fake_tensor_keeps_the_cuda_device_it_asks_for(sim: SimulatedCuda) -> None:
    """Under a FakeTensorMode a CUDA tensor needs no CUDA: it is made as asked, where a real
    one gets host memory."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ones(3, device="cuda")
    real = torch.ones(3, device="cuda")
    assert (fake.device, real.device) == (torch.device("cuda", 0), HOST)


def test_a_mode_of_the_programs_sees_the_request_as_written() -> None:
    """A function mode the program pushes sits above the simulation's: it sees device="cuda",
    and its tensor is made in host memory; it stays on the stack after the simulation ends."""
    seen: list[object] = []

    class Seen(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if func is torch.zeros:
                seen.append(kwargs.get("device"))
            return func(*args, **kwargs)

    mode = Seen()
    with simulated_cuda():
        mode.__enter__()
        made = torch.zeros(1, device="cuda")
    try:
        stack = torch.overrides._get_current_function_mode_stack()
    finally:
        mode.__exit__(None, None, None)
    assert (seen, made.device, stack) == (["cuda"], HOST, [mode])


def test_after_the_simulation_cuda_requests_fail_as_before() -> None:
    """The simulation leaves torch as it found it: a CUDA request fails as it did before."""
    before = failure(lambda: torch.zeros(1, device="cuda"))
    with simulated_cuda():
        during = torch.zeros(1, device="cuda").device
    assert (during, failure(lambda: torch.zeros(1, device="cuda"))) == (HOST, before)


# --- torch.cuda's device calls --------------------------------------------------------------


def test_the_device_calls_answer_for_one_simulated_device(sim: SimulatedCuda) -> None:
    """GPU code's device calls run: one current device, cuda:0, named as simulated, with no
    memory in use; torch.cuda.is_available() and device_count() say what torch's own
    subsystems must read to stay on their CPU paths."""
    answers = {
        "is_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count(),
        "current_device": torch.cuda.current_device(),
        "set_device": torch.cuda.set_device(0),
        "device_context": torch.cuda.device(0).__enter__(),
        "get_device_name": torch.cuda.get_device_name(),
        "get_device_name_0": torch.cuda.get_device_name("cuda:0"),
        "synchronize": torch.cuda.synchronize(),
        "reset_peak_memory_stats": torch.cuda.reset_peak_memory_stats(),
        "memory_allocated": torch.cuda.memory_allocated(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "elapsed_time": elapsed(),
    }
    assert answers == {
        "is_available": False,
        "device_count": 0,
        "current_device": 0,
        "set_device": None,
        "device_context": None,
        "get_device_name": DEVICE_NAME,
        "get_device_name_0": DEVICE_NAME,
        "synchronize": None,
        "reset_peak_memory_stats": None,
        "memory_allocated": 0,
        "max_memory_allocated": 0,
        "elapsed_time": 0.0,
    }


def elapsed() -> float:
    """torch.cuda.Event timing as GPU code writes it, around device work."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.ones(4, device="cuda").sum()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end))


SECOND_DEVICE: dict[str, Callable[[], object]] = {
    "factory": lambda: torch.zeros(1, device="cuda:1"),
    "cuda": lambda: torch.zeros(1).cuda(1),
    "to": lambda: torch.zeros(1).to(torch.device("cuda", 1)),
    "set_device": lambda: torch.cuda.set_device(1),
    "device_context": lambda: torch.cuda.device(1).__enter__(),
    "get_device_name": lambda: torch.cuda.get_device_name(1),
}


@pytest.mark.parametrize("call", SECOND_DEVICE)
def test_a_device_other_than_cuda_0_is_refused_as_cuda_refuses_it(
    sim: SimulatedCuda, call: str
) -> None:
    """cuda:1 is refused with CUDA's invalid-ordinal error, naming the simulation's one device."""
    with pytest.raises(SimulatedCudaError) as refused:
        SECOND_DEVICE[call]()
    assert (isinstance(refused.value, CUDA_ERROR_TYPE), str(refused.value)) == (True, ordinal(1))


def test_a_thread_started_during_the_simulation_is_served(sim: SimulatedCuda) -> None:
    """A thread that threading starts while the simulation lasts gets host memory too."""
    made: list[torch.device] = []
    worker = threading.Thread(target=lambda: made.append(torch.zeros(1, device="cuda").device))
    worker.start()
    worker.join()
    assert made == [HOST]


def test_a_thread_started_before_the_simulation_is_refused_in_one_line() -> None:
    """A thread already running when the simulation began is not reached: its request fails
    with torch's type, in one line that names the simulation and the thread."""
    go, done = threading.Event(), threading.Event()
    outcome: list[tuple[type[BaseException], str]] = []

    def early() -> None:
        go.wait(timeout=20)
        outcome.append(failure(lambda: torch.zeros(1, device="cuda")))
        done.set()

    without = failure(lambda: torch.zeros(1, device="cuda"))
    worker = threading.Thread(target=early, name="early")
    worker.start()
    with simulated_cuda():
        go.set()
        assert done.wait(timeout=20)
    worker.join()
    kind, message = without
    assert outcome == [
        (
            kind,
            "cgguard's simulated CUDA runtime cannot serve a CUDA tensor on thread 'early': it "
            "serves the thread that began it and the threads started after, and this one began "
            f"before ({message})",
        )
    ]


# --- What runs on such tensors --------------------------------------------------------------


def test_compile_makes_one_graph_of_a_function_that_asks_for_cuda_memory(
    sim: SimulatedCuda,
) -> None:
    """torch.compile(fullgraph=True) traces the simulation's rewrite into its graph: a
    function that makes and moves device tensors compiles whole and computes what it does
    eagerly."""

    def step(x: torch.Tensor) -> torch.Tensor:
        return x.cuda() * 2 + torch.ones(4, device="cuda").to("cuda:0")

    x = torch.arange(4.0, device="cuda")
    compiled = torch.compile(step, fullgraph=True)
    assert compiled(x).tolist() == step(x).tolist() == [1.0, 3.0, 5.0, 7.0]


def test_reduce_overhead_runs_on_simulated_device_tensors(sim: SimulatedCuda) -> None:
    """mode="reduce-overhead" on such tensors compiles for the CPU and skips inductor's
    cudagraphs, counting the skip, as torch does for CPU tensors."""
    from torch._dynamo.utils import counters

    skips = counters["inductor"]["cudagraph_skips"]
    compiled = torch.compile(lambda t: torch.sin(t) * 3, mode="reduce-overhead")
    x = torch.arange(4.0, device="cuda")
    results = [compiled(x).tolist() for _ in range(3)]
    assert (results, counters["inductor"]["cudagraph_skips"] - skips) == (
        [(torch.sin(x) * 3).tolist()] * 3,
        1,
    )


def test_gloo_all_reduces_a_device_tensor(sim: SimulatedCuda, tmp_path: Path) -> None:
    """torch.distributed over gloo takes a device tensor as the CPU tensor it is: an
    all_reduce in a one-process group."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        tensor = torch.arange(3.0, device="cuda")
        dist.all_reduce(tensor)
        backend = dist.get_backend()
    finally:
        dist.destroy_process_group()
    assert (backend, tensor.tolist()) == ("gloo", [0.0, 1.0, 2.0])


def test_inspection_refuses_item_of_a_device_tensor_in_a_simulated_capture(
    sim: SimulatedCuda,
) -> None:
    """With inspection on, .item() of a tensor made with device="cuda" inside a simulated
    capture is an implicit synchronize; moving a tensor to the device there, and a compiled
    function, are not."""
    cgguard.install(cgguard.Config(inspect=True, log_file=os.devnull))
    static = torch.ones(4, device="cuda")
    compiled = torch.compile(lambda t: t * 3)
    graph = torch.cuda.CUDAGraph()
    with capture_violations() as events, torch.cuda.graph(graph):
        doubled = static.cuda() * 2
        moved = doubled.to("cuda", non_blocking=True)
        tripled = compiled(moved)
        with pytest.raises(cgguard.ImplicitSyncError) as refused:
            doubled.sum().item()
    assert (refused.value.event["api"], [e["rule"] for e in events], tripled.tolist()) == (
        "aten::_local_scalar_dense",
        ["implicit_sync"],
        [6.0] * 4,
    )


def test_the_census_counts_a_capture_of_device_tensors(sim: SimulatedCuda) -> None:
    """The census counts a capture of tensors made with device="cuda", ended."""
    cgguard.install(cgguard.Config(log_file=os.devnull))
    static = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.mul_(2)
    graph.replay()
    (site,) = cgguard.census()["captures"]
    assert (site["count"], site["outcomes"]["ended"], static.tolist()) == (1, 1, [2.0] * 4)


# --- The simulation switched on for a process or a session ---------------------------------

GPU_TEST = """
    import torch


    def test_gpu_code_as_written():
        model = torch.nn.Linear(2, 1).cuda()
        x = torch.ones(3, 2, device="cuda")
        out = model(x.to("cuda:0"))
        torch.cuda.synchronize()
        assert (out.shape, torch.cuda.current_device(), torch.cuda.get_device_name()) == (
            torch.Size([3, 1]),
            0,
            "cgguard simulated CUDA device (no GPU)",
        )
"""


@pytest.mark.subprocess
def test_pytest_simulate_cuda_runs_gpu_code_as_written(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest --cgguard --cgguard-simulate-cuda: a test written for a GPU passes."""
    for name in list(os.environ):
        if name.startswith("CGGUARD_"):
            monkeypatch.delenv(name)  # the plugin alone switches cgguard on
    pytester.makepyfile(test_gpu=GPU_TEST)
    result = pytester.runpytest_subprocess(
        "-p", "no:hypothesispytest", "--cgguard", "--cgguard-simulate-cuda"
    )
    result.assert_outcomes(passed=1)


GPU_SCRIPT = """
import torch

model = torch.nn.Linear(2, 1).cuda()
x = torch.ones(3, 2, device="cuda")
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    out = model(x)
graph.replay()
print(out.shape[0], x.device, x.is_cuda, torch.cuda.current_device())
"""


@pytest.mark.subprocess
def test_cgguard_run_simulate_cuda_runs_gpu_code_as_written(tmp_path: Path) -> None:
    """cgguard run --simulate-cuda: a GPU script runs as written, its tensors on the host."""
    script = tmp_path / "gpu_script.py"
    script.write_text(textwrap.dedent(GPU_SCRIPT))
    done = subprocess.run(
        [sys.executable, "-m", "cgguard", "run", "--simulate-cuda", str(script)],
        cwd=tmp_path,
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "3 cpu False 0\n"), done.stderr


def test_the_demo_asks_for_cuda_memory_as_gpu_code_does() -> None:
    """The README's demo makes its tensor with device="cuda", with no fallback to the CPU."""
    source = (REPO / "examples" / "vllm_failures.py").read_text().splitlines()
    assert [line.strip() for line in source if "device" in line or "is_available" in line] == [
        'x = torch.zeros(8, device="cuda")'
    ]


THREADED = """
import threading, torch
from cgguard.testing import simulated_cuda

def work():
    torch.ones(4, device="cuda") * 2

with simulated_cuda():
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
"""


@pytest.mark.subprocess
def test_a_served_thread_ends_without_taking_the_process_down(tmp_path: Path) -> None:
    """A thread the simulation served takes its mode off as it ends: a mode left in torch's
    thread-local stack is released when the thread's storage is torn down, which, racing the
    interpreter's exit, aborted the process ("terminate called without an active
    exception"), about one run in three on a busy machine: run sixteen times, four at once."""
    script = tmp_path / "served_thread.py"
    script.write_text(THREADED)
    statuses: list[tuple[int, str]] = []
    for _ in range(4):
        runs = [
            subprocess.Popen(
                [sys.executable, str(script)],
                env=clean_environ(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        for run in runs:
            _, err = run.communicate(timeout=120)
            statuses.append((run.returncode, err))
    assert statuses == [(0, "")] * 16
