"""The fidelity probe (cgguard.testing.probe) and the GPU kit's .ci/gpu-tests, without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from cgguard.testing import SimulatedCudaError, probe
from cgguard.testing._probe_scenarios import (
    SCENARIOS,
    capture_state,
    error_key,
    main,
    message_key,
    observe,
)

ROOT = Path(__file__).resolve().parent.parent
SIMULATED = "cgguard's simulated CUDA runtime (no GPU; not a GPU result)"

# What torch 2.13's CUDA build raises when cudaDeviceSynchronize fails during a capture
# (c10_cuda_check_implementation in c10/cuda/CUDAException.cpp).
CUDA_ERROR = (
    "CUDA error: operation not permitted when stream is capturing\n"
    "Search for `cudaErrorStreamCaptureUnsupported' in https://docs.nvidia.com/cuda/"
    "cuda-runtime-api/group__CUDART__TYPES.html for more information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


if not hasattr(torch, "AcceleratorError"):
    # The expectations and the committed table name torch's type for CUDA errors; releases
    # without it raise a plain RuntimeError, on a GPU as in the simulation.
    pytest.skip("needs torch.AcceleratorError, which this torch lacks", allow_module_level=True)


class LibraryError(torch.AcceleratorError):
    """A library's own subclass of torch's CUDA error."""


@pytest.mark.parametrize(
    ("error", "key"),
    [
        (
            torch.AcceleratorError(CUDA_ERROR),
            "AcceleratorError: operation not permitted when stream is capturing",
        ),
        (
            RuntimeError(
                "CUDA graphs must be captured on a non-default stream. (However, after capture, "
                "it's ok to replay them on the default stream.)"
            ),
            "RuntimeError: CUDA graphs must be captured on a non-default stream",
        ),
        (
            SimulatedCudaError("Capture must end on the same stream it began on. [simulated CUDA]"),
            "RuntimeError: Capture must end on the same stream it began on",
        ),
        (LibraryError("CUDA error: x\ny"), "AcceleratorError: x"),
        (ValueError(""), "ValueError: "),
    ],
)
def test_an_error_is_keyed_by_its_public_type_and_first_sentence(
    error: Exception, key: str
) -> None:
    """Errors read as the torch or builtin type a caller catches, and their first sentence."""
    assert key == error_key(error)


def test_observe_names_the_outcome_and_the_warnings() -> None:
    """A call's result is ok or its error key, each warning it gave after it, once."""

    def empty_capture_end() -> None:
        for _ in range(2):
            warnings.warn(
                "The CUDA Graph is empty. This usually means that the graph was attempted to be "
                "captured on wrong device or stream. (Triggered internally at "
                "/pytorch/aten/src/ATen/cuda/CUDAGraph.cpp:213.)",
                UserWarning,
                stacklevel=1,
            )

    def fails() -> None:
        raise torch.AcceleratorError(CUDA_ERROR)

    assert [observe(empty_capture_end), observe(fails), observe(lambda: None)] == [
        "ok (warns UserWarning: The CUDA Graph is empty)",
        "AcceleratorError: operation not permitted when stream is capturing",
        "ok",
    ]


@pytest.mark.parametrize(
    ("end", "state"),
    [
        ("ok", "ended"),
        ("ok (warns UserWarning: x)", "ended (warns UserWarning: x)"),
        (
            "AcceleratorError: operation failed due to a previous error during capture",
            "invalidated",
        ),
        ("RuntimeError: other", "RuntimeError: other"),
    ],
)
def test_the_capture_state_comes_from_its_capture_end(end: str, state: str) -> None:
    """capture_end's result reads as ended, invalidated, or the error itself."""
    assert state == capture_state(end)


def test_a_message_key_drops_the_simulation_suffix_and_cuda_prefix() -> None:
    """The key of a message is its first sentence, without ' [simulated CUDA]' or 'CUDA error: '."""
    assert message_key("\n  CUDA error: a b. c d [simulated CUDA]\nmore") == "a b"


