"""cgguard run and cgguard info: the runner execs the program exactly as plain python runs it.

Every program here runs in a real subprocess and is compared whole (exit status, stdout, stderr)
with the same program run by plain ``python``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import platform
import shutil
import signal
import site
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING, NamedTuple

import pytest
from helpers import (
    DEFAULT_CONFIGURATION,
    clean_environ,
    patched_count,
    standin_hooks,
    torch_entry_points,
)

import cgguard
from cgguard._commands.run import BOOT_DIR, program_environ, run_parser
from cgguard._config.settings import BOOL, PATH, SETTINGS

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from cgguard._config.settings import Setting

pytestmark = pytest.mark.subprocess

# (returncode, stdout, stderr) of a finished process.
Result = tuple[int, bytes, bytes]

RUNNER = ("-m", "cgguard", "run")
USAGE = "usage: cgguard run [options] (script.py | -m module | command) [args ...]\n"
# Every runner option, each set away from its default.
RUNNER_OPTIONS = (
    "--mode",
    "log",
    "--log-format",
    "json",
    "--log-file",
    "cgg.log",
    "--capture",
    "disabled",
    "--log-target",
    "file",
    "--report",
    "cgg_report.json",
    "--rule",
    "nested_capture=off",
    "--rule",
    "sync_during_capture=raise",
    "--simulate-cuda",
)
NOT_FOUND = "cgguard run: cannot run {!r}: no such file, and no command of that name on PATH\n"


def command(argv: Sequence[str], cwd: Path, env: Mapping[str, str], stdin: bytes = b"") -> Result:
    """Run ``argv`` in ``cwd`` with exactly ``env`` and ``stdin`` piped in."""
    done = subprocess.run(
        list(argv),
        cwd=cwd,
        env=dict(env),
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def python(args: Sequence[str], cwd: Path, env: Mapping[str, str], stdin: bytes = b"") -> Result:
    """Run ``python *args`` (this interpreter) in ``cwd`` with exactly ``env``."""
    return command([sys.executable, *args], cwd, env, stdin)


def run_both(
    cwd: Path,
    program: Sequence[str],
    *,
    options: Sequence[str] = (),
    flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    stdin: bytes = b"",
) -> Result:
    """Run ``program`` plainly and under ``cgguard run *options``; assert equal results, return it.

    ``flags`` go to the interpreter in both runs: before the script, and before ``-m cgguard``.
    """
    environ = clean_environ() if env is None else env
    plain = python([*flags, *program], cwd, environ, stdin)
    runner = python([*flags, *RUNNER, *options, *program], cwd, environ, stdin)
    assert plain == runner
    return plain


def without_markers(traceback: bytes) -> bytes:
    """``traceback`` without the lines that only mark part of the line above (``~~~~~^^``):
    Python 3.13 marks calls that 3.10 to 3.12 leave unmarked."""
    return b"".join(
        line
        for line in traceback.splitlines(keepends=True)
        if not (line.strip() and not line.strip().strip(b"~^"))
    )


def loads(data: bytes) -> object:
    """``data`` decoded from JSON, or ``data`` itself when it is not JSON (shown in the diff)."""
    try:
        return json.loads(data)
    except ValueError:
        return data


def decoded(result: Result) -> tuple[int, object, bytes]:
    """``result`` with its stdout decoded from JSON where it is JSON."""
    returncode, out, err = result
    return returncode, loads(out), err


def write(path: Path, source: str) -> Path:
    """Write ``source`` (dedented) to ``path``, creating its folder; return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def invalid_choice(prog: str, option: str, choices: tuple[str, ...], value: str) -> bytes:
    """The error line argparse itself prints for ``value`` outside ``choices``.

    Computed rather than written out: argparse's wording of it changes between Python versions.
    """
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument(option, choices=choices)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        parser.parse_args([option, value] if option.startswith("-") else [value])
    return (err.getvalue().splitlines()[-1] + "\n").encode()


def activated_by() -> str:
    """What activates a runner's child first: the installed .pth, else the bootstrap folder."""
    pth = [os.path.join(folder, "cgguard.pth") for folder in site.getsitepackages()]
    return "pth" if any(os.path.isfile(p) for p in pth) else "sitecustomize"


# Prints how the program was started, as one JSON line; the scenario's ending follows it.
PROBE = """\
import json, os, sys
started = {
    "argv": sys.argv,
    "name": __name__,
    "file": __file__,
    "spec": __spec__ and __spec__.name,
    "path0": sys.path[0],
    "orig_argv": sys.orig_argv,
    "executable": sys.executable,
}
print(json.dumps(started), flush=True)
"""


# Scripts whose names python would read as its own flags without a ``--`` before them.
DASHED = ("-cgg_probe.py", "-cprint('cgg')", "-mcgg_probe_mod")


def write_probes(tmp_path: Path, ending: str = "") -> None:
    """The probe as a script, a script in sub/, a module, a package and a runnable folder, and
    as scripts named like python's flags (DASHED)."""
    source = PROBE + ending
    write(tmp_path / "cgg_probe.py", source)
    for name in DASHED:
        write(tmp_path / name, source)
    write(tmp_path / "sub" / "cgg_probe_sub.py", source)
    write(tmp_path / "cgg_probe_mod.py", source)
    write(tmp_path / "cgg_probe_pkg" / "__init__.py", "")
    write(tmp_path / "cgg_probe_pkg" / "__main__.py", source)
    write(tmp_path / "cgg_probe_pkg" / "cli.py", source)
    write(tmp_path / "cgg_probe_dir" / "__main__.py", source)


class Start(NamedTuple):
    """A way to start the probe, and what it sees; "{tmp}" stands for the folder it runs in."""

    options: tuple[str, ...]  # the runner's, before the program
    program: tuple[str, ...]  # what follows ``python``
    argv: tuple[str, ...]  # sys.argv
    spec: str | None  # __spec__.name
    file: str  # __file__
    path0: str  # sys.path[0]

    def at(self, tmp_path: Path) -> Start:
        """This start with "{tmp}" replaced by ``tmp_path``."""

        def at(value: str) -> str:
            return value.replace("{tmp}", str(tmp_path))

        return self._replace(
            program=tuple(map(at, self.program)),
            argv=tuple(map(at, self.argv)),
            file=at(self.file),
            path0=at(self.path0),
        )

    def probe_line(self) -> dict[str, object]:
        """What the probe prints for this start (once resolved with at())."""
        return {
            "argv": list(self.argv),
            "name": "__main__",
            "file": self.file,
            "spec": self.spec,
            "path0": self.path0,
            "orig_argv": [sys.executable, *self.program],
            "executable": sys.executable,
        }


