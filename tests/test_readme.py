"""The README's two set-up commands: CI runs the second verbatim, and the first runs the demo."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_environ

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "vllm_failures.py"


def setup_commands() -> list[str]:
    """The command lines of the README's first code block."""
    text = (REPO / "README.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


# pip's options that take a value: the value names no distribution to install.
PIP_VALUED = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "-r")


def installed_by(command: str) -> set[str]:
    """What a set-up command's ``pip install`` names to install, besides the project itself."""
    (words,) = [
        words
        for words in map(shlex.split, command.split(" && "))
        if words[0].rsplit("/", 1)[-1] in ("pip", "pip3") and words[1:2] == ["install"]
    ]
    names: set[str] = set()
    skip = False
    for word in words[words.index("install") + 1 :]:
        if skip or word.startswith("-"):
            skip = not skip and word in PIP_VALUED
            continue
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", word)  # "." and ".[test]" are the project
        if name:
            names.add(name.group().lower())
    return names


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


def test_installed_by_reads_the_pip_install_of_a_set_up_command() -> None:
    """installed_by() names what pip installs, neither the project nor an option's value."""
    command = (
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' torch==2.13.0 "
        "--extra-index-url https://download.example/whl NumPy>=2 && .venv/bin/python -V"
    )
    assert {"torch", "numpy"} == installed_by(command)


# Imported in place of numpy where the demo's set-up does not install it: the test environment
# has numpy (the test extra), and torch behaves differently without it.
NO_NUMPY = "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
# A line Python's warnings module prints ("file:line: Category: message").
WARNING_LINE = re.compile(r":\d+: \w*Warning: ")
SIMULATION_NOTICE = (
    "cgguard: CGGUARD_SIMULATE_CUDA: torch.cuda runs on cgguard's simulated CUDA runtime "
    "(no GPU work; results are not GPU results)"
)


@pytest.mark.subprocess
@pytest.mark.simulated
def test_demo_command_shows_both_violations_with_file_and_line(tmp_path: Path) -> None:
    """The README's demo, in what its set-up installs, reports both failures and no warning."""
    setup = setup_commands()[0]
    argv = shlex.split(setup.split(" && ")[-1])
    assert argv[:3] == [".venv/bin/python", "-m", "cgguard"]
    # No CGGUARD_* or PYTHON* variable of the caller's (PYTHONWARNINGS would hide warnings).
    env = clean_environ()
    if "numpy" not in installed_by(setup):
        (tmp_path / "numpy").mkdir()
        (tmp_path / "numpy" / "__init__.py").write_text(NO_NUMPY)
        env["PYTHONPATH"] = str(tmp_path)
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
    # Neither a Python warning nor one of cgguard's own lines, besides the simulation's notice.
    stray = [
        line
        for line in done.stderr.splitlines()
        if WARNING_LINE.search(line) or (line.startswith("cgguard: ") and line != SIMULATION_NOTICE)
    ]
    assert stray == []
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
