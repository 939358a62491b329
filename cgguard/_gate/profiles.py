"""Built-in profiles: the capture windows and exemptions of frameworks cgguard knows.

Each profile is switched on by install() unless ``Config(profiles="off")``; its windows are
resolved when their modules are imported (cgguard never imports them), so a process without
the framework pays one pending import hook per module name and nothing on the capture path.
Each profile's windows are a ``Windows`` of their own among the followed flags, and one set
with the declared windows and the other profiles': a capture inside any open window passes.
A profile's refusals are logged, not raised, unless ``Config(profiles="raise")``, and leave
is_capture_enabled() true; they, and its exemptions, are its own only where every window
entered that refuses the capture is that profile's (cgguard._gate.flags.disabled_by).
docs/integrations.md says what each enforces; docs/audit/ holds the capture sites of each
audited release and how each is classified.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

from cgguard._gate.flags import Windows

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from cgguard._gate.windows import Reader, WindowInfo, WindowRegistry


class Window(NamedTuple):
    """One window of a profile: an entry as ``CGGUARD_WINDOW`` would take it, unless ``read``
    reaches state no entry can name; ``context``: the function returns a context manager."""

    entry: str
    read: Reader | None = None
    context: bool = False


class Profile(NamedTuple):
    """A framework's windows, the places it captures outside them on purpose, and its lifecycle
    functions: those after which inspection checks every graph's bindings (a weight reload, a
    LoRA load, a wake from sleep), ``module:qualname`` each."""

    name: str
    title: str  # the framework and its runner, for people
    windows: tuple[Window, ...]
    exempt: tuple[tuple[str, str], ...]  # (rule, place), as Config(exempt=...) keeps them
    lifecycle: tuple[str, ...] = ()


class ProfileInfo(NamedTuple):
    """A built-in profile, as status() shows it."""

    name: str
    # "off" (Config(profiles="off")), "waiting for import" (no window's module imported yet),
    # "active" (a window resolved), "not in this release" (its modules lack every window)
    state: str
    windows: tuple[WindowInfo, ...]
    exemptions: tuple[str, ...]


def _getter(function: str, *path: str) -> Reader:
    """A reader of ``module.function()`` and then ``path``'s attributes: state a framework
    keeps behind a getter, which may hand out a new object over the process's life."""

    def reader(module: ModuleType) -> tuple[str, Callable[[], object]] | None:
        get = getattr(module, function, None)
        if not callable(get):
            return None

        def read() -> object:
            value = get()
            for name in path:
                value = getattr(value, name)
            return value

        return "getter", read

    return reader


def _not_none(attribute: str) -> Reader:
    """A reader of a module attribute that is inside while it is not None (a stream, say,
    whose own truth value is not what it means)."""

    def reader(module: ModuleType) -> tuple[str, Callable[[], object]] | None:
        if not hasattr(module, attribute):
            return None
        return "module attribute (not None)", functools.partial(_is_set, module, attribute)

    return reader


def _is_set(module: ModuleType, attribute: str) -> bool:
    return getattr(module, attribute, None) is not None


_DISABLED = "capture_disabled"
# FlashInfer's autotuner captures graphs to time its candidates; vLLM's kernel warm-up and
# SGLang's start-up run it after the first capture window closed.
_FLASHINFER_AUTOTUNER = (_DISABLED, "flashinfer.autotuner")

_VLLM_WORKER = "vllm.v1.worker.gpu_worker"
_SGLANG_UPDATER = "sglang.srt.model_executor.model_runner_components.weight_updater"