def test_the_report_lines_and_count() -> None:
    """One line per scenario (observed, table, verdict), then the count of disagreements."""
    observed = {
        "device_synchronize/global": {
            "outcome": "AcceleratorError: operation not permitted when stream is capturing",
            "capture": "invalidated",
        },
        "empty_capture/relaxed": {
            "outcome": "ok (warns UserWarning: The CUDA Graph is empty)",
            "capture": "not capturing",
        },
        "pool_before_capture/global": {
            "outcome": "RuntimeError: Called CUDAGraph::pool() without a preceding successful "
            "capture",
            "capture": "none begun",
        },
    }
    table = {
        "device_synchronize/global": observed["device_synchronize/global"],
        "empty_capture/relaxed": {"outcome": "ok", "capture": "not capturing"},
    }
    where = "CUDA (NVIDIA H200, torch 2.13.0+cu130, CUDA 13.0)"
    pad = " " * (max(map(len, probe.keys())) + 2)  # the longest scenario name, and two
    assert [
        "observed on CUDA (NVIDIA H200, torch 2.13.0+cu130, CUDA 13.0)",
        "device_synchronize/global" + pad[len("device_synchronize/global") :] + "cuda: "
        "AcceleratorError: operation not permitted when stream is capturing; capture: "
        "invalidated  |  simulated table: AcceleratorError: operation not permitted when "
        "stream is capturing; capture: invalidated  |  agree",
        "empty_capture/relaxed" + pad[len("empty_capture/relaxed") :] + "cuda: "
        "ok (warns UserWarning: The CUDA Graph is empty); capture: not capturing  |  "
        "simulated table: ok; capture: not capturing  |  DISAGREE",
        "pool_before_capture/global" + pad[len("pool_before_capture/global") :] + "cuda: "
        "RuntimeError: Called CUDAGraph::pool() without a preceding successful capture; "
        "capture: none begun  |  simulated table: missing from the table  |  DISAGREE",
        "2 of 3 scenarios disagree with the simulated table (observed on CUDA (NVIDIA H200, "
        "torch 2.13.0+cu130, CUDA 13.0))",
    ] == list(probe.report(observed.items(), table, where))


@pytest.mark.simulated
def test_the_committed_table_is_what_the_simulation_does(tmp_path: Path) -> None:
    """Regenerating the table from the simulation changes none of its results.

    A change to the simulation that the table does not carry fails here: regenerate the table
    with `python -m cgguard.testing.probe --write-simulated` and review the diff.
    """
    written = tmp_path / "table.json"
    assert probe.main(["--write-simulated", "--table", str(written)]) == 0
    stale = f"the simulated table is stale; regenerate it with: {probe.REGENERATE}"
    assert probe.read_table(probe.TABLE) == probe.read_table(written), stale
    assert probe.keys() == list(probe.read_table(written))