SCRIPT = Start(
    (), ("cgg_probe.py", "a"), ("cgg_probe.py", "a"), None, "{tmp}/cgg_probe.py", "{tmp}"
)
MODULE = Start(
    (),
    ("-m", "cgg_probe_mod", "a"),
    ("{tmp}/cgg_probe_mod.py", "a"),
    "cgg_probe_mod",
    "{tmp}/cgg_probe_mod.py",
    "{tmp}",
)
OPTION_LIKE = ("--mode", "log", "-m", "x", "--", "--simulate-cuda", "--bogus")

STARTS = {
    "relative path": SCRIPT,
    "relative path in a subfolder": Start(
        (),
        ("sub/cgg_probe_sub.py",),
        ("sub/cgg_probe_sub.py",),
        None,
        "{tmp}/sub/cgg_probe_sub.py",
        "{tmp}/sub",
    ),
    "absolute path": SCRIPT._replace(
        program=("{tmp}/cgg_probe.py", "a"), argv=("{tmp}/cgg_probe.py", "a")
    ),
    "arguments that look like runner options": SCRIPT._replace(
        program=("cgg_probe.py", *OPTION_LIKE), argv=("cgg_probe.py", *OPTION_LIKE)
    ),
    "runner options before the script": SCRIPT._replace(
        options=(*RUNNER_OPTIONS[:2], "--log-format", "console", *RUNNER_OPTIONS[4:])
    ),
    "-- ends the runner options": SCRIPT._replace(
        options=("--mode", "log", "--"),
        program=("cgg_probe.py", "--mode"),
        argv=("cgg_probe.py", "--mode"),
    ),
    **{
        f"-- and a script named {name}": Start(
            (), ("--", name, "a"), (name, "a"), None, "{tmp}/" + name, "{tmp}"
        )
        for name in DASHED
    },
    "runner options, -- and a script whose name starts with -": Start(
        ("--mode", "log"),
        ("--", "-cgg_probe.py", "--mode"),
        ("-cgg_probe.py", "--mode"),
        None,
        "{tmp}/-cgg_probe.py",
        "{tmp}",
    ),
    "-m module": MODULE,
    "-m module with arguments that look like runner options": MODULE._replace(
        program=("-m", "cgg_probe_mod", *OPTION_LIKE),
        argv=("{tmp}/cgg_probe_mod.py", *OPTION_LIKE),
    ),
    "-m module after runner options": MODULE._replace(options=("--log-file", "cgg.log")),
    "-m package with __main__.py": Start(
        (),
        ("-m", "cgg_probe_pkg", "y"),
        ("{tmp}/cgg_probe_pkg/__main__.py", "y"),
        "cgg_probe_pkg.__main__",
        "{tmp}/cgg_probe_pkg/__main__.py",
        "{tmp}",
    ),
    "-m submodule of a package": Start(
        (),
        ("-m", "cgg_probe_pkg.cli"),
        ("{tmp}/cgg_probe_pkg/cli.py",),
        "cgg_probe_pkg.cli",
        "{tmp}/cgg_probe_pkg/cli.py",
        "{tmp}",
    ),
    "folder with __main__.py": Start(
        (),
        ("cgg_probe_dir", "z"),
        ("cgg_probe_dir", "z"),
        "__main__",
        "{tmp}/cgg_probe_dir/__main__.py",
        "{tmp}/cgg_probe_dir",
    ),
}


@pytest.mark.parametrize("start", [pytest.param(s, id=name) for name, s in STARTS.items()])
def test_program_starts_as_under_plain_python(tmp_path: Path, start: Start) -> None:
    """argv, __name__, __file__, __spec__, sys.path[0] and orig_argv are plain python's."""
    write_probes(tmp_path)
    start = start.at(tmp_path)
    returncode, out, err = run_both(tmp_path, start.program, options=start.options)
    expected = (0, start.probe_line(), b"")
    assert expected == decoded((returncode, out, err))


class Ending(NamedTuple):
    """How the probe ends, and what its caller sees of that."""

    source: str
    status: int
    stderr: bytes


ENDINGS = {
    "falls off the end": Ending("", 0, b""),
    "sys.exit(0)": Ending("sys.exit(0)\n", 0, b""),
    "sys.exit(3)": Ending("sys.exit(3)\n", 3, b""),
    "sys.exit(255)": Ending("sys.exit(255)\n", 255, b""),
    "sys.exit(message)": Ending("sys.exit('cgg probe gave up')\n", 1, b"cgg probe gave up\n"),
    "killed by SIGTERM": Ending(
        "import signal\nos.kill(os.getpid(), signal.SIGTERM)\n", -signal.SIGTERM, b""
    ),
}


@pytest.mark.parametrize(
    "start", [pytest.param(SCRIPT, id="script"), pytest.param(MODULE, id="module")]
)
@pytest.mark.parametrize("ending", [pytest.param(e, id=name) for name, e in ENDINGS.items()])
def test_exit_status_as_under_plain_python(tmp_path: Path, start: Start, ending: Ending) -> None:
    """sys.exit codes, sys.exit(message) and death by signal reach the caller as from python."""
    write_probes(tmp_path, ending.source)
    start = start.at(tmp_path)
    returncode, out, err = run_both(tmp_path, start.program)
    expected = (ending.status, start.probe_line(), ending.stderr)
    assert expected == decoded((returncode, out, err))


FAILING = """\
def inner():
    raise ValueError("cgg probe failed")


def outer():
    inner()


outer()
"""


def test_traceback_is_plain_pythons(tmp_path: Path) -> None:
    """An uncaught exception in a script: status 1 and plain python's whole traceback."""
    write(tmp_path / "cgg_fail.py", FAILING)
    file = tmp_path / "cgg_fail.py"
    traceback = (
        "Traceback (most recent call last):\n"
        f'  File "{file}", line 9, in <module>\n'
        "    outer()\n"
        f'  File "{file}", line 6, in outer\n'
        "    inner()\n"
        f'  File "{file}", line 2, in inner\n'
        '    raise ValueError("cgg probe failed")\n'
        "ValueError: cgg probe failed\n"
    )
    expected = (1, b"", traceback.encode())
    returncode, out, err = run_both(tmp_path, ["cgg_fail.py", "a"])
    assert expected == (returncode, out, without_markers(err))


def test_traceback_of_a_module_is_plain_pythons(tmp_path: Path) -> None:
    """An uncaught exception in ``-m module``: status 1, runpy's frames, the module's, no more."""
    write(tmp_path / "cgg_fail.py", FAILING)
    returncode, out, err = run_both(tmp_path, ["-m", "cgg_fail", "a"])
    file = str(tmp_path / "cgg_fail.py")
    lines = err.decode().splitlines()
    # runpy's file is "<frozen runpy>" or a path, by Python version.
    files = [line.split('"')[1] for line in lines if line.startswith("  File ")]
    shown = ["runpy" if "runpy" in f else f for f in files]
    expected = (1, b"", ["runpy", "runpy", file, file, file], "ValueError: cgg probe failed")
    assert expected == (returncode, out, shown, lines[-1])