PROFILES: tuple[Profile, ...] = (
    Profile(
        "vllm",
        "vLLM Model Runner V2",
        (
            Window("vllm.v1.worker.gpu.model_runner:GPUModelRunner.capture_model"),
            Window("vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner.capture_model"),
        ),
        (
            # torch.compile(create_block_mask, mode="reduce-overhead"): inductor's cudagraph
            # trees record a graph per new shape while serving, from the one function that
            # calls it.
            (
                _DISABLED,
                "vllm.v1.attention.backends.flex_attention:FlexAttentionMetadata.build_block_mask",
            ),
            _FLASHINFER_AUTOTUNER,
            # The ROCm segmented-attention autotune warm-up, also run by Elastic EP while
            # serving.
            (_DISABLED, "vllm.model_executor.warmup.rocm_segmented_attn_autotune_warmup"),
        ),
        (
            # Each keeps the graphs' pointers by design (layerwise reload copies into the
            # kernel tensors; sleep remaps the same addresses; LoRA copies into its slots):
            # the check names a quantization method or plugin that rebinds instead.
            f"{_VLLM_WORKER}:Worker.reload_weights",
            f"{_VLLM_WORKER}:Worker.update_weights",
            f"{_VLLM_WORKER}:Worker.finish_weight_update",
            f"{_VLLM_WORKER}:Worker.add_lora",
            f"{_VLLM_WORKER}:Worker.remove_lora",
            f"{_VLLM_WORKER}:Worker.sleep",
            f"{_VLLM_WORKER}:Worker.wake_up",
            # The runners', for a runner driven in process without its worker.
            "vllm.v1.worker.gpu.model_runner:GPUModelRunner.reload_weights",
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner.reload_weights",
            "vllm.v1.worker.lora_model_runner_mixin:LoRAModelRunnerMixin.add_lora",
            "vllm.v1.worker.lora_model_runner_mixin:LoRAModelRunnerMixin.remove_lora",
        ),
    ),
    Profile(
        "sglang",
        "SGLang",
        (
            # is_capture_mode, set by model_capture_mode() (decode and speculative runners), at
            # each module that has held it: 0.5.23's, and the older two.
            Window("sglang.srt.model_executor.runner_utils.capture_mode:is_capture_mode"),
            Window(
                "sglang.srt.model_executor.cuda_graph_runner_utils.capture_mode:is_capture_mode"
            ),
            Window("sglang.srt.model_executor.cuda_graph_runner:is_capture_mode"),
            # The prefill runner's capture, in the runtime flags a getter hands out.
            Window(
                "sglang.srt.runtime_context:get_flags().dp.capturing_prefill_graph",
                read=_getter("get_flags", "dp", "capturing_prefill_graph"),
            ),
            # Breakable graphs: the capture under way in this context. (The module flag
            # _in_breakable_cuda_graph is also true during replay.)
            Window(
                "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph"
                ".breakable_cuda_graph:_current_capture_var"
            ),
            # Piecewise graphs: the stream the runner captures on, None outside its capture.
            Window(
                "sglang.srt.compilation.compile_phase:_pcg_capture_stream",
                read=_not_none("_pcg_capture_stream"),
            ),
        ),
        (
            # ViT encoder graphs, captured per new shape while serving
            # (SGLANG_VIT_ENABLE_CUDA_GRAPH).
            (_DISABLED, "sglang.srt.multimodal.vit_cuda_graph_runner"),
            (_DISABLED, "sglang.srt.multimodal.internvl_vit_cuda_graph_runner"),
            (_DISABLED, "sglang.srt.multimodal.kimi_k3_vit_cuda_graph_runner"),
            # "captured while serving": metadata preparation graphs, per key.
            (_DISABLED, "sglang.srt.model_executor.runner.metadata_glue_graph"),
            # DSpark's sampling/accept graph, per batch size, on first use.
            (_DISABLED, "sglang.srt.speculative.dspark_components.dspark_sampling_accept_graph"),
            # DeepSeek-V4's replay tail, captured on first replay.
            (_DISABLED, "sglang.srt.models.deepseek_v4_replay_tail"),
            # mscclpp's tuning at start-up captures its all-reduce.
            (_DISABLED, "sglang.srt.distributed.device_communicators.pymscclpp"),
            _FLASHINFER_AUTOTUNER,
        ),
        (
            # update_weights_from_disk recaptures only when asked (recapture_cuda_graph,
            # False by default), and its post-processing may bind new Parameters.
            f"{_SGLANG_UPDATER}:WeightUpdater.update_weights_from_disk",
            f"{_SGLANG_UPDATER}:WeightUpdater.update_weights_from_tensor",
            f"{_SGLANG_UPDATER}:WeightUpdater.load_weights_from_distributed",
            f"{_SGLANG_UPDATER}:WeightUpdater.update_weights_from_ipc",
            f"{_SGLANG_UPDATER}:WeightUpdater.end_weight_update",
            "sglang.srt.managers.scheduler_components.weight_updater"
            ":SchedulerWeightUpdaterManager.release_memory_occupation",
            "sglang.srt.managers.scheduler_components.weight_updater"
            ":SchedulerWeightUpdaterManager.resume_memory_occupation",
            "sglang.srt.model_executor.model_runner:ModelRunner.load_lora_adapter",
            "sglang.srt.model_executor.model_runner:ModelRunner.unload_lora_adapter",
        ),
    ),
    Profile(
        "tensorrt_llm",
        "TensorRT-LLM (PyTorch backend)",
        (
            # Older releases: a per-thread flag set around each capture, lazy ones included.
            Window("tensorrt_llm._torch.pyexecutor.cuda_graph_runner:_local.is_graph_capturing"),
            # Current releases: captures only inside `with runner.allow_capture():`.
            Window(
                "tensorrt_llm._torch.pyexecutor.cuda_graph_runner:CUDAGraphRunner.allow_capture",
                context=True,
            ),
        ),
        (),
    ),
)

