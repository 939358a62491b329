"""install() and uninstall(): patched once, restored exactly, before or after torch's import."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import wrapt
from helpers import SourceFile, patched_count, standin_hooks, torch_entry_points, tracker

import cgguard
from cgguard import _process
from cgguard._core import hooks as _hooks
from cgguard._core import patches as _patches
from cgguard._gate.profiles import ProfileInfo
from cgguard._gate.windows import WindowInfo
from cgguard._install import CaptureInfo
from cgguard.testing import _simcuda, active_simulation, simulated_cuda

ENTRY_POINTS = torch_entry_points()
CUDA_BUILT = torch.backends.cuda.is_built()
# torch's own device synchronize, which only CUDA builds have (CPU builds get the simulated
# runtime's while it is in place).
DEVICE_SYNC = ("torch._C._cuda_synchronize",) if CUDA_BUILT else ()
STANDIN_HOOKS = tuple(standin_hooks())


def entry_points() -> dict[str, object]:
    """torch's capture entry points, exactly as the classes hold them now."""
    graph, cuda_graph = torch.cuda.graphs.graph, torch.cuda.graphs.CUDAGraph
    return {
        "graph.__enter__": graph.__dict__.get("__enter__"),
        "graph.__exit__": graph.__dict__.get("__exit__"),
        "CUDAGraph.capture_begin": cuda_graph.__dict__.get("capture_begin"),
        "CUDAGraph.capture_end": cuda_graph.__dict__.get("capture_end"),
        "torch.cuda.graph": torch.cuda.graph,
        "torch.cuda.CUDAGraph": torch.cuda.CUDAGraph,
    }


def simulation_hooks() -> tuple[object, list[list[str]]]:
    """torch._C._cuda_synchronize as it is now, and the hooked methods each stand-in holds
    itself (some only while simulated and installed on a CUDA build)."""
    own = [
        sorted(set(vars(cls)) & {"capture_begin", "capture_end", "synchronize"})
        for cls in _simcuda._standins(torch).values()
    ]
    return vars(torch._C).get("_cuda_synchronize"), own


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter; return its stdout (stderr must be empty)."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False
    )
    assert (out.returncode, out.stderr) == (0, "")
    return out.stdout


def test_install_wraps_the_three_entry_points() -> None:
    """install() wraps graph.__enter__, capture_begin and capture_end on the real classes."""
    before = entry_points()
    cgguard.install()
    after = entry_points()
    changed = sorted(name for name in before if before[name] is not after[name])
    assert changed == ["CUDAGraph.capture_begin", "CUDAGraph.capture_end", "graph.__enter__"]
    # Each hook leads to torch's own, as introspection and torch's own callers expect.
    assert {name: after[name].__wrapped__ for name in changed} == {  # type: ignore[attr-defined]
        name: before[name] for name in changed
    }


def test_capture_end_keeps_what_introspection_sees() -> None:
    """The plain capture_end wrapper reads as torch's own: name, qualname, doc and signature."""
    original = torch.cuda.graphs.CUDAGraph.capture_end
    cgguard.install()
    patched = torch.cuda.graphs.CUDAGraph.capture_end
    assert patched is not original
    seen = [
        (f.__name__, f.__qualname__, f.__module__, f.__doc__, inspect.signature(f))
        for f in (original, patched)
    ]
    assert seen[0] == seen[1]


def test_install_is_idempotent() -> None:
    """A second install() patches nothing more: each entry point is wrapped once."""
    cgguard.install()
    once = entry_points()
    cgguard.install()
    assert entry_points() == once
    assert cgguard.status().patched == ENTRY_POINTS + DEVICE_SYNC


def test_install_with_config_switches_configuration() -> None:
    """install(config) when installed adopts the new configuration without repatching."""
    cgguard.install()
    patched = entry_points()
    log = cgguard.Config(mode="log")
    cgguard.install(log)
    assert (cgguard.status().config, entry_points()) == (log, patched)
    cgguard.install()
    assert cgguard.status().config is log


