"""Built-in profiles: vLLM's, SGLang's and TensorRT-LLM's capture windows, switched on when their
modules are imported.

Tested against small packages at the frameworks' own module paths, written into a temporary
folder and imported after install, as a server imports its framework after cgguard's
activation; TensorRT-LLM against stand-ins of its source's shape (tests/standins/). The real
vLLM and SGLang are in tests/test_frameworks.py.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import SourceFile

import cgguard
from cgguard._gate.windows import WindowInfo
from cgguard.testing import capture_violations

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

pytestmark = pytest.mark.simulated

CAPTURE = """\
import torch


def capture():
    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # @capture
        pass
"""

MODEL_RUNNER = """\
import torch

from capturing import capture


def helper():
    capture()


class GPUModelRunner:
    @torch.inference_mode()
    def capture_model(self, profile_only=False):
        capture()  # @inside
        helper()
        return torch.is_inference_mode_enabled()


def start(runner=None, profile_only=False):
    return (runner or GPUModelRunner()).capture_model(profile_only)  # @window-returns
"""

ENCODER_RUNNER = """\
import torch

from capturing import capture
from vllm.v1.worker.gpu.model_runner import GPUModelRunner


class MMEncoderModelRunner(GPUModelRunner):
    # Overrides the window without calling super(), as vLLM 0.33.0's does.
    @torch.inference_mode()
    def capture_model(self, profile_only=False):
        capture()  # @encoder
        return "encoder"
"""

FLEX_ATTENTION = """\
from capturing import capture


class FlexAttentionMetadata:
    def build_block_mask(self):
        capture()  # @flex


def forward():
    capture()  # @flex-forward
"""

PLUGIN = """\
from capturing import capture


def serve():
    capture()  # @plugin
"""

RUNNER_UTILS = """\
from contextlib import contextmanager

is_capture_mode = False


@contextmanager
def model_capture_mode():
    global is_capture_mode
    is_capture_mode = True
    try:
        yield
    finally:
        is_capture_mode = False
"""

RUNTIME_CONTEXT = """\
class DpFlags:
    capturing_prefill_graph = False


class Flags:
    def __init__(self):
        self.dp = DpFlags()


class Context:
    def __init__(self):
        self.flags = Flags()


_CONTEXT = Context()


def get_flags():
    return _CONTEXT.flags
"""

BREAKABLE = """\
from contextvars import ContextVar

_current_capture_var = ContextVar("_current_capture_var", default=None)
"""

COMPILE_PHASE = """\
from contextlib import contextmanager

_pcg_capture_stream = None


@contextmanager
def set_pcg_capture_stream(stream):
    global _pcg_capture_stream
    _pcg_capture_stream = stream
    try:
        yield
    finally:
        _pcg_capture_stream = None
"""

VIT = """\
from capturing import capture


def run_vit():
    capture()  # @vit
"""

USER_FRAMEWORK = """\
from capturing import capture

capture_ok = True


def warmup():
    capture()  # @warmup


def hold(entered, leave):
    entered.set()
    leave.wait(10)
"""

FILES = {
    "capturing.py": CAPTURE,
    "plugin.py": PLUGIN,
    "userfw.py": USER_FRAMEWORK,
    "vllm/v1/worker/gpu/model_runner.py": MODEL_RUNNER,
    "vllm/v1/worker/mm_encoder_model_runner.py": ENCODER_RUNNER,
    "vllm/v1/attention/backends/flex_attention.py": FLEX_ATTENTION,
    "sglang/srt/model_executor/runner_utils/capture_mode.py": RUNNER_UTILS,
    "sglang/srt/runtime_context.py": RUNTIME_CONTEXT,
    "sglang/srt/model_executor/runner_backend_utils/breakable_cuda_graph/breakable_cuda_graph.py": (
        BREAKABLE
    ),
    "sglang/srt/compilation/compile_phase.py": COMPILE_PHASE,
    "sglang/srt/multimodal/vit_cuda_graph_runner.py": VIT,
}
TOPS = ("capturing", "plugin", "userfw", "vllm", "sglang", "tensorrt_llm")
MRV2 = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.capture_model"
ENCODER = "vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner.capture_model"
STANDINS = Path(__file__).parent / "standins"
DISABLED = (
    "CUDA graph capturing detected at an inappropriate time. This operation is currently disabled. "
)


def _forget_modules() -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in TOPS]:
        del sys.modules[name]


@pytest.fixture
def frameworks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The stand-in frameworks on sys.path, not imported yet; forgotten after the test."""
    for relative, source in FILES.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        # Packages at every level, as the real ones.
        for parent in path.relative_to(tmp_path).parents:
            if str(parent) != ".":
                (tmp_path / parent / "__init__.py").touch()
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    _forget_modules()


