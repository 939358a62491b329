"""Checks run against the real vLLM and SGLang, each in a process of its own whose PYTHONPATH
holds the framework's source and its dependencies (tests/test_frameworks.py starts them).

Each prints one JSON document of what it saw; the test compares it with what it expects. They
run on cgguard's simulated CUDA runtime: simulated results, not GPU results.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import torch

import cgguard
from cgguard.testing import capture_violations, simulated_cuda

MRV2 = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.capture_model"


def _capture() -> None:
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass


def _profile(name: str) -> Any:
    (found,) = [p for p in cgguard.status().profiles if p.name == name]
    return found


def vllm() -> dict[str, Any]:
    """vLLM 0.33.0's Model Runner V2, imported after install: its profile and its real
    capture_model, run on a stand-in runner."""
    cgguard.install(cgguard.Config(profiles="raise", log_file="/dev/null"))
    before = _profile("vllm").state
    import vllm.v1.worker.gpu.model_runner as runner_module
    import vllm.v1.worker.mm_encoder_model_runner as encoder_module

    profile = _profile("vllm")
    seen: dict[str, Any] = {
        "torch": torch.__version__,
        "before": before,
        "state": profile.state,
        "windows": [[w.entry, w.kind, w.state] for w in profile.windows],
    }
    classes = (runner_module.GPUModelRunner, encoder_module.MMEncoderModelRunner)
    decorated = {}
    for cls in classes:
        window = vars(cls)["capture_model"]
        # @torch.inference_mode()'s wrapper, as the class had it, and the code it runs.
        decorated[cls] = window.__wrapped__
        code = decorated[cls].__wrapped__.__code__
        where = code.co_filename.rpartition("/vllm/")[2]
        seen[cls.__name__] = [code.co_name, where, code.co_firstlineno]
    seen["run"] = _run_capture_model(runner_module)
    cgguard.uninstall()
    seen["restored"] = [vars(cls)["capture_model"] is decorated[cls] for cls in classes]
    return seen


class _Manager:
    """A stand-in for MRV2's CudaGraphManager: one graph, captured where the real one would."""

    def __init__(self) -> None:
        self.captured = 0

    def needs_capture(self) -> bool:
        return True

    def capture(self, *args: object, **kwargs: object) -> None:
        _capture()
        self.captured += 1


def _run_capture_model(runner_module: Any) -> dict[str, Any]:
    """The real GPUModelRunner.capture_model on an object with only what it reads; then a
    plugin's capture after it returned."""
    runner = runner_module.GPUModelRunner.__new__(runner_module.GPUModelRunner)
    manager = _Manager()
    state = SimpleNamespace(supports_mm_inputs=False, capture_inner_cudagraphs=_nothing)
    for name, value in {
        "cudagraph_manager": manager,
        "model_state": state,
        "lora_config": None,
        "input_buffers": None,
        "pcp_manager": None,
        "model": None,
        "intermediate_tensors": None,
        "block_tables": None,
        "attn_groups": None,
        "kv_cache_config": None,
        "use_aux_hidden_state_outputs": False,
        "speculator": None,
        "adaptive_verification": None,
        "kv_connector": SimpleNamespace(reset_capture_state=_nothing),
    }.items():
        setattr(runner, name, value)
    outcome: dict[str, Any] = {}
    # The simulated runtime models torch.cuda, not torch.accelerator's device memory queries,
    # which capture_model makes around its capture: stood in for while it runs.
    accelerator = torch.accelerator
    kept = accelerator.empty_cache, accelerator.get_memory_info
    accelerator.empty_cache = _nothing
    accelerator.get_memory_info = lambda *args: (0, 0)
    with simulated_cuda(), capture_violations() as events:
        try:
            outcome["returned"] = runner.capture_model(profile_only=True)  # @capture-model-returns
        except Exception as exc:  # what the simulation or the stand-in lacks, said exactly
            outcome["failed"] = f"{type(exc).__name__}: {exc}"
        finally:
            accelerator.empty_cache, accelerator.get_memory_info = kept
        outcome["captured"] = manager.captured
        try:
            _capture()
            outcome["plugin"] = "passed"
        except cgguard.CaptureDisabledError as exc:
            outcome["plugin"] = str(exc).rpartition("; ")[2]
    outcome["violations"] = [e["rule"] for e in events]
    return outcome


def _nothing(*args: object, **kwargs: object) -> None:
    return None


def sglang() -> dict[str, Any]:
    """SGLang 0.5.23's window modules, imported after install, and its real
    model_capture_mode() driving the window."""
    cgguard.install(cgguard.Config(profiles="raise", log_file="/dev/null"))
    from sglang.srt.compilation import compile_phase
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
        breakable_cuda_graph,  # noqa: F401 - imported for its window
    )
    from sglang.srt.model_executor.runner_utils import capture_mode

    profile = _profile("sglang")
    seen: dict[str, Any] = {
        "torch": torch.__version__,
        "state": profile.state,
        "windows": [[w.entry.rpartition(":")[2], w.kind, w.state] for w in profile.windows],
    }
    with simulated_cuda():
        outcomes = []
        for step in ("before", "inside", "after", "piecewise", "after piecewise"):
            try:
                if step == "inside":
                    with capture_mode.model_capture_mode():
                        _capture()
                elif step == "piecewise":
                    with compile_phase.set_pcg_capture_stream(torch.cuda.Stream()):
                        _capture()
                else:
                    _capture()
                outcomes.append([step, "passed"])
            except cgguard.CaptureDisabledError as exc:
                outcomes.append([step, str(exc).rpartition(", ")[2]])
    seen["captures"] = outcomes
    return seen


class _Runner:
    """What a model runner holds of a graph's inputs: its model."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(4, 4)


def vllm_bindings() -> dict[str, Any]:
    """vLLM 0.33.0's worker, imported after install with inspection on: its lifecycle functions
    wrapped, and the real Worker.add_lora, on an object with only what it reads, followed by a
    check that names a weight its runner rebound."""
    cgguard.install(cgguard.Config(inspect=True, log_file="/dev/null"))
    import vllm.v1.worker.gpu_worker as worker_module

    worker_class = worker_module.Worker
    lifecycle = ("reload_weights", "update_weights", "finish_weight_update", "add_lora")
    lifecycle += ("remove_lora", "sleep", "wake_up")
    seen: dict[str, Any] = {
        "wrapped": [
            name
            for name in lifecycle
            if vars(worker_class)[name].__code__.co_filename.endswith("lifecycle.py")
        ]
    }
    with simulated_cuda():
        runner = _Runner()
        x = torch.zeros(2, 4)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            runner.model(x)

        def add_lora(request: object) -> bool:
            # A LoRA load that binds a new weight, rather than copying into the old one.
            runner.model.weight = torch.nn.Parameter(torch.ones(4, 4))
            return True

        worker = SimpleNamespace(model_runner=SimpleNamespace(add_lora=add_lora))
        with capture_violations() as events:
            seen["returned"] = worker_class.add_lora(worker, "a LoRA request")
        seen["events"] = [[e["rule"], e["action"], e["api"]] for e in events]
        seen["named"] = [m for e in events for m in [e["message"]] if "runner.model.weight" in m]
        try:
            graph.replay()
            seen["replay"] = "replayed"
        except cgguard.StaleBindingError:
            seen["replay"] = "refused"
    seen["named"] = len(seen["named"])
    return seen


if __name__ == "__main__":
    checks = {"vllm": vllm, "sglang": sglang, "vllm_bindings": vllm_bindings}
    print(json.dumps(checks[sys.argv[1]]()))