def test_install_rejects_a_non_config() -> None:
    """install() names the bad argument and what it accepts."""
    with pytest.raises(cgguard.ConfigError) as raised:
        cgguard.install("log")  # type: ignore[arg-type]
    assert str(raised.value) == (
        "install(config='log'): accepted values are None or a cgguard.Config"
    )
    assert not cgguard.is_installed()


def test_install_applies_the_configured_capture_flag() -> None:
    """Config(capture="disabled") sets the flag off at install, with no stack behind it."""
    cgguard.install(cgguard.Config(capture="disabled"))
    assert (cgguard.is_capture_enabled(), _process.PROCESS.gate.flag.changed_at) == (False, None)


def test_uninstall_restores_attributes_exactly() -> None:
    """install then uninstall leaves every torch attribute identical; uninstall is idempotent."""
    before = entry_points()
    cgguard.install()
    assert cgguard.is_installed()
    cgguard.uninstall()
    cgguard.uninstall()
    assert entry_points() == before
    assert not cgguard.is_installed()


@pytest.mark.simulated
@pytest.mark.parametrize(
    "order",
    [
        "sim install uninstall unsim",
        "install sim uninstall unsim",
        "sim install unsim uninstall",
        "install sim unsim uninstall",
    ],
)
def test_simulation_and_install_restore_in_any_order(order: str) -> None:
    """With the simulated runtime set up before or after install, all of torch comes back."""
    before = entry_points(), simulation_hooks()
    simulation = simulated_cuda()
    steps = {
        "sim": simulation.__enter__,
        "unsim": lambda: simulation.__exit__(None, None, None),
        "install": cgguard.install,
        "uninstall": cgguard.uninstall,
    }
    for step in order.split():
        steps[step]()
        if cgguard.is_installed() and active_simulation() is not None:
            # Patches made before or after the simulation guard the stand-in's captures.
            with cgguard.capture_disabled(), pytest.raises(cgguard.CaptureDisabledError):
                torch.cuda.CUDAGraph().capture_begin()
    assert (entry_points(), simulation_hooks()) == before


@pytest.mark.simulated
def test_patches_go_on_the_real_class_under_simulation() -> None:
    """Installed while simulated, the real CUDAGraph is patched; the stand-in carries hooks of its
    own only where it cannot extend the real class (CUDA builds), and only while simulated."""
    with simulated_cuda():
        cgguard.install()
        standin = torch.cuda.CUDAGraph
        assert standin is not torch.cuda.graphs.CUDAGraph
        assert _patches.real_class(standin) is torch.cuda.graphs.CUDAGraph
        assert _patched(vars(torch.cuda.graphs.CUDAGraph)["capture_begin"])
        hooked = _patched(vars(standin).get("capture_begin"))
        assert (hooked, issubclass(standin, torch.cuda.graphs.CUDAGraph)) == (
            CUDA_BUILT,
            not CUDA_BUILT,
        )
    assert "capture_begin" not in vars(standin)


def _patched(method: object) -> bool:
    """Whether ``method`` is cgguard's hook on a capture entry point: a function of the capture
    path's (cgguard._core.hooks) standing for torch's, which it wraps."""
    code = getattr(method, "__code__", None)
    return (
        code is not None and code.co_filename == _hooks.__file__ and hasattr(method, "__wrapped__")
    )