@pytest.fixture
def cuda() -> Iterator[None]:
    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        yield


def _import(name: str) -> ModuleType:
    import importlib

    return importlib.import_module(name)


def _profile(name: str) -> Any:
    (found,) = [p for p in cgguard.status().profiles if p.name == name]
    return found


def test_after_the_mrv2_window_returned_a_plugin_capture_is_logged_in_raise_mode(
    frameworks: Path, cuda: None
) -> None:
    """Raise mode, profiles by default: before capture_model first ran, inside it and in what it
    calls, captures pass; after it returned, a plugin's capture goes ahead, logged, blamed on
    the window's return."""
    cgguard.install()
    runner = _import("vllm.v1.worker.gpu.model_runner")
    plugin = _import("plugin")
    with capture_violations() as events:
        plugin.serve()  # before the window first ran
        inside = runner.start()
        plugin.serve()  # after: logged, not raised
    source = SourceFile(frameworks / "vllm/v1/worker/gpu/model_runner.py")
    expected = (
        True,
        [("capture_disabled", "logged")],
        source.frame("@window-returns", "start"),
        f"capture was disabled at {source.path}:{source.line_of('@window-returns')} (in start), "
        f"where the capture window {MRV2} returned.",
        {"capture_disabled": 1},
    )
    (event,) = events
    assert expected == (
        inside,
        [(e["rule"], e["action"]) for e in events],
        event["disabled_stack"][-1],
        event["message"].partition("began a capture; ")[2],
        cgguard.status().violations,
    )


def test_profiles_raise_refuses_with_the_windows_closing_stack(
    frameworks: Path, cuda: None
) -> None:
    """CGGUARD_PROFILES=raise: the plugin's capture is refused, with the stack of the line where
    capture_model returned as its cause."""
    cgguard.install(cgguard.Config.from_environ({"CGGUARD_PROFILES": "raise"}))
    runner = _import("vllm.v1.worker.gpu.model_runner")
    plugin = _import("plugin")
    runner.start(profile_only=True)  # the profiling pass closes the window first
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        plugin.serve()
    source, plugged, capturing = (
        SourceFile(frameworks / "vllm/v1/worker/gpu/model_runner.py"),
        SourceFile(frameworks / "plugin.py"),
        SourceFile(frameworks / "capturing.py"),
    )
    capture_at = f"{capturing.path}:{capturing.line_of('@capture')} (in capture)"
    closed_at = f"{source.path}:{source.line_of('@window-returns')} (in start)"
    expected = (
        f"{DISABLED}torch.cuda.graph at {capture_at} began a capture; capture was disabled at "
        f"{closed_at}, where the capture window {MRV2} returned.",
        source.frame("@window-returns", "start"),
        [plugged.frame("@plugin", "serve"), capturing.frame("@capture", "capture")],
    )
    event = raised.value.event
    assert expected == (str(raised.value), event["disabled_stack"][-1], event["stack"][-2:])


def test_an_exempted_framework_capture_outside_the_window_passes_counted(
    frameworks: Path, cuda: None
) -> None:
    """vLLM's flex_attention compile captures while serving: its built-in exemption lets it
    through, counted as exempted, even with profiles=raise; the plugin's is still refused."""
    cgguard.install(cgguard.Config(profiles="raise"))
    runner = _import("vllm.v1.worker.gpu.model_runner")
    flex = _import("vllm.v1.attention.backends.flex_attention")
    plugin = _import("plugin")
    runner.start()
    flex.FlexAttentionMetadata().build_block_mask()
    with pytest.raises(cgguard.CaptureDisabledError):
        plugin.serve()
    status = cgguard.status()
    assert (status.violations, status.exempted) == (
        {"capture_disabled": 1},
        {"capture_disabled": 1},
    )


