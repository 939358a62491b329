"""The command line: ``cgguard run`` starts a program, guarded; ``cgguard info`` reports on this
environment; ``cgguard report`` merges a job's JSON reports."""

from __future__ import annotations

import sys

from cgguard._commands.run import Parser, run
from cgguard._version import __version__

_COMMANDS = ("run", "info", "report")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``cgguard`` and ``python -m cgguard``; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    parser = Parser(
        prog="cgguard",
        description="Guard every CUDA-graph capture in a PyTorch program.",
        usage="cgguard {run,info,report} ...",
    )
    parser.add_argument(
        "command",
        choices=_COMMANDS,
        help="run a program, report on this environment, or merge a job's reports",
    )
    parser.add_argument("--version", action="version", version=f"cgguard {__version__}")
    if not args or args[0] not in _COMMANDS:
        parser.parse_args(args[:1])  # prints usage and exits 2 on anything else
        return 2
    if args[0] == "run":
        return run(args[1:])
    if args[0] == "report":
        from cgguard._commands.report import main as merge_reports

        return merge_reports(args[1:])
    from cgguard._commands.info import report

    info = Parser(prog="cgguard info", description="Report versions, configuration, activation.")
    info.parse_args(args[1:])
    return report()