@pytest.mark.simulated
def test_a_table_that_disagrees_is_reported_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A made-up table result shows as DISAGREE on its line, in the count and the exit status."""
    document = json.loads(probe.TABLE.read_text())
    document["results"]["empty_capture/relaxed"] = {"outcome": "made up", "capture": "ended"}
    table = tmp_path / "table.json"
    table.write_text(json.dumps(document))
    assert probe.main(["--table", str(table), "--only", "empty_capture"]) == 1
    lines = capsys.readouterr().out.splitlines()
    # Each line: the scenario padded to the longest name and two spaces, then both sides.
    width = max(map(len, probe.keys())) + 2
    empty = "ok (warns UserWarning: The CUDA Graph is empty); capture: not capturing"
    assert [
        f"observed on {SIMULATED}",
        f"{'empty_capture/global':<{width}}simulation now: {empty}  |  simulated table: "
        f"{empty}  |  agree",
        f"{'empty_capture/thread_local':<{width}}simulation now: {empty}  |  simulated table: "
        f"{empty}  |  agree",
        f"{'empty_capture/relaxed':<{width}}simulation now: {empty}  |  simulated table: "
        "made up; capture: ended  |  DISAGREE",
        f"1 of 3 scenarios disagree with the simulated table (observed on {SIMULATED})",
    ] == lines


@pytest.mark.simulated
@pytest.mark.subprocess
def test_a_scenario_runs_in_a_fresh_interpreter() -> None:
    """The subprocess path (the one a GPU takes) brings back the scenario's own result."""
    key = "end_on_wrong_stream/relaxed"
    observed = probe.observe_in_subprocesses(
        [key, "no_such_scenario/global"],
        python=sys.executable,
        jobs=2,
        timeout=120,
        simulated=True,
    )
    assert [
        (key, probe.read_table(probe.TABLE)[key]),
        (
            "no_such_scenario/global",
            {
                "outcome": "probe failed: exit status 2: usage: _probe_scenarios.py [--simulated] "
                "SCENARIO MODE; got ['--simulated', 'no_such_scenario', 'global']; scenarios: "
                f"{', '.join(SCENARIOS)}; modes: global, thread_local, relaxed",
                "capture": "unknown",
            },
        ),
    ] == list(observed)


def test_a_scenario_process_with_cgguard_loaded_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    """On CUDA the scenario process observes torch alone: with cgguard loaded it refuses."""
    assert main(["empty_capture", "global"]) == 3
    assert capsys.readouterr().err.startswith("cgguard is loaded in the probe's process: cgguard, ")


@pytest.mark.simulated
def test_the_probe_refuses_to_observe_with_cgguard_installed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The table records the simulation alone: with cgguard installed the probe does not run."""
    import cgguard

    cgguard.install()
    assert probe.main(["--simulated", "--only", "empty_capture"]) == 2
    assert capsys.readouterr() == (
        "",
        "the probe cannot run on the simulated runtime here: cgguard is installed in this "
        "process (CGGUARD_ENABLED?)\n",
    )


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--write-simulated with --only, and a table that cannot be read, exit 2 with one line."""
    assert probe.main(["--write-simulated", "--only", "empty_capture"]) == 2
    assert probe.main(["--table", "/nonexistent/table.json", "--simulated"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "--write-simulated writes the whole table; drop --only",
        "cannot read the simulated table /nonexistent/table.json: FileNotFoundError(2, 'No such "
        "file or directory')",
    ]


def gpu_tests(path: str) -> subprocess.CompletedProcess[str]:
    """.ci/gpu-tests run with ``path`` first on PATH, so that its ``python3`` is found there."""
    return subprocess.run(
        [str(ROOT / ".ci" / "gpu-tests")],
        env={**os.environ, "PATH": f"{path}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.subprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_gpu_tests_without_a_device_says_so_and_does_nothing() -> None:
    """With torch but no CUDA device, .ci/gpu-tests says so and stops before any set-up."""
    done = gpu_tests(str(Path(sys.executable).parent))
    assert (done.returncode, done.stdout) == (1, "")
    assert (
        "gpu-tests: no CUDA device: torch.cuda.is_available() is False "
        f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}); "
        "nothing was run\n"
    ) == done.stderr
    assert not (ROOT / "build" / "gpu-tests-venv").exists()


@pytest.mark.subprocess
def test_gpu_tests_without_torch_names_the_python(tmp_path: Path) -> None:
    """A python3 that cannot import torch is named, with how to pick another."""
    shim = tmp_path / "python3"
    # -S: no site-packages, so this interpreter has no torch.
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    shim.chmod(0o755)
    done = gpu_tests(str(tmp_path))
    assert (done.returncode, done.stdout) == (1, "")
    assert (
        f"gpu-tests: {sys.executable} cannot import torch (No module named 'torch'); run it "
        "with the Python that has the machine's CUDA build of torch: "
        "GPU_TESTS_PYTHON=/path/to/python .ci/gpu-tests\n"
    ) == done.stderr