def test_the_flex_attention_exemption_covers_its_block_mask_build_alone(
    frameworks: Path, cuda: None
) -> None:
    """Only the function that calls the reduce-overhead compile is exempted: another capture
    from the flex_attention module after the window closed is refused."""
    cgguard.install(cgguard.Config(profiles="raise"))
    runner = _import("vllm.v1.worker.gpu.model_runner")
    flex = _import("vllm.v1.attention.backends.flex_attention")
    runner.start()
    flex.FlexAttentionMetadata().build_block_mask()
    with pytest.raises(cgguard.CaptureDisabledError):
        flex.forward()
    status = cgguard.status()
    assert (status.violations, status.exempted) == (
        {"capture_disabled": 1},
        {"capture_disabled": 1},
    )


def test_a_profiles_exemptions_leave_cgguards_own_flag_alone(frameworks: Path, cuda: None) -> None:
    """A built-in exemption covers its profile's refusals only: with the profile's window
    closed and capture disabled by cgguard's own flag, flex_attention's capture is refused."""
    cgguard.install()
    runner = _import("vllm.v1.worker.gpu.model_runner")
    flex = _import("vllm.v1.attention.backends.flex_attention")
    runner.start()
    cgguard.set_capture_enabled(False)
    with pytest.raises(cgguard.CaptureDisabledError):
        flex.FlexAttentionMetadata().build_block_mask()
    assert cgguard.status().exempted == {}


def test_a_profiles_exemptions_leave_a_followed_flag_alone(frameworks: Path, cuda: None) -> None:
    """A followed flag that disables capture after the profile's window closed is the cause:
    flex_attention's capture is refused, in raise mode, and not counted as exempted."""
    cgguard.install(cgguard.Config(mode="raise"))
    runner = _import("vllm.v1.worker.gpu.model_runner")
    flex = _import("vllm.v1.attention.backends.flex_attention")
    user = _import("userfw")
    runner.start()  # the profile's windows join the followed flags first
    cgguard.follow_flag("userfw", "capture_ok")
    user.capture_ok = False
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        flex.FlexAttentionMetadata().build_block_mask()
    assert (cgguard.status().exempted, raised.value.event["action"]) == ({}, "raised")


def test_a_declared_windows_refusal_is_neither_downgraded_nor_exempted(
    frameworks: Path, cuda: None
) -> None:
    """Raise mode, profiles log-only: with the profile's window and a declared one both closed,
    a capture outside them is the declared window's refusal: raised, and flex_attention's
    built-in exemption does not apply to it."""
    cgguard.install(cgguard.Config(mode="raise", windows=("userfw:warmup",)))
    runner = _import("vllm.v1.worker.gpu.model_runner")
    flex = _import("vllm.v1.attention.backends.flex_attention")
    plugin, user = _import("plugin"), _import("userfw")
    runner.start()  # the profile's windows join the followed flags first
    user.warmup()
    refused = []
    for capture in (flex.FlexAttentionMetadata().build_block_mask, plugin.serve):
        with pytest.raises(cgguard.CaptureDisabledError) as raised:
            capture()
        refused.append(str(raised.value).partition("; ")[2].rpartition(", ")[2])
    window = "where the capture window userfw:warmup returned."
    assert (refused, cgguard.status().exempted) == ([window, window], {})


def test_a_capture_inside_an_open_declared_window_passes_after_a_profiles_closed(
    frameworks: Path, cuda: None
) -> None:
    """The windows are one set: after the profile's window returned, a capture inside an open
    declared window passes, as one inside the profile's own would after a declared one
    closed."""
    cgguard.install(cgguard.Config(windows=("userfw:warmup",), profiles="raise"))
    runner = _import("vllm.v1.worker.gpu.model_runner")
    user, plugin = _import("userfw"), _import("plugin")
    runner.start()
    user.warmup()
    runner.start()
    with pytest.raises(cgguard.CaptureDisabledError):
        plugin.serve()
    assert cgguard.status().violations == {"capture_disabled": 1}


