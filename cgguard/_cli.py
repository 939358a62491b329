"""The command line: ``cgguard run`` starts a program with cgguard active, ``cgguard info`` reports.

The runner does not emulate Python: it writes its options into the environment, puts the
bootstrap folder on PYTHONPATH and replaces itself with the program (exec), which then runs
exactly as ``python script.py`` would, activated by the bootstrap sitecustomize.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from cgguard import _environ

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")

# Runner option: (environment variable, accepted values or None for free text); one for each
# variable that takes a value, named after its Config field.
_OPTIONS = {
    "--" + field.replace("_", "-"): (variable, choices)
    for variable, (field, choices) in _environ.VARIABLES.items()
    if choices is not _environ.BOOL
}

_RUN_USAGE = "cgguard run [options] (script.py | -m module | command) [args ...]"


class _Parser(argparse.ArgumentParser):
    """argparse, with cgguard's name on its errors, and no abbreviated options.

    Abbreviations would let ``--mod log`` through argparse while _split_run, which must know
    where the program's own arguments begin, takes it for a flag without a value.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cgguard run",
        usage=_RUN_USAGE,
        description="Run a program with cgguard guarding every CUDA-graph capture in it, "
        "and in the processes it starts.",
    )
    for option, (variable, choices) in _OPTIONS.items():
        metavar = "PATH" if choices is None else None  # --log-file, --report
        parser.add_argument(option, choices=choices, metavar=metavar, help=f"sets {variable}")
    parser.add_argument(
        "--rule",
        action="append",
        type=_rule_setting,
        default=[],
        metavar="RULE=ACTION",
        help=f"a rule's action (raise, log, off), repeatable; sets CGGUARD_RULE_<RULE>; "
        f"rules: {', '.join(_environ.RULES)}",
    )
    parser.add_argument(
        "--simulate-cuda",
        action="store_true",
        help="run torch.cuda on cgguard's simulated CUDA runtime (demos, CPU-only CI)",
    )
    return parser


def _rule_setting(text: str) -> tuple[str, str]:
    rule, _, action = text.partition("=")
    if rule not in _environ.RULES or action not in _environ.ACTIONS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: accepted values are RULE=ACTION with RULE one of "
            f"{', '.join(_environ.RULES)} and ACTION one of {', '.join(_environ.ACTIONS)}"
        )
    return rule, action


def _split_run(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``run``'s arguments into cgguard's options and the program's command line.

    The program starts at the first argument that is not one of cgguard's options, or at
    ``-m``; everything after it belongs to the program, as with ``python``.
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return list(argv[:i]), list(argv[i + 1 :])
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            return list(argv[:i]), list(argv[i:])
        if not arg.startswith("-") or arg == "-":
            return list(argv[:i]), list(argv[i:])
        i += 2 if arg in _OPTIONS or arg == "--rule" else 1
    return list(argv), []


def interpreter_flags() -> list[str]:
    """The flags this interpreter was started with (``-X dev -W error``), for the program."""
    orig = list(getattr(sys, "orig_argv", []))
    # orig_argv ends with what sys.argv holds after its first item; before that come the
    # interpreter, its flags, and the script or ``-m cgguard`` that started this runner.
    head = orig[: len(orig) - (len(sys.argv) - 1)] if len(sys.argv) > 1 else orig
    flags = head[1:-1]
    return flags[:-1] if flags and flags[-1] == "-m" else flags


def _program(command: list[str]) -> tuple[str, list[str]] | str:
    """(executable, argv) for the program, or a one-line error naming what was not found."""
    python = [sys.executable, *interpreter_flags()]
    if command[0].startswith("-m"):
        module = command[0][2:] or (command[1] if len(command) > 1 else "")
        rest = command[1:] if command[0][2:] else command[2:]
        if not module:
            return "-m needs a module name"
        return sys.executable, [*python, "-m", module, *rest]
    target, rest = command[0], command[1:]
    if target == "-" or os.path.exists(target):
        # As python would: an existing path (a script, or a folder or zip with __main__.py)
        # runs with this interpreter, whatever a shebang says; "-" reads the program from stdin.
        return sys.executable, [*python, target, *rest]
    found = shutil.which(target)
    if found is None:
        return f"cannot run {target!r}: no such file, and no command of that name on PATH"
    return found, [target, *rest]


def program_environ(options: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The program's environment: cgguard switched on, options as CGGUARD_* variables."""
    env = dict(environ)
    env[_environ.ENABLED] = "1"
    for option, (variable, _) in _OPTIONS.items():
        value = getattr(options, option.lstrip("-").replace("-", "_"))
        if value is not None:
            env[variable] = value
    for rule, action in options.rule:
        env[f"CGGUARD_RULE_{rule.upper()}"] = action
    if options.simulate_cuda:
        env["CGGUARD_SIMULATE_CUDA"] = "1"
    # Absolute and first. The user's own entries stay as they were, empty ones included, but an
    # unset or empty PYTHONPATH gets no separator: "boot:" would put the current directory on
    # every child's sys.path.
    old = env.get("PYTHONPATH", "")
    kept = [p for p in old.split(os.pathsep) if p != BOOT_DIR] if old else []
    env["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, *kept])
    return env


def run(argv: Sequence[str]) -> int:
    """``cgguard run``: exec the program with cgguard active; returns only on failure."""
    option_args, command = _split_run(argv)
    parser = run_parser()
    options = parser.parse_args(option_args)
    if not command:
        parser.error("no program to run")
    program = _program(command)
    if isinstance(program, str):
        sys.stderr.write(f"cgguard run: {program}\n")
        return 2
    executable, program_argv = program
    env = program_environ(options, os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(executable, program_argv, env)  # noqa: S606 - the user named this program
    except OSError as exc:
        sys.stderr.write(f"cgguard run: cannot run {command[0]!r}: {exc.strerror}\n")
        return 126
    raise AssertionError("unreachable: execve returned")  # pragma: no cover


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``cgguard`` and ``python -m cgguard``; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    parser = _Parser(
        prog="cgguard",
        description="Guard every CUDA-graph capture in a PyTorch program.",
        usage="cgguard {run,info} ...",
    )
    parser.add_argument("command", choices=("run", "info"), help="run a program, or report")
    if not args or args[0] not in ("run", "info"):
        parser.parse_args(args[:1])  # prints usage and exits 2 on anything else
        return 2
    if args[0] == "run":
        return run(args[1:])
    from cgguard._info import report

    info = _Parser(prog="cgguard info", description="Report versions, configuration, activation.")
    info.parse_args(args[1:])
    return report()
