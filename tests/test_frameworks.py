"""The built-in profiles against the real vLLM 0.33.0 and SGLang 0.5.23, on CPU torch.

Marked ``frameworks`` (deselected by default): they need ``$FRAMEWORKS_CACHE`` to hold each
wheel's source and its dependencies, laid out as docs/integrations.md#the-real-frameworks-in-tests
says. Each check runs in a process of its own (tests/framework_checks.py), with the framework's
source and dependencies on its PYTHONPATH and this environment's torch, on the simulated runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import SourceFile, clean_environ

pytestmark = [pytest.mark.frameworks, pytest.mark.subprocess]

TESTS = Path(__file__).parent
RELEASES = {"vllm": "vllm-0.33.0", "sglang": "sglang-0.5.23"}
MRV2 = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.capture_model"
ENCODER = "vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner.capture_model"


def _run(framework: str, check: str | None = None) -> dict[str, Any]:
    found = os.environ.get("FRAMEWORKS_CACHE")
    if not found:
        pytest.skip("FRAMEWORKS_CACHE is not set: the folder of the downloaded frameworks")
    cache = Path(found)
    release = RELEASES[framework]
    source, deps = cache / "src" / release, cache / f"{framework}-deps"
    if not source.is_dir():
        wheels = sorted((cache / "wheels").glob(f"{release}-*.whl"))
        if not wheels:
            pytest.skip(f"neither $FRAMEWORKS_CACHE/src/{release} nor its wheel is there")
        with zipfile.ZipFile(wheels[-1]) as wheel:
            wheel.extractall(source, [n for n in wheel.namelist() if n.endswith(".py")])
    if not deps.is_dir():
        pytest.skip(f"no $FRAMEWORKS_CACHE/{framework}-deps (its dependencies)")
    path = os.pathsep.join([str(TESTS), str(TESTS.parent), str(source), str(deps)])
    done = subprocess.run(
        [sys.executable, str(TESTS / "framework_checks.py"), check or framework],
        env=clean_environ(PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_real_vllm_mrv2_profile_names_its_two_functions_and_guards_capture_model() -> None:
    """With vLLM 0.33.0's runner modules imported after install, the profile is active and names
    GPUModelRunner.capture_model and MMEncoderModelRunner.capture_model, their decorators'
    wrappers wrapped and put back; the real capture_model, run on a stand-in runner, captures
    inside its window, and a plugin's capture after it is refused, blamed on its return."""
    checks = SourceFile(TESTS / "framework_checks.py")
    returned = checks.line_of("@capture-model-returns")
    seen = _run("vllm")
    assert seen == {
        "torch": torch.__version__,  # this environment's, not one the dependencies brought
        "before": "waiting for import",
        "state": "active",
        "windows": [[MRV2, "function", "watched"], [ENCODER, "function", "watched"]],
        "GPUModelRunner": ["capture_model", "v1/worker/gpu/model_runner.py", 1085],
        "MMEncoderModelRunner": ["capture_model", "v1/worker/mm_encoder_model_runner.py", 76],
        "run": {
            "returned": 0,
            "captured": 1,
            "plugin": f"capture was disabled at {checks.path}:{returned} (in _run_capture_model), "
            f"where the capture window {MRV2} returned.",
            "violations": ["capture_disabled"],
        },
        "restored": [True, True],
    }


def test_real_sglang_model_capture_mode_opens_its_window() -> None:
    """With SGLang 0.5.23's window modules imported after install, its real model_capture_mode()
    and set_pcg_capture_stream() open windows: captures inside pass, captures after are refused,
    blamed on the last capture seen inside; the older module paths wait for an import."""
    seen = _run("sglang")
    mode = "sglang.srt.model_executor.runner_utils.capture_mode:is_capture_mode"
    stream = "sglang.srt.compilation.compile_phase:_pcg_capture_stream"
    assert seen == {
        "torch": torch.__version__,
        "state": "active",
        "windows": [
            ["is_capture_mode", "module attribute", "watched"],
            ["is_capture_mode", None, "waiting for import"],
            ["is_capture_mode", None, "waiting for import"],
            ["get_flags().dp.capturing_prefill_graph", "getter", "watched"],
            ["_current_capture_var", "ContextVar", "watched"],
            ["_pcg_capture_stream", "module attribute (not None)", "watched"],
        ],
        "captures": [
            ["before", "passed"],
            ["inside", "passed"],
            ["after", f"the last capture seen inside the capture window {mode}."],
            ["piecewise", "passed"],
            ["after piecewise", f"the last capture seen inside the capture window {stream}."],
        ],
    }


def test_real_vllm_lifecycle_functions_check_the_bindings() -> None:
    """vLLM's worker imported after install with inspection on: its seven lifecycle functions
    are wrapped, and the real Worker.add_lora, whose runner binds a new weight, is followed by
    a stale_binding logged (never raised into it), naming the weight; the replay is refused."""
    seen = _run("vllm", "vllm_bindings")
    assert seen == {
        "wrapped": [
            "reload_weights",
            "update_weights",
            "finish_weight_update",
            "add_lora",
            "remove_lora",
            "sleep",
            "wake_up",
        ],
        "returned": True,
        "events": [
            ["stale_binding", "logged", "vllm.v1.worker.gpu_worker:Worker.add_lora"],
        ],
        "named": 1,
        "replay": "refused",
    }