ENV_PROBE = """\
import json, os, sys
print(json.dumps({"environ": dict(os.environ), "path": sys.path}))
"""


def environ_and_path(result: Result, stderr: bytes = b"") -> tuple[dict[str, str], list[str]]:
    """The environment and sys.path that ENV_PROBE printed; asserts it ran, printing ``stderr``."""
    returncode, out, err = result
    clean = (0, stderr)
    assert clean == (returncode, err)
    seen = json.loads(out)
    return seen["environ"], seen["path"]


@pytest.mark.parametrize(
    ("old", "expected"),
    [
        pytest.param(None, BOOT_DIR, id="unset"),
        pytest.param("", BOOT_DIR, id="empty"),
        pytest.param(
            f"/cgg/none/a{os.pathsep}/cgg/none/b",
            f"{BOOT_DIR}{os.pathsep}/cgg/none/a{os.pathsep}/cgg/none/b",
            id="set",
        ),
        pytest.param(
            f"{os.pathsep}/cgg/none/a",
            f"{BOOT_DIR}{os.pathsep}{os.pathsep}/cgg/none/a",
            id="set with an empty entry",
        ),
    ],
)
def test_environment_of_the_program(tmp_path: Path, old: str | None, expected: str) -> None:
    """Options override CGGUARD_*, others pass (unknown ones warned of), ENABLED=1, PYTHONPATH."""
    write(tmp_path / "sub" / "cgg_env.py", ENV_PROBE)
    env = clean_environ(
        CGGUARD_MODE="raise",
        CGGUARD_RULE_NESTED_CAPTURE="raise",
        CGGUARD_RULE_CONCURRENT_CAPTURE="off",
        CGGUARD_OTHER="x",
    )
    if old is not None:
        env["PYTHONPATH"] = old
    plain_environ, plain_path = environ_and_path(python(["sub/cgg_env.py"], tmp_path, env))
    runner_environ, runner_path = environ_and_path(
        python([*RUNNER, *RUNNER_OPTIONS, "sub/cgg_env.py"], tmp_path, env),
        b"cgguard: ignoring CGGUARD_OTHER: no such variable; the variables are CGGUARD_ENABLED, "
        b"CGGUARD_MODE, CGGUARD_LOG_FORMAT, CGGUARD_LOG_FILE, CGGUARD_LOG_TARGET, "
        b"CGGUARD_LOG_LEVEL, CGGUARD_REPORT, CGGUARD_CAPTURE, CGGUARD_SIMULATE_CUDA, "
        b"CGGUARD_VLLM_BRIDGE, CGGUARD_EXEMPT, CGGUARD_EXEMPT_FILE, CGGUARD_WINDOW, "
        b"CGGUARD_PROFILES, CGGUARD_INSPECT, "
        b"CGGUARD_INSPECT_FIRST, CGGUARD_CENSUS, CGGUARD_CENSUS_REPLAYS, CGGUARD_METRICS, "
        b"CGGUARD_MANIFEST, CGGUARD_RANK_CHECK, "
        b"CGGUARD_RULE_<RULE>\n",
    )
    assert {
        **plain_environ,
        "CGGUARD_MODE": "log",
        "CGGUARD_LOG_FORMAT": "json",
        # Made absolute where the runner ran: the program may change directory first.
        "CGGUARD_LOG_FILE": str(tmp_path / "cgg.log"),
        "CGGUARD_LOG_TARGET": "file",
        "CGGUARD_REPORT": str(tmp_path / "cgg_report.json"),
        "CGGUARD_CAPTURE": "disabled",
        "CGGUARD_SIMULATE_CUDA": "1",
        "CGGUARD_RULE_NESTED_CAPTURE": "off",
        "CGGUARD_RULE_SYNC_DURING_CAPTURE": "raise",
        "CGGUARD_RULE_CONCURRENT_CAPTURE": "off",
        "CGGUARD_ENABLED": "1",
        "CGGUARD_OTHER": "x",
        "PYTHONPATH": expected,
    } == runner_environ
    # Only the bootstrap folder is added: no '' and no current directory beyond plain python's.
    assert [plain_path[0], BOOT_DIR, *plain_path[1:]] == runner_path
    assert os.path.isabs(BOOT_DIR)


def test_rule_report_and_log_target_reach_the_program(tmp_path: Path) -> None:
    """--rule (repeatable, also --rule=...), --report, --log-target: their CGGUARD_* variables."""
    write(tmp_path / "cgg_env.py", ENV_PROBE)
    env = clean_environ(CGGUARD_RULE_SYNC_DURING_CAPTURE="raise")
    plain_environ, _ = environ_and_path(python(["cgg_env.py"], tmp_path, env))
    options = [
        "--rule",
        "nested_capture=off",
        "--report",
        "r.json",
        "--log-target",
        "logging",
        "--rule",
        "capture_disabled=log",
        "--rule=concurrent_capture=raise",
    ]
    runner_environ, _ = environ_and_path(python([*RUNNER, *options, "cgg_env.py"], tmp_path, env))
    assert {
        **plain_environ,
        "CGGUARD_RULE_NESTED_CAPTURE": "off",
        "CGGUARD_RULE_CAPTURE_DISABLED": "log",
        "CGGUARD_RULE_CONCURRENT_CAPTURE": "raise",
        "CGGUARD_RULE_SYNC_DURING_CAPTURE": "raise",
        "CGGUARD_REPORT": str(tmp_path / "r.json"),
        "CGGUARD_LOG_TARGET": "logging",
        "CGGUARD_ENABLED": "1",
        "PYTHONPATH": BOOT_DIR,
    } == runner_environ


def test_runner_inside_runner_adds_the_bootstrap_once(tmp_path: Path) -> None:
    """A program that runs ``cgguard run`` again gets the same environment as one runner gives."""
    write(tmp_path / "cgg_env.py", ENV_PROBE)
    env = clean_environ()
    once = python([*RUNNER, "cgg_env.py"], tmp_path, env)
    twice = python([*RUNNER, *RUNNER, "cgg_env.py"], tmp_path, env)
    assert once == twice
    assert environ_and_path(once)[0]["PYTHONPATH"] == BOOT_DIR


POOL = """\
import multiprocessing


def square(n):
    return n * n


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        print(pool.map(square, range(8)))
"""