def test_log_only_profiles_leave_capture_enabled(frameworks: Path, cuda: None) -> None:
    """After the profile's window closed, is_capture_enabled() and status() stay true while its
    refusals are only logged, and turn false under profiles=raise."""
    cgguard.install()
    runner = _import("vllm.v1.worker.gpu.model_runner")
    runner.start()
    logged = (cgguard.is_capture_enabled(), cgguard.status().capture_enabled)
    cgguard.install(cgguard.Config(profiles="raise"))
    raised = (cgguard.is_capture_enabled(), cgguard.status().capture_enabled)
    assert (logged, raised) == ((True, True), (False, False))


def _layers(function: Any) -> int:
    depth = 0
    while hasattr(function, "__wrapped__"):
        function, depth = function.__wrapped__, depth + 1
    return depth


@pytest.mark.parametrize("dropped", ["declared", "profile"])
def test_a_declared_window_on_a_profiles_function_is_one_wrapper(
    frameworks: Path, cuda: None, dropped: str
) -> None:
    """A declared window naming MRV2's capture_model shares the profile's wrapper: either one
    dropped, the other still opens and closes; uninstall puts back the very function."""
    runner = _import("vllm.v1.worker.gpu.model_runner")
    plugin = _import("plugin")
    original = vars(runner.GPUModelRunner)["capture_model"]
    cgguard.install(cgguard.Config(windows=(MRV2,), profiles="raise"))
    both = _layers(vars(runner.GPUModelRunner)["capture_model"])
    if dropped == "declared":
        cgguard.install(cgguard.Config(profiles="raise"))
        kept = [w.state for w in _profile("vllm").windows][:1]
    else:
        cgguard.install(cgguard.Config(windows=(MRV2,), profiles="off"))
        kept = [w.state for w in cgguard.status().windows]
    runner.start()
    with pytest.raises(cgguard.CaptureDisabledError):
        plugin.serve()
    cgguard.uninstall()
    runner.start()  # the function put back: nothing of cgguard's runs, nothing is followed
    from cgguard import _process

    put_back = vars(runner.GPUModelRunner)["capture_model"] is original
    assert (both, kept, put_back, _process.PROCESS.gate.follows) == (2, ["watched"], True, [])