def test_patch_failure_warns_and_leaves_torch_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure half-way through patching undoes what was patched and prints one line."""
    before = entry_points()
    calls = []

    def failing_wrapper(wrapped: object, wrapper: object) -> object:
        calls.append(wrapped)
        if len(calls) == 2:
            raise TypeError("cannot wrap")
        return wrapt.FunctionWrapper(wrapped, wrapper)

    monkeypatch.setattr(_patches.wrapt, "FunctionWrapper", failing_wrapper)
    cgguard.install()
    assert entry_points() == before
    assert cgguard.is_installed()
    assert capsys.readouterr().err == (
        "cgguard: could not patch torch, captures are not guarded: TypeError('cannot wrap')\n"
    )


@pytest.mark.subprocess
@pytest.mark.simulated
def test_install_before_torch_patches_on_import() -> None:
    """install() before ``import torch`` does not import torch, and patches it once imported."""
    out = run_python(
        """
        import os, sys, cgguard
        cgguard.install(cgguard.Config(log_file=os.devnull))
        print("torch imported by install:", "torch" in sys.modules)
        import torch
        hook = vars(torch.cuda.graphs.graph)["__enter__"]
        ours = hook.__code__.co_filename.endswith("hooks.py")
        print("patched:", ours, hook.__wrapped__.__qualname__)
        from cgguard.testing import _simcuda, active_simulation, simulated_cuda
        with simulated_cuda(), cgguard.capture_disabled():
            try:
                torch.cuda.graph(torch.cuda.CUDAGraph()).__enter__()
            except cgguard.CaptureDisabledError as exc:
                print("refused:", exc.event["rule"])
        """
    )
    assert out == (
        "torch imported by install: False\n"
        "patched: True graph.__enter__\n"
        "refused: capture_disabled\n"
    )


@pytest.mark.subprocess
def test_uninstall_before_torch_cancels_the_patch() -> None:
    """install() then uninstall() before ``import torch`` leaves torch unpatched."""
    out = run_python(
        """
        import cgguard
        cgguard.install()
        cgguard.uninstall()
        import torch
        print(type(vars(torch.cuda.graphs.graph)["__enter__"]).__name__)
        """
    )
    assert out == "function\n"


@pytest.mark.subprocess
def test_import_cgguard_loads_nothing_heavy() -> None:
    """``import cgguard`` loads neither torch, wrapt nor structlog."""
    out = run_python(
        """
        import sys, cgguard
        print(sorted(m for m in ("torch", "wrapt", "structlog") if m in sys.modules))
        """
    )
    assert out == "[]\n"


@pytest.mark.subprocess
def test_install_while_another_thread_imports_torch() -> None:
    """install() during another thread's ``import torch`` waits for it, then patches; no error."""
    out = run_python(
        """
        import sys, threading, time
        importer = threading.Thread(target=lambda: __import__("torch"))
        importer.start()
        while "torch" not in sys.modules:
            time.sleep(0.0005)
        time.sleep(0.05)
        import cgguard
        cgguard.install()
        importer.join()
        print(len(cgguard.status().patched))
        """
    )
    assert out == f"{patched_count()}\n"


@pytest.mark.subprocess
def test_installing_twice_before_torch_leaves_no_hook_after_uninstall() -> None:
    """Two installs before ``import torch`` register one hook, which uninstall() removes."""
    out = run_python(
        """
        import sys, cgguard, cgguard._boot as h
        cgguard.install()
        cgguard.install(cgguard.Config(mode="log"))
        cgguard.uninstall()
        print(len(h.pending("torch")), h._finder in sys.meta_path)
        """
    )
    assert out == "0 False\n"