@pytest.mark.parametrize(
    "program",
    [pytest.param(("cgg_pool.py",), id="script"), pytest.param(("-m", "cgg_pool"), id="module")],
)
def test_spawn_pool_over_a_function_in_main(tmp_path: Path, program: tuple[str, ...]) -> None:
    """A spawn Pool mapping a function defined in __main__ works as under plain python."""
    write(tmp_path / "cgg_pool.py", POOL)
    expected = (0, b"[0, 1, 4, 9, 16, 25, 36, 49]\n", b"")
    assert expected == run_both(tmp_path, program)


def test_program_read_from_stdin(tmp_path: Path) -> None:
    """``cgguard run - a`` runs the program piped into stdin, as ``python - a`` does."""
    source = b"import sys\nprint(sys.argv, __name__)\n"
    expected = (0, b"['-', 'a'] __main__\n", b"")
    assert expected == run_both(tmp_path, ["-", "a"], stdin=source)


def test_stdin_reaches_stdout_byte_for_byte(tmp_path: Path) -> None:
    """Bytes piped into the program come out of its stdout unchanged; the runner adds none."""
    write(tmp_path / "cgg_cat.py", "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())\n")
    data = bytes(range(256)) * 64 + b"\r\n\x00no newline at the end"
    expected = (0, data, b"")
    assert expected == run_both(tmp_path, ["cgg_cat.py"], stdin=data)


FLAGS_PROBE = """\
import json, sys
names = ("dev_mode", "optimize", "isolated", "ignore_environment", "no_user_site",
         "dont_write_bytecode")
flags = {name: getattr(sys.flags, name) for name in names}
print(json.dumps([flags, sys.warnoptions, sys.orig_argv, sys.argv]))
"""

NO_FLAGS = {
    "dev_mode": False,
    "optimize": 0,
    "isolated": 0,
    "ignore_environment": 0,
    "no_user_site": 0,
    "dont_write_bytecode": 0,
}
DEV = {**NO_FLAGS, "dev_mode": True}


@pytest.mark.parametrize(
    ("flags", "sys_flags", "warnoptions"),
    [
        pytest.param(("-X", "dev", "-W", "error"), DEV, ["default", "error"], id="-X dev -W error"),
        pytest.param(("-Xdev", "-Werror"), DEV, ["default", "error"], id="-Xdev -Werror"),
        pytest.param(
            ("-O", "-u", "-B"),
            {**NO_FLAGS, "optimize": 1, "dont_write_bytecode": 1},
            [],
            id="-O -u -B",
        ),
        pytest.param(
            ("-I",),
            {**NO_FLAGS, "isolated": 1, "ignore_environment": 1, "no_user_site": 1},
            [],
            id="-I",
        ),
    ],
)
def test_interpreter_flags_carry_to_the_program(
    tmp_path: Path, flags: tuple[str, ...], sys_flags: dict[str, object], warnoptions: list[str]
) -> None:
    """``python FLAGS -m cgguard run x.py`` starts x.py with FLAGS, as ``python FLAGS x.py``."""
    write(tmp_path / "cgg_flags.py", FLAGS_PROBE)
    returncode, out, err = run_both(tmp_path, ["cgg_flags.py", "a"], flags=flags)
    seen = [
        sys_flags,
        warnoptions,
        [sys.executable, *flags, "cgg_flags.py", "a"],
        ["cgg_flags.py", "a"],
    ]
    expected = (0, seen, b"")
    assert expected == decoded((returncode, out, err))


# Starts the runner from a script of its own, so that python's ``--`` can come before it.
LAUNCHER = """\
import sys
from cgguard._commands.main import main
sys.exit(main())
"""


@pytest.mark.parametrize(
    "runner",
    [
        pytest.param(RUNNER, id="-m cgguard run"),
        pytest.param(("--", "cgg_launch.py", "run"), id="-- launcher.py run"),
    ],
)
def test_interpreter_flags_come_before_the_dashes_of_a_dashed_script(
    tmp_path: Path, runner: tuple[str, ...]
) -> None:
    """``python -X dev RUNNER -- -x.py`` starts ``python -X dev -- -x.py``: flags, then ``--``."""
    write(tmp_path / "-cgg_flags.py", FLAGS_PROBE)
    write(tmp_path / "cgg_launch.py", LAUNCHER)
    flags, program = ("-X", "dev"), ("--", "-cgg_flags.py", "a")
    plain = python([*flags, *program], tmp_path, clean_environ())
    under_runner = python([*flags, *runner, *program], tmp_path, clean_environ())
    seen = [
        DEV,
        ["default"],
        [sys.executable, "-X", "dev", "--", "-cgg_flags.py", "a"],
        ["-cgg_flags.py", "a"],
    ]
    expected = (0, seen, b"")
    assert (expected, expected) == (decoded(plain), decoded(under_runner))


def test_console_script(tmp_path: Path) -> None:
    """The installed ``cgguard run script.py`` starts the script as plain python does."""
    console = shutil.which("cgguard", path=os.path.dirname(sys.executable))
    if console is None:
        pytest.skip(f"no cgguard console script next to {sys.executable}")
    # The program runs on the script's interpreter (its #! line), which may be spelt python3.
    with open(console, "rb") as script:
        interpreter = script.readline().removeprefix(b"#!").strip().decode()
    if not os.path.isfile(interpreter) or not os.path.samefile(interpreter, sys.executable):
        pytest.skip(f"{console} does not start {sys.executable} by its #! line")
    write_probes(tmp_path)
    program = ("cgg_probe.py", "--mode", "log")
    env = clean_environ()
    plain = command([interpreter, *program], tmp_path, env)
    assert plain == command([console, "run", *program], tmp_path, env)
    start = SCRIPT._replace(program=program, argv=program).at(tmp_path)
    line = {**start.probe_line(), "executable": interpreter, "orig_argv": [interpreter, *program]}
    expected = (0, line, b"")
    assert expected == decoded(plain)


SHELL_COMMAND = """\
#!/bin/sh
echo "$0 $@"
echo "enabled=$CGGUARD_ENABLED"
"""


