"""``cgguard run``: start a program with cgguard active in it and in every process it starts.

The runner does not emulate Python: it writes its options into the environment, puts the
bootstrap folder on PYTHONPATH and replaces itself with the program (exec), which then runs
exactly as ``python script.py`` would, activated by the bootstrap sitecustomize.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from cgguard._boot import ENABLED
from cgguard._config.settings import (
    BOOL,
    COUNT,
    EXEMPT,
    PATH,
    RULE_PREFIX,
    SETTINGS,
    WINDOW_SEPARATOR,
    WINDOW_SYNTAX,
    WINDOWS,
    accepted,
    is_path,
    shown,
    window_entries,
)
from cgguard._rules import exempt_syntax as _exempt_syntax
from cgguard._rules.table import ACTIONS, NAMES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from cgguard._config.settings import Setting

# The folder put on PYTHONPATH: its sitecustomize activates cgguard in every process started.
# The bootstrap sitecustomize: a folder of files the package ships, run as a top-level module.
BOOT_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_sitecustomize"
)

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


_RUN_EPILOG = """\
Each option sets the CGGUARD_* variable named beside it, in the program and in every process
it starts; the runner's options win over those variables, and any other CGGUARD_* variable
passes through. The program runs exactly as plain python runs it, and its exit status is the
runner's.

examples:
  cgguard run train.py --epochs 3
  cgguard run --mode log --report 'reports/r-{pid}.json' torchrun --nproc-per-node 8 train.py
  cgguard run --inspect --simulate-cuda -m pytest tests/
  cgguard run --inspect --rule implicit_sync=raise vllm serve MODEL
  cgguard run --exempt 'sync_during_capture=mylib.kernels:warm_up' -m mylib.serve
"""


def run_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="cgguard run",
        usage=_RUN_USAGE,
        description="Run a program with cgguard guarding every CUDA-graph capture in it, "
        "and in the processes it starts.",
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for setting in SETTINGS.values():
        if setting.choices is BOOL:
            # Both ways, whatever the default: an option overrides the variable in the
            # environment, which may say either.
            default = setting.words(setting.default)
            parser.add_argument(
                setting.option,
                dest=setting.field,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{setting.help}; {default} by default ({setting.variable})",
            )
        elif (listed := _listed(setting.choices)) is not None:
            parser.add_argument(
                setting.option,
                dest=setting.field,
                action="append",
                type=listed.check,
                metavar=listed.metavar,
                help=f"{setting.help}: {listed.what}, {accepted(setting.choices)}; "
                f"repeatable ({setting.variable})",
            )
        else:
            if setting.choices is PATH:
                metavar = "PATH"
            elif setting.choices is COUNT:
                metavar = "N"
            else:
                metavar = "{" + ",".join(setting.choices) + "}"
            parser.add_argument(
                setting.option,
                dest=setting.field,
                type=_value_of(setting),
                metavar=metavar,
                help=f"{setting.help} ({setting.variable})",
            )
    parser.add_argument(
        "--rule",
        action="append",
        type=_rule_setting,
        default=[],
        metavar="RULE=ACTION",
        help=f"one rule's action ({', '.join(ACTIONS)}), over --mode's; repeatable, e.g. "
        f"--rule implicit_sync=raise ({RULE_PREFIX}<RULE>); rules: {', '.join(NAMES)}",
    )
    return parser


def _value_of(setting: Setting) -> Callable[[str], str]:
    """The option's value as the variable's parser reads it: in any case; a path not blank."""

    def value(text: str) -> str:
        # The variable's own parser, so that the option accepts what the variable accepts.
        # A blank path is refused as well as an empty one: the program would read it as unset.
        parsed = setting.parse(text)
        if not isinstance(parsed, (str, int)) or isinstance(parsed, bool):
            raise argparse.ArgumentTypeError(
                f"{shown(text)}: accepted values are {accepted(setting.choices)}"
            )
        return str(parsed)

    return value


def _exemptions(text: str) -> str:
    # Every entry must hold, as every other option's value must: the runner stops on a typo
    # rather than let the program warn and run without the exemption.
    pairs, refused = _exempt_syntax.parse(text)
    if refused:
        entry, reason = refused[0]
        syntax = _exempt_syntax.SYNTAX
        raise argparse.ArgumentTypeError(f"{shown(entry)}: {reason}; an entry is {syntax}")
    if not pairs:
        raise argparse.ArgumentTypeError(
            f"{shown(text)}: no exemption; an entry is {_exempt_syntax.SYNTAX}"
        )
    return text


def _windows(text: str) -> str:
    # As for exemptions: the runner stops on an entry of the wrong form.
    entries, refused = window_entries(text)
    if refused:
        raise argparse.ArgumentTypeError(f"{shown(refused[0])}: an entry is {WINDOW_SYNTAX}")
    if not entries:
        raise argparse.ArgumentTypeError(f"{shown(text)}: no window; an entry is {WINDOW_SYNTAX}")
    return WINDOW_SEPARATOR.join(entries)


class _Listed(NamedTuple):
    """A repeatable option, each entry checked, that the variable holds as one list."""

    check: Callable[[str], str]
    metavar: str
    what: str  # its help's first words
    separator: str  # between entries in the variable


def _listed(choices: tuple[str, ...]) -> _Listed | None:
    """How the option of a setting with these choices takes entries, or None: not a list."""
    if choices is EXEMPT:
        return _Listed(_exemptions, "RULE=PLACE", "exemptions", _exempt_syntax.SEPARATOR)
    if choices is WINDOWS:
        return _Listed(_windows, "MODULE:QUALNAME", "capture windows", WINDOW_SEPARATOR)
    return None


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
    # In any case, as the rule variables' values are read.
    rule, _, action = (part.strip().lower() for part in text.partition("="))
    if rule not in NAMES or action not in ACTIONS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: accepted values are RULE=ACTION with RULE one of "
            f"{', '.join(NAMES)} and ACTION one of {', '.join(ACTIONS)}"
        )
    return rule, action


class Split(NamedTuple):
    """``run``'s arguments: cgguard's options, and the program's command line."""

    options: list[str]
    command: list[str]
    # After ``--`` the program's first word names a file or command, even one spelt like a
    # flag of python's (``-x.py``, ``-mfoo.py``), as after python's own ``--``.
    named: bool = False


