"""The README's two set-up commands: CI runs the second verbatim, and the first runs the demo."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "vllm_failures.py"


def setup_commands() -> list[str]:
    """The command lines of the README's first code block."""
    text = (REPO / "README.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def demo_line(marker: str) -> int:
    (line,) = [n for n, t in enumerate(DEMO.read_text().splitlines(), 1) if marker in t]
    return line


def test_readme_starts_with_exactly_two_commands() -> None:
    """Two set-up commands, each making its own environment with the CPU build of torch pinned."""
    commands = setup_commands()
    assert len(commands) == 2
    for command in commands:
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install ")
        assert " torch==2.13.0 " in command


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run ends with the README's test command, verbatim."""
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == setup_commands()[1]


@pytest.mark.subprocess
@pytest.mark.simulated
def test_demo_command_shows_both_violations_with_file_and_line() -> None:
    """The README's demo invocation reports both failures at the demo's own lines."""
    command = setup_commands()[0].split(" && ")[-1]
    argv = shlex.split(command)
    assert argv[:3] == [".venv/bin/python", "-m", "cgguard"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")}
    done = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr
    assert done.stdout == (
        "start-up capture: refused (NestedCaptureError)\nserving: refused (CaptureDisabledError)\n"
    )
    where = f"{DEMO}:{{}} (in {{}})"
    for expected in (
        "rule=nested_capture",
        "rule=capture_disabled",
        where.format(demo_line("with torch.cuda.graph(piece):"), "fused_op"),
        where.format(demo_line("with torch.cuda.graph(graph):"), "capture_model"),
        where.format(demo_line("# lazy capture"), "__call__"),
        where.format(demo_line("cgguard.set_capture_enabled(False)"), "serve"),
        "not GPU results",
    ):
        assert expected in done.stderr
