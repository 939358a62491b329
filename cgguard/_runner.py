"""``cgguard run``: start a program with cgguard active in it and in every process it starts.

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

from cgguard import _exempt
from cgguard._rules import ACTIONS, NAMES
from cgguard._settings import (
    BOOL,
    ENABLED,
    EXEMPT,
    PATH,
    RULE_PREFIX,
    SETTINGS,
    accepted,
    is_path,
    shown,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# The folder put on PYTHONPATH: its sitecustomize activates cgguard in every process started.
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sitecustomize")

# Options that take a value; the boolean ones are switches.
_VALUED = {s.option for s in SETTINGS.values() if s.choices is not BOOL}

_RUN_USAGE = "cgguard run [options] (script.py | -m module | command) [args ...]"


class Parser(argparse.ArgumentParser):
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
    parser = Parser(
        prog="cgguard run",
        usage=_RUN_USAGE,
        description="Run a program with cgguard guarding every CUDA-graph capture in it, "
        "and in the processes it starts.",
    )
    for setting in SETTINGS.values():
        if setting.choices is BOOL:
            turn = "off" if setting.default else "on"
            parser.add_argument(
                setting.option,
                dest=setting.field,
                action="store_true",
                help=f"turns {setting.variable} {turn}",
            )
        elif setting.choices is PATH:
            parser.add_argument(
                setting.option,
                dest=setting.field,
                type=_path,
                metavar="PATH",
                help=f"sets {setting.variable}",
            )
        elif setting.choices is EXEMPT:
            parser.add_argument(
                setting.option,
                dest=setting.field,
                action="append",
                type=_exemptions,
                metavar="RULE=PLACE",
                help=f"exemptions, {accepted(EXEMPT)}; repeatable; sets {setting.variable}",
            )
        else:
            parser.add_argument(
                setting.option,
                dest=setting.field,
                choices=setting.choices,
                help=f"sets {setting.variable}",
            )
    parser.add_argument(
        "--rule",
        action="append",
        type=_rule_setting,
        default=[],
        metavar="RULE=ACTION",
        help=f"a rule's action ({', '.join(ACTIONS)}), repeatable; sets {RULE_PREFIX}<RULE>; "
        f"rules: {', '.join(NAMES)}",
    )
    return parser


def _path(text: str) -> str:
    # Blank is refused as well as empty: the program would read a blank variable as unset.
    if not is_path(text):
        raise argparse.ArgumentTypeError(f"{shown(text)}: accepted values are {accepted(PATH)}")
    return text


def _exemptions(text: str) -> str:
    # Every entry must hold, as every other option's value must: the runner stops on a typo
    # rather than let the program warn and run without the exemption.
    pairs, refused = _exempt.parse(text)
    if refused:
        entry, reason = refused[0]
        syntax = _exempt.SYNTAX
        raise argparse.ArgumentTypeError(f"{shown(entry)}: {reason}; an entry is {syntax}")
    if not pairs:
        raise argparse.ArgumentTypeError(
            f"{shown(text)}: no exemption; an entry is {_exempt.SYNTAX}"
        )
    return text


def _unmet(options: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """Why the options cannot work together in the program, or None."""
    log_file = SETTINGS["log_file"]
    # The program's own CGGUARD_LOG_FILE serves too: the runner passes it through.
    if (
        options.log_target == "file"
        and options.log_file is None
        and not is_path(environ.get(log_file.variable, ""))
    ):
        return (
            f"argument {SETTINGS['log_target'].option}: 'file' needs a log file: "
            f"{log_file.option} PATH, or {log_file.variable} in the environment"
        )
    return None


def _rule_setting(text: str) -> tuple[str, str]:
    rule, _, action = text.partition("=")
    if rule not in NAMES or action not in ACTIONS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: accepted values are RULE=ACTION with RULE one of "
            f"{', '.join(NAMES)} and ACTION one of {', '.join(ACTIONS)}"
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
        i += 2 if arg in _VALUED or arg == "--rule" else 1
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
    env[ENABLED] = "1"
    for setting in SETTINGS.values():
        value = getattr(options, setting.field)
        if setting.choices is BOOL:
            if value:  # a switch away from the default
                env[setting.variable] = "0" if setting.default else "1"
        elif setting.choices is EXEMPT:
            if value:  # repeated: one entry list, as the variable holds it
                env[setting.variable] = _exempt.SEPARATOR.join(value)
        elif value is not None:
            env[setting.variable] = value
    for rule, action in options.rule:
        env[RULE_PREFIX + rule.upper()] = action
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
    unmet = _unmet(options, os.environ)
    if unmet is not None:
        parser.error(unmet)
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