def _split_run(argv: Sequence[str]) -> Split:
    """Split ``run``'s arguments into cgguard's options and the program's command line.

    The program starts at the first argument that is not one of cgguard's options, at ``-m``,
    or after ``--``; everything after it belongs to the program, as with ``python``.
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return Split(list(argv[:i]), list(argv[i + 1 :]), named=True)
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            return Split(list(argv[:i]), list(argv[i:]))
        if not arg.startswith("-") or arg == "-":
            return Split(list(argv[:i]), list(argv[i:]))
        i += 2 if arg in _VALUED or arg == "--rule" else 1
    return Split(list(argv), [])


def interpreter_flags() -> list[str]:
    """The flags this interpreter was started with (``-X dev -W error``), for the program."""
    orig = list(getattr(sys, "orig_argv", []))
    # orig_argv ends with what sys.argv holds after its first item; before that come the
    # interpreter, its flags, and the script or ``-m cgguard`` that started this runner.
    head = orig[: len(orig) - (len(sys.argv) - 1)] if len(sys.argv) > 1 else orig
    flags = head[1:-1]
    # "-m" (of ``-m cgguard``) and "--" (of ``python -- launcher run``) end python's flags
    # rather than being any: the program's own command line follows them.
    return flags[:-1] if flags and flags[-1] in ("-m", "--") else flags


class Refusal(NamedTuple):
    """Why the program cannot start, and the exit status that says so."""

    message: str
    status: int = 2  # a shell's is 126 for a file it finds but cannot execute


def _program(command: list[str], *, named: bool = False) -> tuple[str, list[str]] | Refusal:
    """(executable, argv) for the program, or why it cannot start.

    ``named``: the first word names a file or command, never ``-m``, as after ``--``.
    """
    python = [sys.executable, *interpreter_flags()]
    if command[0].startswith("-m") and not named:
        return _module(command, python)
    target, rest = command[0], command[1:]
    # "-" reads the program from stdin, as python does.
    how = "python" if target == "-" else _local(target)
    if how == "python":
        # python reads a name that starts with "-" as its own flags ("-cprint(1)" as code):
        # "--" after the flags makes it the file. Other names go without it, so that the
        # program's sys.orig_argv is what ``python script.py`` gives.
        dashes = ["--"] if target.startswith("-") and target != "-" else []
        return sys.executable, [*python, *dashes, target, *rest]
    if how == "exec":
        return target, [target, *rest]
    if isinstance(how, Refusal):
        return how
    found = shutil.which(target)
    if found is None:
        what = "a folder without __main__.py" if os.path.isdir(target) else "no such file"
        return Refusal(f"cannot run {target!r}: {what}, and no command of that name on PATH")
    return found, [target, *rest]


def _module(command: list[str], python: list[str]) -> tuple[str, list[str]] | Refusal:
    """``-m module args`` (or ``-mmodule``): python runs it, or says it finds no such module."""
    module = command[0][2:] or (command[1] if len(command) > 1 else "")
    rest = command[1:] if command[0][2:] else command[2:]
    if not module:
        return Refusal("-m needs a module name")
    return sys.executable, [*python, "-m", module, *rest]


def _local(target: str) -> str | Refusal | None:
    """How an existing path runs: "python", "exec", or why not; None when it does not here.

    As python would, a Python file, a folder with __main__.py, or a zip runs with this
    interpreter. As a shell would, a file whose #! line names another interpreter, or a native
    executable, runs as itself. A folder python cannot run does not hide a command on PATH.
    """
    if os.path.isdir(target):
        return "python" if _has_main(target) else None
    if not os.path.exists(target):
        return None
    # Only a regular file is read ahead: a pipe (/dev/fd/N, /dev/stdin) would lose what python
    # must read from it. Whatever cannot be read, python reports, as it would without cgguard.
    foreign = _foreign(target) if os.path.isfile(target) else None
    if foreign is None:
        return "python"
    if not os.access(target, os.X_OK):
        # A shell refuses it too (status 126); python would take it for Python and fail with
        # a SyntaxError that hides the real mistake.
        message = f"cannot run {target!r}: not executable (chmod +x it), and not Python: {foreign}"
        return Refusal(message, 126)
    return "exec"


# A file's first bytes: enough for any #! line the kernel reads (256 bytes on Linux since 5.1,
# BINPRM_BUF_SIZE), and for the mark of a native executable.
_HEAD = 256
_NATIVE = b"\x7fELF"


def _foreign(path: str) -> str | None:
    """What makes ``path`` a program of its own rather than Python (for messages), or None."""
    try:
        with open(path, "rb") as file:
            head = file.read(_HEAD)
    except OSError:
        return None
    if head.startswith(_NATIVE):
        return "a native executable"
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip()
    if not line or _names_python(line):
        return None
    return f"its #! line is {'#!' + line.decode(errors='replace')!r}"


def _names_python(line: bytes) -> bool:
    """Whether a #! line (without ``#!``) starts python: /usr/bin/python3.11 -u, env python3."""
    words = line.split()
    name = os.path.basename(words[0])
    if name == b"env":
        # env's options (-S, -i, -u NAME, -C DIR) and NAME=value come before the command.
        rest = iter(words[1:])
        name = b""
        for word in rest:
            if word in (b"-u", b"-C"):
                next(rest, None)
            elif not word.startswith(b"-") and b"=" not in word:
                name = os.path.basename(word)
                break
    return name.startswith(b"python")