@pytest.mark.simulated
def test_reinstall_forgets_a_capture_recorded_while_uninstalling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capture_begin that outlives uninstall() on another thread leaves no stale capture."""
    with simulated_cuda() as simulation:
        cgguard.install(cgguard.Config(log_file=os.devnull))
        inside, resume = threading.Event(), threading.Event()
        begin = type(simulation)._capture_begin

        def paused_begin(self: object, *args: object) -> object:
            if threading.current_thread().name == "capturing":
                inside.set()
                assert resume.wait(timeout=20)
            return begin(self, *args)

        monkeypatch.setattr(type(simulation), "_capture_begin", paused_begin)

        def capture() -> None:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass

        thread = threading.Thread(target=capture, name="capturing")
        thread.start()
        assert inside.wait(timeout=20)
        cgguard.uninstall()  # while that thread is inside the capture_begin wrapper
        resume.set()
        thread.join(timeout=30)
        assert not thread.is_alive()
        cgguard.install(cgguard.Config(log_file=os.devnull))
        # Not refused as concurrent with, or nested in, a capture that ended long ago.
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
        assert cgguard.status().captures == ()


@pytest.mark.simulated
def test_forget_captures_lets_go_of_all_but_the_kept_and_says_where_they_began() -> None:
    """forget_captures() forgets the captures opened since open_captures(), describes each,
    and leaves the ones open then alone."""
    from cgguard._install import LeftOpen, forget_captures, open_captures

    cgguard.install(cgguard.Config(log_file=os.devnull))
    with simulated_cuda():
        before, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()

        def begin_relaxed() -> None:  # on a thread of its own: a relaxed capture outlives it
            with torch.cuda.stream(stream):
                before.capture_begin(capture_error_mode="relaxed")

        thread = threading.Thread(target=begin_relaxed)
        thread.start()
        thread.join()
        kept = open_captures()
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.CUDAGraph().capture_begin()  # left-open
        left = forget_captures(kept)
        still_open = cgguard.status().captures
        with torch.cuda.stream(stream):
            before.capture_end()
    function = "test_forget_captures_lets_go_of_all_but_the_kept_and_says_where_they_began"
    began_at = SourceFile(__file__).frame("left-open", function)
    thread_name = f"'MainThread' ({threading.get_ident()})"
    assert [LeftOpen("CUDAGraph.capture_begin", "global", thread_name, [began_at])] == [
        capture._replace(began_at=capture.began_at[-1:]) for capture in left
    ]
    kept_one = CaptureInfo(thread.ident or 0, "CUDAGraph.capture_begin", "relaxed")
    assert ((kept_one,), (), []) == (still_open, cgguard.status().captures, forget_captures())


def _waiting(*entries: str) -> tuple[WindowInfo, ...]:
    return tuple(WindowInfo(entry, None, "waiting for import") for entry in entries)


_NOT_DISABLED = "capture_disabled="
# The built-in profiles as docs/integrations.md lists them, before their frameworks' import.
WAITING_PROFILES = (
    (
        "vllm",
        _waiting(
            "vllm.v1.worker.gpu.model_runner:GPUModelRunner.capture_model",
            "vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner.capture_model",
        ),
        (
            f"{_NOT_DISABLED}vllm.v1.attention.backends.flex_attention:FlexAttentionMetadata.build_block_mask",
            f"{_NOT_DISABLED}flashinfer.autotuner",
            f"{_NOT_DISABLED}vllm.model_executor.warmup.rocm_segmented_attn_autotune_warmup",
        ),
    ),
    (
        "sglang",
        _waiting(
            "sglang.srt.model_executor.runner_utils.capture_mode:is_capture_mode",
            "sglang.srt.model_executor.cuda_graph_runner_utils.capture_mode:is_capture_mode",
            "sglang.srt.model_executor.cuda_graph_runner:is_capture_mode",
            "sglang.srt.runtime_context:get_flags().dp.capturing_prefill_graph",
            "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph"
            ".breakable_cuda_graph:_current_capture_var",
            "sglang.srt.compilation.compile_phase:_pcg_capture_stream",
        ),
        (
            f"{_NOT_DISABLED}sglang.srt.multimodal.vit_cuda_graph_runner",
            f"{_NOT_DISABLED}sglang.srt.multimodal.internvl_vit_cuda_graph_runner",
            f"{_NOT_DISABLED}sglang.srt.multimodal.kimi_k3_vit_cuda_graph_runner",
            f"{_NOT_DISABLED}sglang.srt.model_executor.runner.metadata_glue_graph",
            f"{_NOT_DISABLED}sglang.srt.speculative.dspark_components.dspark_sampling_accept_graph",
            f"{_NOT_DISABLED}sglang.srt.models.deepseek_v4_replay_tail",
            f"{_NOT_DISABLED}sglang.srt.distributed.device_communicators.pymscclpp",
            f"{_NOT_DISABLED}flashinfer.autotuner",
        ),
    ),
    (
        "tensorrt_llm",
        _waiting(
            "tensorrt_llm._torch.pyexecutor.cuda_graph_runner:_local.is_graph_capturing",
            "tensorrt_llm._torch.pyexecutor.cuda_graph_runner:CUDAGraphRunner.allow_capture",
        ),
        (),
    ),
)


def test_status_says_what_cgguard_is_doing() -> None:
    """status(): not installed, then installed with its patches, captures, violations, config."""
    assert cgguard.status() == cgguard.Status(
        installed=False,
        activated_by=None,
        patched=(),
        waiting_for_torch=False,
        followed=(),
        waiting_to_follow=(),
        capture_enabled=True,
        captures=(),
        violations={},
        config=None,
    )
    config = cgguard.Config(mode="log", log_file=os.devnull)
    cgguard.install(config)
    cgguard.follow_flag("cgg_not_imported_framework", "capture_ok")
    with simulated_cuda():
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="relaxed")
            torch.cuda.synchronize()  # relaxed: CUDA lets it through; logged
            with cgguard.capture_disabled():
                during = cgguard.status()
            graph.capture_end()
    assert during == cgguard.Status(
        installed=True,
        activated_by=None,
        # torch._C._cuda_synchronize: the simulated runtime's, while it is in place.
        patched=(*ENTRY_POINTS, "torch._C._cuda_synchronize", *STANDIN_HOOKS),
        waiting_for_torch=False,
        followed=(),
        waiting_to_follow=(
            "cgg_not_imported_framework",
            "vllm.compilation.monitor",
            "vllm.backends.compiler.monitor",
        ),
        capture_enabled=False,
        captures=(CaptureInfo(threading.get_ident(), "CUDAGraph.capture_begin", "relaxed"),),
        violations={"sync_during_capture": 1},
        config=config,
        # Every built-in profile on, none of their frameworks imported.
        profiles=tuple(
            ProfileInfo(name, "waiting for import", windows, exemptions)
            for name, windows, exemptions in WAITING_PROFILES
        ),
        census=True,  # on by default
    )
    # The simulation's device synchronize went with it.
    assert (cgguard.status().captures, cgguard.status().patched) == ((), ENTRY_POINTS + DEVICE_SYNC)


def _open_files(paths: list[str]) -> list[str]:
    """Which of ``paths`` this process holds open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used, closed since
        if target in paths:
            found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_switching_configuration_while_threads_report_loses_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Each violation reported while another thread switches the log file back and forth lands
    whole in one of the files, none on stderr, and no log file is left open."""
    logs = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]

    def config(log: str) -> cgguard.Config:
        return cgguard.Config(mode="log", log_file=log, capture="disabled")

    cgguard.install(config(logs[0]))
    code = compile("pass", str(tmp_path / "generated.py"), "exec")
    threads, per_thread = 4, 250

    def violate(n: int) -> None:
        for i in range(per_thread):  # a new site each time: each logged in full
            tracker().check("torch.cuda.graph", 1, "global", (code, 2 * (n * per_thread + i)), None)

    workers = [threading.Thread(target=violate, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    switches = 0
    while any(worker.is_alive() for worker in workers):
        switches += 1
        cgguard.install(config(logs[switches % 2]))
    for worker in workers:
        worker.join()
    counted = cgguard.status().violations
    cgguard.uninstall()
    written = [Path(log).read_text() for log in logs if os.path.exists(log)]
    lines = [line for text in written for line in text.splitlines()]
    assert (counted, len(lines), capfd.readouterr().err, _open_files(logs)) == (
        {"capture_disabled": threads * per_thread},
        threads * per_thread,
        "",
        [],
    )
    assert switches > 1  # the switches came while threads reported