NAMES = tuple(profile.name for profile in PROFILES)


class _Active:
    """A profile switched on: its windows, and an entry per window, resolved once imported."""

    def __init__(self, profile: Profile, registry: WindowRegistry) -> None:
        self.profile = profile
        self.registry = registry
        self.windows = Windows(profile.name)
        self.windows.on_entered = functools.partial(registry.join, self.windows)
        self.windows.on_closed = registry.closing
        self.entries = [
            registry.entry(w.entry, self.windows, read=w.read, context=w.context, quiet=True)
            for w in profile.windows
        ]

    def undo(self) -> None:
        for entry in self.entries:
            entry.undo()
        self.registry.leave(self.windows)

    def info(self) -> ProfileInfo:
        windows = tuple(entry.info() for entry in self.entries)
        states = {w.state for w in windows}
        if any(w.kind is not None for w in windows):
            state = "active"
        elif "waiting for import" in states:
            state = "waiting for import"
        else:
            state = "not in this release"
        return ProfileInfo(self.profile.name, state, windows, _texts(self.profile))


class Profiles:
    """The built-in profiles, each switched on or off whole, their windows in ``registry``."""

    def __init__(self, registry: WindowRegistry) -> None:
        self.registry = registry
        self.active: list[_Active] = []

    def switch(self, on: bool, *, log_only: bool = True) -> None:
        """Switch every built-in profile on (each waits for its modules) or off; idempotent, so
        a reconfiguration that keeps them on keeps their windows' state. ``log_only``: their
        refusals are only logged (Config(profiles="log"))."""
        if on:
            if not self.active:
                self.active.extend(_Active(profile, self.registry) for profile in PROFILES)
            for active in self.active:
                active.windows.log_only = log_only
        else:
            while self.active:
                self.active.pop().undo()

    def infos(self) -> list[ProfileInfo]:
        """Every built-in profile and what it is now."""
        if self.active:
            return [active.info() for active in self.active]
        return [ProfileInfo(p.name, "off", (), _texts(p)) for p in PROFILES]

    def windows_of(self, name: str) -> Windows | None:
        """The windows of the profile ``name`` while it is on (for tests and status)."""
        return next((a.windows for a in self.active if a.profile.name == name), None)


def exemptions() -> dict[str, tuple[tuple[str, str], ...]]:
    """Each profile's exemptions, by name."""
    return {profile.name: profile.exempt for profile in PROFILES}


def _texts(profile: Profile) -> tuple[str, ...]:
    from cgguard._rules.exempt_syntax import text

    return tuple(text(pair) for pair in profile.exempt)