def _has_main(folder: str) -> bool:
    """Whether python can run ``folder``: it holds a __main__ module (source, compiled, native)."""
    suffixes = importlib.machinery.all_suffixes()
    return any(os.path.isfile(os.path.join(folder, "__main__" + s)) for s in suffixes)


def program_environ(options: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The program's environment: cgguard switched on, options as CGGUARD_* variables."""
    env = dict(environ)
    env[ENABLED] = "1"
    for setting in SETTINGS.values():
        value = getattr(options, setting.field)
        if setting.choices is BOOL:
            if value is not None:
                env[setting.variable] = "1" if value else "0"
        elif (listed := _listed(setting.choices)) is not None:
            if value:  # repeated: one entry list, as the variable holds it
                env[setting.variable] = listed.separator.join(value)
        elif setting.choices is PATH and value is not None:
            # Where the command line was typed: a program that changes directory first (a
            # launch script, a Ray worker in its session folder) reads the same file.
            env[setting.variable] = os.path.abspath(value)
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
    option_args, command, named = _split_run(argv)
    parser = run_parser()
    options = parser.parse_args(option_args)
    unmet = _unmet(options, os.environ)
    if unmet is not None:
        parser.error(unmet)
    if not command:
        parser.error("no program to run")
    program = _program(command, named=named)
    if isinstance(program, Refusal):
        sys.stderr.write(f"cgguard run: {program.message}\n")
        return program.status
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
