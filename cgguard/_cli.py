"""The command line: ``cgguard run`` starts a program, guarded; ``cgguard info`` reports."""

from __future__ import annotations

import sys

from cgguard._runner import Parser, run
from cgguard._version import __version__


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``cgguard`` and ``python -m cgguard``; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    parser = Parser(
        prog="cgguard",
        description="Guard every CUDA-graph capture in a PyTorch program.",
        usage="cgguard {run,info} ...",
    )
    parser.add_argument("command", choices=("run", "info"), help="run a program, or report")
    parser.add_argument("--version", action="version", version=f"cgguard {__version__}")
    if not args or args[0] not in ("run", "info"):
        parser.parse_args(args[:1])  # prints usage and exits 2 on anything else
        return 2
    if args[0] == "run":
        return run(args[1:])
    from cgguard._info import report

    info = Parser(prog="cgguard info", description="Report versions, configuration, activation.")
    info.parse_args(args[1:])
    return report()