def test_a_forked_child_forgets_the_window_calls_of_other_threads(
    frameworks: Path, cuda: None
) -> None:
    """A thread inside a window function at a fork never returns in the child: there, a capture
    outside every window is refused."""
    import os

    cgguard.install(cgguard.Config(windows=("userfw:hold",), mode="raise", log_file=os.devnull))
    user, plugin = _import("userfw"), _import("plugin")
    done = threading.Event()
    done.set()
    user.hold(threading.Event(), done)  # entered and closed
    entered, leave = threading.Event(), threading.Event()
    holder = threading.Thread(target=user.hold, args=(entered, leave))
    holder.start()
    entered.wait(10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            plugin.serve()
            os.write(write, b"passed")
        except cgguard.CaptureDisabledError:
            os.write(write, b"refused")
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read()
    leave.set()
    holder.join()
    assert child == b"refused"


def test_the_encoder_runners_override_is_a_window_of_its_own(frameworks: Path, cuda: None) -> None:
    """MMEncoderModelRunner.capture_model overrides without super(): its captures pass after the
    main window closed, and its return is where capture was disabled next."""
    cgguard.install(cgguard.Config(profiles="raise"))
    runner = _import("vllm.v1.worker.gpu.model_runner")
    encoder = _import("vllm.v1.worker.mm_encoder_model_runner")
    plugin = _import("plugin")
    runner.start()
    returned = runner.start(encoder.MMEncoderModelRunner())
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        plugin.serve()
    source = SourceFile(frameworks / "vllm/v1/worker/gpu/model_runner.py")
    assert (returned, str(raised.value).partition("began a capture; ")[2]) == (
        "encoder",
        f"capture was disabled at {source.path}:{source.line_of('@window-returns')} (in start), "
        f"where the capture window {ENCODER} returned.",
    )


def test_status_names_the_mrv2_windows_once_imported(frameworks: Path) -> None:
    """Before vLLM's import the profile waits; with its runner modules imported it is active,
    naming its two functions; with profiles off there is none."""
    cgguard.install()
    before = _profile("vllm")
    _import("vllm.v1.worker.mm_encoder_model_runner")  # imports the main runner too
    after = _profile("vllm")
    cgguard.install(cgguard.Config(profiles="off"))
    off = _profile("vllm")
    assert (before.state, after, off.state, off.windows) == (
        "waiting for import",
        (
            "vllm",
            "active",
            (WindowInfo(MRV2, "function", "watched"), WindowInfo(ENCODER, "function", "watched")),
            before.exemptions,
        ),
        "off",
        (),
    )


def test_profiles_off_leaves_every_capture_alone(frameworks: Path, cuda: None) -> None:
    """CGGUARD_PROFILES=off: after capture_model returned, the plugin's capture passes unseen."""
    cgguard.install(cgguard.Config.from_environ({"CGGUARD_PROFILES": "off"}))
    runner = _import("vllm.v1.worker.gpu.model_runner")
    plugin = _import("plugin")
    runner.start()
    plugin.serve()
    assert cgguard.status().violations == {}


def test_a_bad_profiles_value_is_one_line_naming_it(capfd: pytest.CaptureFixture[str]) -> None:
    """CGGUARD_PROFILES=maybe: ignored with one line naming it and the accepted values."""
    config = cgguard.Config.from_environ({"CGGUARD_PROFILES": "maybe"})
    assert (config.profiles, capfd.readouterr().err) == (
        "log",
        "cgguard: ignoring CGGUARD_PROFILES='maybe': accepted values are log, raise, off; "
        "using log\n",
    )


@pytest.mark.parametrize(
    "opens",
    ["capture mode", "prefill flag", "breakable capture", "piecewise stream"],
)
def test_each_sglang_window_lets_captures_through_while_it_is_true(
    frameworks: Path, cuda: None, opens: str
) -> None:
    """Each of SGLang's four windows, once seen true by a capture, lets captures through only
    while it is true; a plugin's capture after it is reported, the ViT runner's is exempted."""
    cgguard.install(cgguard.Config(profiles="raise"))
    mode = _import("sglang.srt.model_executor.runner_utils.capture_mode")
    context = _import("sglang.srt.runtime_context")
    breakable = _import(
        "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
    )
    phase = _import("sglang.srt.compilation.compile_phase")
    vit = _import("sglang.srt.multimodal.vit_cuda_graph_runner")
    plugin = _import("plugin")

    @contextlib.contextmanager
    def window() -> Iterator[None]:
        if opens == "capture mode":
            with mode.model_capture_mode():
                yield
        elif opens == "prefill flag":
            context.get_flags().dp.capturing_prefill_graph = True
            try:
                yield
            finally:
                context.get_flags().dp.capturing_prefill_graph = False
        elif opens == "breakable capture":
            token = breakable._current_capture_var.set(object())
            try:
                yield
            finally:
                breakable._current_capture_var.reset(token)
        else:
            with phase.set_pcg_capture_stream(object()):
                yield

    plugin.serve()  # no window seen yet: allowed
    with window():
        plugin.serve()  # inside: allowed, and the window is entered
    vit.run_vit()  # exempted
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        plugin.serve()
    status = cgguard.status()
    assert (status.violations, status.exempted, raised.value.event["rule"]) == (
        {"capture_disabled": 1},
        {"capture_disabled": 1},
        "capture_disabled",
    )


def test_tensorrt_llm_older_release_per_thread_mark(
    monkeypatch: pytest.MonkeyPatch, cuda: None
) -> None:
    """Older TensorRT-LLM: the per-thread is_graph_capturing() is the window, on the capturing
    thread only; the current release's allow_capture() is not in it."""
    monkeypatch.syspath_prepend(str(STANDINS / "trtllm_older"))
    try:
        cgguard.install(cgguard.Config(profiles="raise"))
        runner = _import("tensorrt_llm._torch.pyexecutor.cuda_graph_runner")
        runner.DecodingCUDAGraphRunner().capture(lambda: None)
        refused: list[str] = []

        def other_thread() -> None:
            try:
                runner.DecodingCUDAGraphRunner().capture(lambda: None)
            except cgguard.CaptureDisabledError as exc:
                refused.append(exc.event["rule"])

        # Another thread's mark is its own: set there, its capture passes.
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        with pytest.raises(cgguard.CaptureDisabledError):
            _bare_capture()
        states = [(w.entry.rpartition(":")[2], w.state) for w in _profile("tensorrt_llm").windows]
    finally:
        _forget_modules()
    assert (refused, states) == (
        [],
        [
            ("_local.is_graph_capturing", "watched"),
            ("CUDAGraphRunner.allow_capture", "not in this release"),
        ],
    )


def test_tensorrt_llm_current_release_allow_capture(
    monkeypatch: pytest.MonkeyPatch, cuda: None
) -> None:
    """Current TensorRT-LLM: the body of ``with runner.allow_capture():`` is the window; a capture
    after it is refused, blamed on the line where the with statement ended."""
    monkeypatch.syspath_prepend(str(STANDINS / "trtllm_current"))
    here = SourceFile(__file__)
    try:
        cgguard.install(cgguard.Config(profiles="raise"))
        module = _import("tensorrt_llm._torch.pyexecutor.cuda_graph_runner")
        runner = module.CUDAGraphRunner()
        with runner.allow_capture():  # @allow-capture-ends
            runner.capture((1,), lambda: None)
            inside = runner._capture_allowed
        with pytest.raises(cgguard.CaptureDisabledError) as raised:
            runner.capture((2,), lambda: None)
        states = [w.state for w in _profile("tensorrt_llm").windows]
    finally:
        _forget_modules()
    window = "tensorrt_llm._torch.pyexecutor.cuda_graph_runner:CUDAGraphRunner.allow_capture"
    assert (
        inside,
        raised.value.event["disabled_stack"][-1],
        str(raised.value).rpartition(", ")[2],
        states,
    ) == (
        True,
        here.frame("@allow-capture-ends", "test_tensorrt_llm_current_release_allow_capture"),
        f"where the with statement of the capture window {window} ended.",
        ["not in this release", "watched"],
    )


def _bare_capture() -> None:
    import torch

    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass


def test_a_getter_that_fails_lets_the_capture_through_with_one_warning(
    frameworks: Path, cuda: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """SGLang's get_flags() failing (its runtime context not there yet) never fails a capture:
    it is let through, with one warning line naming the window, however many captures ask; and
    the window was not entered by it, so once readable and false, captures still pass."""
    cgguard.install(cgguard.Config(profiles="raise"))
    context = _import("sglang.srt.runtime_context")
    plugin = _import("plugin")
    capfd.readouterr()
    saved, context._CONTEXT = context._CONTEXT, None  # get_flags() then raises AttributeError
    plugin.serve()
    plugin.serve()
    context._CONTEXT = saved
    plugin.serve()
    window = "sglang.srt.runtime_context:get_flags().dp.capturing_prefill_graph"
    assert (cgguard.status().violations, capfd.readouterr().err) == (
        {},
        f"cgguard: cannot read the capture window {window}: "
        "AttributeError(\"'NoneType' object has no attribute 'flags'\")\n",
    )


def test_a_getter_that_fails_after_a_window_closed_still_lets_the_capture_through(
    frameworks: Path, cuda: None
) -> None:
    """With SGLang's windows entered and closed, a capture while get_flags() fails passes (the
    window cannot be read, so it is not known to be outside); once readable again, one outside
    every window is refused."""
    cgguard.install(cgguard.Config(profiles="raise", log_file="/dev/null"))
    mode = _import("sglang.srt.model_executor.runner_utils.capture_mode")
    context = _import("sglang.srt.runtime_context")
    plugin = _import("plugin")
    with mode.model_capture_mode():
        plugin.serve()  # entered
    saved, context._CONTEXT = context._CONTEXT, None
    plugin.serve()
    context._CONTEXT = saved
    with pytest.raises(cgguard.CaptureDisabledError):
        plugin.serve()
    assert cgguard.status().violations == {"capture_disabled": 1}