def path_with(folder: Path) -> dict[str, str]:
    """The clean environment with ``folder`` first on PATH."""
    return clean_environ(PATH=f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def test_command_on_path(tmp_path: Path) -> None:
    """``cgguard run NAME args`` runs the command NAME found on PATH, with CGGUARD_ENABLED=1."""
    bin_dir = tmp_path / "bin"
    script = write(bin_dir / "cgg-probe-cmd", SHELL_COMMAND)
    script.chmod(0o755)
    env = path_with(bin_dir)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    plain = command(["cgg-probe-cmd", "a", "--mode", "b"], cwd, env)
    runner = python([*RUNNER, "cgg-probe-cmd", "a", "--mode", "b"], cwd, env)
    # The kernel hands a #! script the path it was found at as $0, under plain exec too.
    expected = (
        (0, f"{script} a --mode b\nenabled=\n".encode(), b""),
        (0, f"{script} a --mode b\nenabled=1\n".encode(), b""),
    )
    assert expected == (plain, runner)


def test_command_on_path_gets_its_name_as_argv0(tmp_path: Path) -> None:
    """The command's argv[0] is the name given to the runner, not the path found on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cgg-probe-python").symlink_to(os.path.realpath(sys.executable))
    code = "import json, os, sys; print(json.dumps([sys.orig_argv, os.environ['CGGUARD_ENABLED']]))"
    result = python([*RUNNER, "cgg-probe-python", "-c", code, "x"], tmp_path, path_with(bin_dir))
    expected = (0, [["cgg-probe-python", "-c", code, "x"], "1"], b"")
    assert expected == decoded(result)


def test_existing_file_wins_over_a_command_on_path(tmp_path: Path) -> None:
    """``run NAME`` runs a file NAME in the current directory with python, as python would."""
    bin_dir = tmp_path / "bin"
    write(bin_dir / "cgg-probe-cmd", SHELL_COMMAND).chmod(0o755)
    write(tmp_path / "cgg-probe-cmd", "import sys\nprint('python ran', sys.argv)\n")
    result = run_both(tmp_path, ["cgg-probe-cmd", "a"], env=path_with(bin_dir))
    expected = (0, b"python ran ['cgg-probe-cmd', 'a']\n", b"")
    assert expected == result


@pytest.mark.parametrize("target", ["./cgg-launch.sh", "cgg-launch.sh"])
def test_a_script_of_another_interpreter_runs_as_itself(tmp_path: Path, target: str) -> None:
    """An executable file whose #! names another interpreter runs as a shell runs it, activated."""
    write(tmp_path / "cgg-launch.sh", SHELL_COMMAND).chmod(0o755)
    result = python([*RUNNER, target, "a", "--mode", "b"], tmp_path, clean_environ())
    expected = (0, f"{target} a --mode b\nenabled=1\n".encode(), b"")
    assert expected == result


SHEBANG_PROBE = "import sys\nprint(sys.executable, sys.argv)\n"


@pytest.mark.parametrize(
    "shebang",
    [
        "#!/usr/bin/env python3\n",
        "#!/cgg/none/python3.99 -u\n",
        "#! /cgg/none/python\r\n",
        "#!/usr/bin/env -S python3 -X dev\n",
        "#!/usr/bin/env -u CGG_NONE PYTHONDONTWRITEBYTECODE=1 python\n",
        "#!\n",
        "",
    ],
    ids=["env", "path with a flag", "CRLF", "env -S", "env -u and a setting", "bare", "none"],
)
def test_a_python_script_runs_with_this_interpreter(tmp_path: Path, shebang: str) -> None:
    """A #! line that names any python, or none, runs the file with this interpreter, as python."""
    write(tmp_path / "cgg_shebang.py", shebang + SHEBANG_PROBE).chmod(0o755)
    expected = (0, f"{sys.executable} ['cgg_shebang.py', 'a']\n".encode(), b"")
    assert expected == run_both(tmp_path, ["cgg_shebang.py", "a"])


def test_a_script_of_another_interpreter_that_is_not_executable_is_refused(
    tmp_path: Path,
) -> None:
    """Not executable and not Python: status 126 as from a shell, one line saying why."""
    write(tmp_path / "cgg-launch.sh", SHELL_COMMAND).chmod(0o644)
    result = python([*RUNNER, "cgg-launch.sh", "a"], tmp_path, clean_environ())
    message = (
        "cgguard run: cannot run 'cgg-launch.sh': not executable (chmod +x it), and not Python: "
        "its #! line is '#!/bin/sh'\n"
    )
    assert (126, b"", message.encode()) == result


def test_a_native_executable_runs_as_itself(tmp_path: Path) -> None:
    """A native executable in the current directory runs as itself, not as a Python file."""
    echo = shutil.which("echo")
    if echo is None:
        pytest.skip("no echo on PATH")
    with open(echo, "rb") as file:
        if file.read(4) != b"\x7fELF":
            pytest.skip(f"{echo} is not a native executable")
    shutil.copy(echo, tmp_path / "cgg-echo")
    result = python([*RUNNER, "cgg-echo", "hello"], tmp_path, clean_environ())
    expected = (0, b"hello\n", b"")
    assert expected == result


def test_a_folder_does_not_hide_a_command_of_its_name(tmp_path: Path) -> None:
    """A folder python cannot run (no __main__.py) leaves the name to the command on PATH."""
    bin_dir = tmp_path / "bin"
    script = write(bin_dir / "cgg-probe-cmd", SHELL_COMMAND)
    script.chmod(0o755)
    (tmp_path / "cgg-probe-cmd").mkdir()
    result = python([*RUNNER, "cgg-probe-cmd", "a"], tmp_path, path_with(bin_dir))
    assert (0, f"{script} a\nenabled=1\n".encode(), b"") == result


def test_a_folder_without_main_and_no_command_is_named_in_the_error(tmp_path: Path) -> None:
    """A folder without __main__.py and no command of its name: one line saying both."""
    (tmp_path / "cgg-folder").mkdir()
    result = python([*RUNNER, "cgg-folder"], tmp_path, clean_environ())
    message = (
        b"cgguard run: cannot run 'cgg-folder': a folder without __main__.py, and no command "
        b"of that name on PATH\n"
    )
    assert (2, b"", message) == result


def test_option_values_are_case_insensitive(tmp_path: Path) -> None:
    """--mode RAISE, --rule Nested_Capture=OFF: read as the variables' values are, any case."""
    write(tmp_path / "cgg_env.py", ENV_PROBE)
    env = clean_environ()
    options = ["--mode", "RAISE", "--log-format=Console", "--capture", " Disabled "]
    options += ["--log-target", "STDERR", "--rule", "Nested_Capture=OFF"]
    runner_environ, _ = environ_and_path(python([*RUNNER, *options, "cgg_env.py"], tmp_path, env))
    seen = {k: v for k, v in runner_environ.items() if k.startswith("CGGUARD_")}
    expected = {
        "CGGUARD_ENABLED": "1",
        "CGGUARD_MODE": "raise",
        "CGGUARD_LOG_FORMAT": "console",
        "CGGUARD_CAPTURE": "disabled",
        "CGGUARD_LOG_TARGET": "stderr",
        "CGGUARD_RULE_NESTED_CAPTURE": "off",
    }
    assert expected == seen


BOOLEANS = [s for s in SETTINGS.values() if s.choices is BOOL]


@pytest.mark.parametrize("value", [True, False], ids=["on", "off"])
@pytest.mark.parametrize("setting", BOOLEANS, ids=[s.field for s in BOOLEANS])
def test_every_boolean_setting_has_an_option_each_way(setting: Setting, value: bool) -> None:
    """--name and --no-name for each boolean setting, overriding the environment's value."""
    option = setting.option if value else "--no-" + setting.option.removeprefix("--")
    options = run_parser().parse_args([option])
    env = program_environ(options, {setting.variable: "0" if value else "1"})
    assert ("1" if value else "0") == env[setting.variable]


PATHS = [s for s in SETTINGS.values() if s.choices is PATH]


@pytest.mark.parametrize("setting", PATHS, ids=[s.field for s in PATHS])
def test_a_relative_path_option_is_the_one_where_the_command_was_typed(
    setting: Setting, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The program gets the path made absolute: it may change directory before it reads it.
    ``{pid}`` stays for each process to fill in."""
    monkeypatch.chdir(tmp_path)
    options = run_parser().parse_args([setting.option, "out/r-{pid}.json"])
    env = program_environ(options, {})
    assert f"{tmp_path}/out/r-{{pid}}.json" == env[setting.variable]


def test_version(tmp_path: Path) -> None:
    """``python -m cgguard --version`` and ``cgguard --version`` print cgguard's version."""
    expected = (0, f"cgguard {cgguard.__version__}\n".encode(), b"")
    assert expected == python(["-m", "cgguard", "--version"], tmp_path, clean_environ())
    console = shutil.which("cgguard", path=os.path.dirname(sys.executable))
    if console is not None:
        assert expected == command([console, "--version"], tmp_path, clean_environ())


RULE_ERROR = (
    "cgguard run: error: argument --rule: '{}': accepted values are RULE=ACTION with RULE one of "
    "capture_disabled, nested_capture, concurrent_capture, sync_during_capture, abandoned_capture, "
    "implicit_sync, dead_input, stale_binding, rng_during_capture, first_use_in_capture, "
    "rank_divergence and ACTION one of "
    "raise, log, off\n"
)

PATH_ERROR = (
    "cgguard run: error: argument {}: {}: "
    "accepted values are a path (not blank, no NUL character)\n"
)
CHOICE_ERROR = "cgguard run: error: argument {}: {}: accepted values are {}\n"
FILE_TARGET_ERROR = (
    b"cgguard run: error: argument --log-target: 'file' needs a log file: --log-file PATH, "
    b"or CGGUARD_LOG_FILE in the environment\n"
)

MARKER = """\
import pathlib
pathlib.Path("cgg_ran").write_text("ran")
print("ran")
"""

ERRORS = [
    pytest.param(
        ("run", "--bogus", "cgg_marker.py"),
        USAGE.encode() + b"cgguard run: error: unrecognized arguments: --bogus\n",
        id="unknown option",
    ),
    pytest.param(
        ("run", "--mode", "Rase", "cgg_marker.py"),
        USAGE.encode() + CHOICE_ERROR.format("--mode", "'Rase'", "raise, log").encode(),
        id="invalid --mode, shown as given",
    ),
    pytest.param(
        ("run", "--log-format", "xml", "cgg_marker.py"),
        USAGE.encode() + CHOICE_ERROR.format("--log-format", "'xml'", "json, console").encode(),
        id="invalid --log-format",
    ),
    pytest.param(
        ("run", "--log-file"),
        USAGE.encode() + b"cgguard run: error: argument --log-file: expected one argument\n",
        id="option without its value",
    ),
    pytest.param(
        ("run", "--log-target", "syslog", "cgg_marker.py"),
        USAGE.encode()
        + CHOICE_ERROR.format("--log-target", "'syslog'", "stderr, file, logging").encode(),
        id="invalid --log-target",
    ),
    pytest.param(
        ("run", "--rule", "bogus=x", "cgg_marker.py"),
        USAGE.encode() + RULE_ERROR.format("bogus=x").encode(),
        id="unknown rule",
    ),
    pytest.param(
        ("run", "--rule", "nested_capture=warn", "cgg_marker.py"),
        USAGE.encode() + RULE_ERROR.format("nested_capture=warn").encode(),
        id="unknown action",
    ),
    pytest.param(
        ("run", "--rule", "nested_capture", "cgg_marker.py"),
        USAGE.encode() + RULE_ERROR.format("nested_capture").encode(),
        id="rule without its action",
    ),
    pytest.param(
        (
            "run",
            "--mode",
            "log",
            "--rule",
            "nested_capture=off",
            "--rule",
            "x=off",
            "cgg_marker.py",
        ),
        USAGE.encode() + RULE_ERROR.format("x=off").encode(),
        id="one bad rule among good ones",
    ),
    pytest.param(
        ("run", "--rule"),
        USAGE.encode() + b"cgguard run: error: argument --rule: expected one argument\n",
        id="--rule without its value",
    ),
    pytest.param(
        ("run", "--report"),
        USAGE.encode() + b"cgguard run: error: argument --report: expected one argument\n",
        id="--report without its value",
    ),
    pytest.param(
        ("run", "--report", "", "cgg_marker.py"),
        USAGE.encode() + PATH_ERROR.format("--report", "''").encode(),
        id="--report empty",
    ),
    pytest.param(
        ("run", "--log-file=", "cgg_marker.py"),
        USAGE.encode() + PATH_ERROR.format("--log-file", "''").encode(),
        id="--log-file= empty",
    ),
    pytest.param(
        ("run", "--log-file", " \t", "cgg_marker.py"),
        USAGE.encode() + PATH_ERROR.format("--log-file", "' \\t'").encode(),
        id="--log-file blank",
    ),
    pytest.param(
        ("run", "--log-target", "file", "cgg_marker.py"),
        USAGE.encode() + FILE_TARGET_ERROR,
        id="--log-target file without a log file",
    ),
    pytest.param(
        ("run", "--mod", "log", "cgg_marker.py"),
        USAGE.encode() + b"cgguard run: error: unrecognized arguments: --mod\n",
        id="an abbreviated option",
    ),
    pytest.param(("run", "nope.py"), NOT_FOUND.format("nope.py").encode(), id="missing script"),
    pytest.param(
        ("run", "--mode", "log", "cgg-no-such-command"),
        NOT_FOUND.format("cgg-no-such-command").encode(),
        id="missing command",
    ),
    pytest.param(
        ("run",), USAGE.encode() + b"cgguard run: error: no program to run\n", id="nothing to run"
    ),
    pytest.param(
        ("run", "--mode", "log"),
        USAGE.encode() + b"cgguard run: error: no program to run\n",
        id="options only",
    ),
    pytest.param(("run", "-m"), b"cgguard run: -m needs a module name\n", id="-m alone"),
    pytest.param(
        ("run", "--", "-m", "cgg_marker"),
        NOT_FOUND.format("-m").encode(),
        id="-m after -- names a file, as after python's --",
    ),
    pytest.param(
        (),
        b"usage: cgguard {run,info,report} ...\n"
        b"cgguard: error: the following arguments are required: command\n",
        id="no subcommand",
    ),
    pytest.param(
        ("bogus",),
        b"usage: cgguard {run,info,report} ...\n"
        + invalid_choice("cgguard", "command", ("run", "info", "report"), "bogus"),
        id="unknown subcommand",
    ),
    pytest.param(
        ("info", "--bogus"),
        b"usage: cgguard info [-h]\ncgguard info: error: unrecognized arguments: --bogus\n",
        id="info with an unknown option",
    ),
]


@pytest.mark.parametrize(("args", "stderr"), ERRORS)
def test_usage_errors_exit_2_and_run_nothing(
    tmp_path: Path, args: tuple[str, ...], stderr: bytes
) -> None:
    """A bad command line: status 2, the message on stderr, nothing on stdout, nothing run."""
    write(tmp_path / "cgg_marker.py", MARKER)
    expected = ((2, b"", stderr), ["cgg_marker.py"])
    result = python(["-m", "cgguard", *args], tmp_path, clean_environ())
    assert expected == (result, sorted(os.listdir(tmp_path)))


def test_file_target_takes_the_log_file_from_the_environment(tmp_path: Path) -> None:
    """--log-target file runs without --log-file when CGGUARD_LOG_FILE is set: the program's."""
    write(tmp_path / "cgg_env.py", ENV_PROBE)
    env = clean_environ(CGGUARD_LOG_FILE="cgg.log")
    plain_environ, _ = environ_and_path(python(["cgg_env.py"], tmp_path, env))
    runner = python([*RUNNER, "--log-target", "file", "cgg_env.py"], tmp_path, env)
    runner_environ, _ = environ_and_path(runner)
    assert {
        **plain_environ,
        "CGGUARD_LOG_TARGET": "file",
        "CGGUARD_ENABLED": "1",
        "PYTHONPATH": BOOT_DIR,
    } == runner_environ


def test_file_target_with_a_blank_log_file_in_the_environment_is_refused(tmp_path: Path) -> None:
    """A blank CGGUARD_LOG_FILE is unset, as the program would read it: --log-target file fails."""
    write(tmp_path / "cgg_marker.py", MARKER)
    env = clean_environ(CGGUARD_LOG_FILE=" ")
    result = python([*RUNNER, "--log-target", "file", "cgg_marker.py"], tmp_path, env)
    expected = ((2, b"", USAGE.encode() + FILE_TARGET_ERROR), ["cgg_marker.py"])
    assert expected == (result, sorted(os.listdir(tmp_path)))


def test_missing_module_fails_as_under_plain_python(tmp_path: Path) -> None:
    """``run -m missing``: python itself reports it, status 1, exactly as ``python -m missing``."""
    result = run_both(tmp_path, ["-m", "cgg_no_such_module"])
    expected = (1, b"", f"{sys.executable}: No module named cgg_no_such_module\n".encode())
    assert expected == result


ACTIVATED = """\
import dataclasses, json
import torch
import cgguard
status = cgguard.status()
print(json.dumps({
    "patched": status.patched,
    "installed": status.installed,
    "config": dataclasses.asdict(status.config),
    "capture_enabled": cgguard.is_capture_enabled(),
}), flush=True)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    pass
print("captured")
"""

SIMULATION_NOTICE = (
    b"cgguard: CGGUARD_SIMULATE_CUDA: torch.cuda runs on cgguard's simulated CUDA runtime "
    b"(no GPU work; results are not GPU results)\n"
)


@pytest.mark.simulated
def test_program_importing_torch_is_guarded_as_configured(tmp_path: Path) -> None:
    """Under the runner, importing torch patches it, and each runner option takes effect."""
    script = write(tmp_path / "cgg_torch.py", ACTIVATED)
    returncode, out, err = python(
        [*RUNNER, *RUNNER_OPTIONS, "cgg_torch.py"], tmp_path, clean_environ()
    )
    state = {
        # The simulated runtime's device synchronize, guarded too.
        "patched": [*torch_entry_points(), "torch._C._cuda_synchronize", *standin_hooks()],
        "installed": True,
        "config": {
            "mode": "log",
            "rules": {"nested_capture": "off", "sync_during_capture": "raise"},
            "log_format": "json",
            "log_file": str(tmp_path / "cgg.log"),
            "log_target": "file",
            "log_level": "debug",
            "report": str(tmp_path / "cgg_report.json"),
            "capture": "disabled",
            "simulate_cuda": True,
            "vllm_bridge": True,
            "exempt": [],
            "exempt_file": None,
            "windows": [],
            "profiles": "log",
            "inspect": False,
            "inspect_first": None,
            "census": True,
            "census_replays": False,
            "metrics": None,
            "manifest": True,
            "rank_check": False,
        },
        "capture_enabled": False,
    }
    # --simulate-cuda: the capture runs on CPU; --capture disabled: it is a violation;
    # --mode log: the program goes on; --log-file, --log-target file and --log-format json:
    # JSON lines there (the violation, then the exit summary); --report: the report file;
    # --rule sync_during_capture=raise: torch.cuda.graph's own synchronize is no violation.
    expected = (0, [state, "captured"], SIMULATION_NOTICE)
    lines = out.splitlines()
    assert expected == (returncode, [loads(lines[0]), *(x.decode() for x in lines[1:])], err)
    fields = ("event", "rule", "action", "api", "stack")
    event = {
        "event": "cgguard.capture_violation",
        "rule": "capture_disabled",
        "action": "logged",
        "api": "torch.cuda.graph",
        "stack": [
            {
                "file": str(script),
                "line": ACTIVATED.splitlines().index("with torch.cuda.graph(graph):") + 1,
                "function": "<module>",
                "code": "with torch.cuda.graph(graph):",
            }
        ],
    }
    logged = [json.loads(line) for line in (tmp_path / "cgg.log").read_text().splitlines()]
    # The capture went ahead in log mode: the census counts it at exit.
    expected_log = (["cgguard.capture_violation", "cgguard.summary", "cgguard.census"], event)
    assert expected_log == (
        [e["event"] for e in logged],
        {field: logged[0].get(field) for field in fields},
    )
    report = json.loads((tmp_path / "cgg_report.json").read_text())
    assert ({"capture_disabled": 1}, state["config"]) == (report["totals"], report["config"])


def test_info_reports_versions_configuration_and_activation(tmp_path: Path) -> None:
    """``cgguard info``: versions, each setting and its source, warnings, a patched child."""
    env = clean_environ(
        CGGUARD_MODE="log",
        CGGUARD_CAPTURE="sometimes",
        CGGUARD_LOG_TARGET="logging",
        CGGUARD_REPORT="cgg_report.json",
        CGGUARD_VLLM_BRIDGE="0",
        CGGUARD_RULE_SYNC_DURING_CAPTURE="raise",
        CGGUARD_RULE_NESTED_CAPTURE="warn",
    )
    folders = dict.fromkeys([*site.getsitepackages(), site.getusersitepackages()])
    pth_lines = []
    for folder in folders:
        pth = os.path.join(folder, "cgguard.pth")
        pth_lines.append(
            f"  .pth           {pth} ({'present' if os.path.isfile(pth) else 'absent'})"
        )
    version = importlib.metadata.version
    lines = [
        f"cgguard {cgguard.__version__}",
        f"  python         {platform.python_version()} ({sys.executable})",
        f"  torch          {version('torch')}",
        f"  wrapt          {version('wrapt')}",
        f"  structlog      {version('structlog')}",
        "",
        "configuration (from the environment):",
        "  enabled        (unset)      (CGGUARD_ENABLED)",
        "  mode           log          (CGGUARD_MODE)",
        "  log_format     json, or console when stderr is a terminal (default)",
        "  log_file       none         (default)",
        "  log_target     logging      (CGGUARD_LOG_TARGET)",
        "  log_level      debug        (default)",
        "  report         cgg_report.json (CGGUARD_REPORT)",
        "  capture        as it is (enabled at start) (default)",
        "  simulate_cuda  False        (default)",
        "  vllm_bridge    False        (CGGUARD_VLLM_BRIDGE)",
        "  exempt         none         (default)",
        "  exempt_file    none         (default)",
        "  window         none         (default)",
        "  profiles       log          (default)",
        "  profile        vllm: vLLM Model Runner V2, 2 windows, 3 exemptions",
        "  profile        sglang: SGLang, 6 windows, 8 exemptions",
        "  profile        tensorrt_llm: TensorRT-LLM (PyTorch backend), 2 windows, 0 exemptions",
        "  inspect        False        (default)",
        "  inspect_first  every capture of each site (default)",
        "  census         True         (default)",
        "  census_replays False        (default)",
        "  metrics        none         (default)",
        "  manifest       True         (default)",
        "  rank_check     False        (default)",
        "  rule           capture_disabled: log (from CGGUARD_MODE)",
        "  rule           nested_capture: log (from CGGUARD_MODE)",
        "  rule           concurrent_capture: log (default)",
        "  rule           sync_during_capture: raise (CGGUARD_RULE_SYNC_DURING_CAPTURE)",
        "  rule           abandoned_capture: log (default)",
        "  rule           implicit_sync: log (from CGGUARD_MODE)",
        "  rule           dead_input: log (from CGGUARD_MODE)",
        "  rule           stale_binding: log (from CGGUARD_MODE)",
        "  rule           rng_during_capture: log (from CGGUARD_MODE)",
        "  rule           first_use_in_capture: log (default)",
        "  rule           rank_divergence: log (default)",
        "  warning: ignoring CGGUARD_CAPTURE='sometimes': accepted values are enabled, disabled; "
        "using as it is (enabled at start)",
        "  warning: ignoring CGGUARD_RULE_NESTED_CAPTURE='warn': "
        "accepted values are raise, log, off; using the rule's default action",
        "",
        "activation:",
        *pth_lines,
        f"  bootstrap      {BOOT_DIR} (present)",
        f"  child          torch's {patched_count()} entry points patched "
        f"(activated by {activated_by()})",
    ]
    returncode, out, err = python(["-m", "cgguard", "info"], tmp_path, env)
    expected = (0, lines, b"")
    assert expected == (returncode, out.decode().splitlines(), err)


def test_info_shows_an_ignored_file_target_as_ignored(tmp_path: Path) -> None:
    """``cgguard info`` with CGGUARD_LOG_TARGET=file and no log file: default, and the warning."""
    env = clean_environ(CGGUARD_LOG_TARGET="file")
    returncode, out, err = python(["-m", "cgguard", "info"], tmp_path, env)
    lines = out.decode().splitlines()
    start = lines.index("configuration (from the environment):") + 1
    configuration = lines[start : lines.index("", start)]
    expected = (
        0,
        [
            "  enabled        (unset)      (CGGUARD_ENABLED)",
            *DEFAULT_CONFIGURATION,
            "  warning: ignoring CGGUARD_LOG_TARGET='file': CGGUARD_LOG_FILE is not set",
        ],
        b"",
    )
    assert expected == (returncode, configuration, err)


def test_info_reads_its_child_past_a_chatty_start_up(tmp_path: Path) -> None:
    """A sitecustomize that prints does not confuse ``cgguard info``'s check of a child."""
    chatty = tmp_path / "chatty"
    chatty.mkdir()
    write(chatty / "sitecustomize.py", "print('hello from the image')\n")
    env = clean_environ(PYTHONPATH=str(chatty))
    returncode, out, _ = python(["-m", "cgguard", "info"], tmp_path, env)
    child = out.decode().splitlines()[-1]
    expected = (
        0,
        f"  child          torch's {patched_count()} entry points patched "
        f"(activated by {activated_by()})",
    )
    assert expected == (returncode, child)


def test_run_help_says_what_each_option_does_and_the_variable_it_sets() -> None:
    """Every option's help is a sentence of its own, more than the variable's name, and ends
    by naming the variable the program receives."""
    parser = run_parser()
    helps = {
        action.dest: action.help or ""
        for action in parser._actions
        if action.option_strings and action.dest != "help"
    }
    assert set(helps) == {*SETTINGS, "rule"}
    for field, text in helps.items():
        variable = SETTINGS[field].variable if field in SETTINGS else "CGGUARD_RULE_<RULE>"
        assert f"({variable})" in text, field
        said = text.replace(f"({variable})", "").replace(variable, "")
        assert not said.lstrip().startswith("sets"), field
        assert len(said.split()) >= 8, (field, text)
    assert "{pid}" in helps["report"]


def test_run_help_examples_are_command_lines_the_runner_accepts() -> None:
    """Each example in ``cgguard run --help`` parses: its options are the runner's, and a program
    follows them."""
    import shlex

    from cgguard._commands.run import _split_run

    parser = run_parser()
    examples = [
        shlex.split(line)[2:]
        for line in (parser.epilog or "").splitlines()
        if line.startswith("  cgguard run ")
    ]
    assert len(examples) >= 4
    for argv in examples:
        options, command, _ = _split_run(argv)
        parser.parse_args(options)
        assert command, argv
