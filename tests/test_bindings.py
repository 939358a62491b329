"""Bindings: a graph replaying a tensor the program has rebound is refused (stale_binding); the
ways of updating weights in place stay silent."""

from __future__ import annotations

import functools
import gc
import sys
from typing import TYPE_CHECKING, Any

import pytest
import torch
from torch import nn

import cgguard
from cgguard._inspect.inspector import _INPUTS
from cgguard.testing import capture_violations

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from conftest import Runtime

HERE = __file__


def line_of(marker: str) -> int:
    """The line of this file that holds ``marker`` in a comment."""
    with open(HERE, encoding="utf-8") as source:
        for number, text in enumerate(source, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return number
    raise AssertionError(marker)


class Attention(nn.Module):
    """In vLLM's MLA layer's shape: a projection, and a tensor kept as a plain attribute that
    its process_weights_after_loading makes from the projection's weight."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4, device=device)
        self.W_UV = torch.ones(4, 4, device=device)
        self.register_buffer("sinks", torch.zeros(4, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.proj(x) @ self.W_UV) + self.sinks

    def process_weights_after_loading(self) -> None:
        # What vllm PR 48251 found: a new tensor bound after capture, not copied into.
        self.W_UV = self.proj.weight.detach().t().contiguous()  # @rebinds


class Model(nn.Module):
    def __init__(self, device: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Attention(device) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Runner:
    """A model runner: its model, a static input and a graph, kept as attributes."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.model = Model(device)
        self.x = torch.zeros(2, 4, device=device)
        self.graph = torch.cuda.CUDAGraph()

    def capture(self) -> None:
        with torch.no_grad(), torch.cuda.graph(self.graph):  # @captures
            self.y = self.model(self.x)


@pytest.fixture
def runner(runtime: Runtime) -> Runner:
    """A runner whose graph was captured under inspection (raise mode) and replayed once."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    made = Runner(runtime.device)
    made.capture()
    made.graph.replay()
    return made


def refusal(runner: Runner) -> cgguard.StaleBindingError:
    with pytest.raises(cgguard.StaleBindingError) as refused:
        runner.graph.replay()  # @replays
    return refused.value


REBINDINGS: dict[str, Callable[[Runner], object]] = {
    "module.w = nn.Parameter(...)": lambda r: setattr(
        r.model.layers[0].proj, "weight", nn.Parameter(torch.ones(4, 4, device=r.device))
    ),
    "p.data = q": lambda r: setattr(
        r.model.layers[0].proj.weight, "data", torch.ones(4, 4, device=r.device)
    ),
    "module.to(dtype)": lambda r: r.model.to(torch.float64),
    "self.x = self.x.to(...)": lambda r: setattr(
        r.model.layers[1], "W_UV", r.model.layers[1].W_UV.to(torch.float64)
    ),
    "load_state_dict(assign=True)": lambda r: r.model.load_state_dict(
        {k: v.clone() for k, v in r.model.state_dict().items()}, assign=True
    ),
    "process_weights_after_loading": lambda r: r.model.layers[0].process_weights_after_loading(),
    "a buffer replaced": lambda r: setattr(
        r.model.layers[1], "sinks", r.model.layers[1].sinks.to(torch.float32) + 0
    ),
    "the static input replaced": lambda r: setattr(r, "x", torch.ones(2, 4, device=r.device)),
}


@pytest.mark.parametrize("rebind", list(REBINDINGS.values()), ids=list(REBINDINGS))
def test_a_name_rebound_after_capture_refuses_the_replay(
    runner: Runner, rebind: Callable[[Runner], object]
) -> None:
    """Each way of rebinding a name the graph read refuses the next replay, before it runs,
    naming the name (from the runner, through modules, module lists and attributes); in log
    mode it is logged and the graph replays."""
    rebind(runner)
    if rebind is REBINDINGS["the static input replaced"]:
        cgguard.check_bindings()  # an attribute of a plain object: seen by the explicit check
    error = refusal(runner)
    assert error.event["rule"] == "stale_binding"
    assert "Runner." in error.event["message"]


def test_the_refusal_says_what_changed_where_and_where_it_was_rebound(runner: Runner) -> None:
    """The message names the binding, the change in words, the capture's site, the replay's
    line and where the name was rebound; the event holds the rebinding's stack."""
    runner.model.layers[0].process_weights_after_loading()
    message = refusal(runner).event["message"]
    event = refusal(runner).event  # refused again: a refusal is not forgotten
    assert (
        f"CUDAGraph.replay at {HERE}:{line_of('@replays')} (in refusal) replays a graph whose "
        f"capture begun at {HERE}:{line_of('@captures')} (in capture) via torch.cuda.graph read "
        "Runner.model.layers.0.W_UV, which now holds another tensor (another storage:"
    ) in message
    assert f"rebound at {HERE}:{line_of('@rebinds')} (in process_weights_after_loading)" in message
    assert event["rebound_stack"][-1]["line"] == line_of("@rebinds")


def test_a_dict_item_and_a_partial_argument_are_named_and_checked_on_request(
    runtime: Runtime,
) -> None:
    """A tensor kept in a dict and one bound into a functools.partial, on a plain object: a
    rebinding there moves nothing cgguard hooks, so check_bindings() finds it (returning
    and logging it, never raising), and the next replay is refused."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))

    class Kernels:
        def __init__(self) -> None:
            self.tables = {"scale": torch.ones(4, device=runtime.device)}
            self.op = functools.partial(torch.mul, torch.full((4,), 2.0, device=runtime.device))

    kernels = Kernels()
    x = torch.ones(4, device=runtime.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # @dict-partial
        y = kernels.op(x) * kernels.tables["scale"]
    graph.replay()
    kernels.tables["scale"] = torch.ones(4, device=runtime.device)
    kernels.op = functools.partial(torch.mul, torch.full((4,), 3.0, device=runtime.device))
    with capture_violations() as events:
        stale = cgguard.check_bindings()
    names = sorted(binding.name for binding in stale)
    with pytest.raises(cgguard.StaleBindingError):
        graph.replay()
    assert (names, [e["action"] for e in events]) == (
        ["kernels.op.args[0]", "kernels.tables['scale']"],
        ["logged", "logged"],
    )
    function = "test_a_dict_item_and_a_partial_argument_are_named_and_checked_on_request"
    assert {(binding.site, binding.change[:25]) for binding in stale} == {
        (f"{HERE}:{line_of('@dict-partial')} (in {function})", "now holds another tensor "),
    }
    del y


def test_a_closure_is_looked_into(runtime: Runtime) -> None:
    """A tensor held in a closure (a kernel made by a factory) is named through it."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))

    def make(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        def kernel(x: torch.Tensor) -> torch.Tensor:
            return x * weight

        return kernel

    class Holder:
        pass

    holder = Holder()
    holder.kernel = make(torch.ones(4, device=runtime.device))  # type: ignore[attr-defined]
    x = torch.ones(4, device=runtime.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = holder.kernel(x)  # type: ignore[attr-defined]
    holder.kernel = make(torch.ones(4, device=runtime.device))  # type: ignore[attr-defined]
    stale = cgguard.check_bindings()
    assert [binding.name for binding in stale] == ["holder.kernel.<closure weight>"]
    del y


def _copied_under_no_grad(runner: Runner) -> None:
    with torch.no_grad():
        for p in runner.model.parameters():
            p.data.copy_(torch.full_like(p, 0.5))


SILENT: dict[str, Callable[[Runner], object]] = {
    "copy_()": lambda r: r.model.layers[0].proj.weight.data.copy_(torch.ones(4, 4)),
    "load_state_dict()": lambda r: r.model.load_state_dict(
        {k: v.clone() for k, v in r.model.state_dict().items()}
    ),
    "no_grad p.data.copy_(q)": _copied_under_no_grad,
    "static input copied into": lambda r: r.x.copy_(torch.ones(2, 4)),
}


@pytest.mark.parametrize("update", list(SILENT.values()), ids=list(SILENT))
def test_updates_in_place_stay_silent(runner: Runner, update: Callable[[Runner], object]) -> None:
    """Copying into the tensors the graph reads is how a reload should go: no violation, at
    replay nor from check_bindings()."""
    update(runner)
    with capture_violations() as events:
        runner.graph.replay()
        stale = cgguard.check_bindings()
        runner.graph.replay()
    assert (events, stale) == ([], [])


def test_a_new_capture_after_the_rebind_binds_the_new_tensor(runner: Runner) -> None:
    """Captured again after the rebind, the new graph reads the new tensor: it replays
    silently; the old graph is still refused."""
    runner.model.layers[0].process_weights_after_loading()
    old = runner.graph
    runner.graph = torch.cuda.CUDAGraph()
    runner.capture()
    with capture_violations() as events:
        runner.graph.replay()
    with pytest.raises(cgguard.StaleBindingError):
        old.replay()
    assert events == []


def test_a_rebound_name_whose_old_tensor_was_freed_is_told_as_stale(runner: Runner) -> None:
    """The old tensor freed too: the name says more than dead_input would, so stale_binding
    is what refuses the replay."""
    layer = runner.model.layers[1]
    layer.W_UV = torch.ones(4, 4, device=runner.device)
    gc.collect()
    assert refusal(runner).event["message"].count("Runner.model.layers.1.W_UV") == 1


def test_log_mode_logs_once_and_replays(runtime: Runtime) -> None:
    """In log mode a stale binding is logged at the first replay after it, once."""
    cgguard.install(cgguard.Config(inspect=True, mode="log", log_file="/dev/null"))
    runner = Runner(runtime.device)
    runner.capture()
    runner.model.layers[0].process_weights_after_loading()
    with capture_violations() as events:
        runner.graph.replay()
        runner.graph.replay()
    assert [(e["rule"], e["action"]) for e in events] == [("stale_binding", "logged")]


def test_an_unchanged_epoch_resolves_nothing_at_replay(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay whose epoch has not moved since its bindings' check resolves no name: the cost
    of a healthy replay is its two tests."""
    from cgguard._inspect import bindings

    resolved: list[str] = []
    real = bindings.changed

    def counting(named: list[Any], *args: Any) -> Any:
        resolved.extend(binding.name for binding in named)
        return real(named, *args)

    monkeypatch.setattr(bindings, "changed", counting)
    for _ in range(3):
        runner.graph.replay()
    quiet = len(resolved)
    runner.model.layers[0].proj.weight.data.copy_(torch.ones(4, 4))  # no rebinding
    runner.model.layers[0].sinks = runner.model.layers[0].sinks  # a setattr moves the epoch
    runner.graph.replay()
    runner.graph.replay()
    assert (quiet, len(resolved) > 0, len(set(resolved)) == len(resolved)) == (0, True, True)


def test_an_input_no_name_reaches_is_left_to_dead_input(runtime: Runtime) -> None:
    """A tensor only a local variable of the capture's frame holds has no name to rebind:
    nothing to check, and freeing it is dead_input's."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    local = torch.ones(4, device=runtime.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = local * 2
    del local
    gc.collect()
    with pytest.raises(cgguard.DeadInputError):
        graph.replay()
    assert cgguard.check_bindings() == []
    del y


WORKER = """\
class Worker:
    def __init__(self, runner):
        self.runner = runner

    def reload_weights(self):
        self.runner.model.layers[0].process_weights_after_loading()
        return "reloaded"
"""


def test_a_lifecycle_function_checks_the_bindings_after_it_returns(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile's lifecycle function (a weight reload), wrapped once its module is imported:
    after it returns, a stale binding is logged, naming the function, and never raised into
    it; the next replay is refused under the mode. uninstall() puts the function back."""
    from cgguard._gate.profiles import Profile
    from cgguard._inspect import inspector

    entry = "lifeworker.worker:Worker.reload_weights"
    monkeypatch.setattr(inspector, "PROFILES", (Profile("fw", "fw", (), (), (entry,)),))
    (tmp_path / "lifeworker").mkdir()
    (tmp_path / "lifeworker" / "__init__.py").write_text("")
    (tmp_path / "lifeworker" / "worker.py").write_text(WORKER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lifeworker", raising=False)
    monkeypatch.delitem(sys.modules, "lifeworker.worker", raising=False)
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    import lifeworker.worker as module  # type: ignore[import-not-found]

    original = module.Worker.reload_weights.__wrapped__
    runner = Runner(runtime.device)
    runner.capture()
    with capture_violations() as events:
        result = module.Worker(runner).reload_weights()
    with pytest.raises(cgguard.StaleBindingError):
        runner.graph.replay()
    cgguard.uninstall()
    assert (result, [(e["rule"], e["action"], e["api"]) for e in events]) == (
        "reloaded",
        [("stale_binding", "logged", entry)],
    )
    assert vars(module.Worker)["reload_weights"] is original


def test_bindings_kept_fails_a_block_that_rebinds_and_passes_one_that_copies(
    runner: Runner,
) -> None:
    """The pytest helper: a block that rebinds a name a graph reads fails with the refusal's
    message; one that copies into the old tensors passes."""
    from cgguard.testing import bindings_kept

    with bindings_kept():
        runner.model.load_state_dict({k: v.clone() for k, v in runner.model.state_dict().items()})
    with pytest.raises(AssertionError) as failed, bindings_kept():
        runner.model.layers[1].process_weights_after_loading()
    assert str(failed.value).startswith("Stale binding: cgguard.check_bindings at ")
    assert "read Runner.model.layers.1.W_UV, which now holds another tensor" in str(failed.value)


def test_naming_runs_no_code_of_the_objects_it_walks(runtime: Runtime) -> None:
    """A proxy whose __getattr__ makes a new object for any name asked (execnet's, a mock),
    and a property, among the capture's variables: the walk reads instance dicts as object
    does, and calls neither."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    asked: list[str] = []

    class Proxy:
        def __getattr__(self, name: str) -> Any:
            asked.append(name)
            return Proxy()

    class Owner:
        def __init__(self) -> None:
            self.weight = torch.ones(4, device=runtime.device)

        @property
        def computed(self) -> torch.Tensor:
            asked.append("computed")
            return self.weight

    proxy, owner = Proxy(), Owner()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = owner.weight * 2
    names = [b.name for b in graph.__dict__[_INPUTS].bindings]
    assert (asked, names) == ([], ["owner.weight"])
    del y, proxy


@pytest.mark.simulated
def test_a_compiled_function_that_sets_attributes_keeps_its_graph_whole(sim: Any) -> None:
    """The rebinding hooks are transparent to torch.compile: a compiled function that reads a
    tensor's .data and sets a module attribute compiles without a graph break (dynamo would
    otherwise trace the hook's frame walk, and warn); what it rebinds is check_bindings()'s."""
    from torch._dynamo.utils import counters

    cgguard.install(cgguard.Config(inspect=True, mode="log", log_file="/dev/null"))
    torch._dynamo.reset()
    counters.clear()
    layer = nn.Linear(4, 4)
    layer.extra = torch.zeros(2, 4)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer.extra + 1

    @torch.compile(backend="eager")
    def step(x: torch.Tensor) -> torch.Tensor:
        layer.extra = x * 2
        return x @ layer.weight.data + layer.extra

    try:
        out = step(torch.ones(2, 4))
        stale = [binding.name for binding in cgguard.check_bindings()]
        assert (dict(counters["graph_break"]), out.shape, stale) == (
            {},
            torch.Size([2, 4]),
            ["layer.extra"],
        )
    finally:
        torch._dynamo.reset()
    del y


@pytest.fixture
def sim() -> Any:
    from cgguard.testing import simulated_cuda

    with simulated_cuda() as runtime:
        yield runtime


class _Reload:
    """A callable object a class keeps as its method: called without binding."""

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        return args


class _Runner:
    reload_weights = _Reload()


def test_a_lifecycle_function_held_as_a_callable_object_stays_unbound() -> None:
    """A lifecycle entry naming a callable object a class holds is wrapped as windows wrap one:
    still called without the instance, and checked after it returns."""
    from cgguard._inspect.lifecycle import Lifecycle

    checked: list[str] = []
    lifecycle = Lifecycle(checked.append)
    entry = f"{__name__}:_Runner.reload_weights"
    lifecycle.watch((entry,))
    try:
        assert (_Runner().reload_weights(1), checked) == ((1,), [entry])
    finally:
        lifecycle.undo()
    assert type(vars(_Runner)["reload_weights"]) is _Reload
