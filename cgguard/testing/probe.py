"""The fidelity probe: what real CUDA does in each capture scenario, against the simulated table.

``python -m cgguard.testing.probe`` runs every scenario of ``_probe_scenarios`` in every capture
mode. On a machine with a CUDA device each runs in a fresh interpreter with no cgguard module
loaded, and the probe prints, per scenario, what CUDA did, what the simulated runtime does (read
from ``probe_simulated.json``, kept in the repository) and whether they agree; then the number of
disagreements. Without a device it observes the simulated runtime instead, which checks the table
against the simulation. ``--write-simulated`` rewrites the table from the simulation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from cgguard.testing import _probe_scenarios
from cgguard.testing._probe_scenarios import MODES, SCENARIOS

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

TABLE = Path(__file__).with_name("probe_simulated.json")
REGENERATE = "python -m cgguard.testing.probe --write-simulated"
SIMULATED = "cgguard's simulated CUDA runtime (no GPU; not a GPU result)"
_SCENARIO_FILE = Path(_probe_scenarios.__file__)

Result = dict[str, str]  # {"outcome": ..., "capture": ...}


def keys(scenarios: Iterable[str] = SCENARIOS) -> list[str]:
    """``scenario/mode`` for each scenario in each capture mode, in table order."""
    return [f"{scenario}/{mode}" for scenario in scenarios for mode in MODES]


def observe_simulated(names: Sequence[str]) -> Iterator[tuple[str, Result]]:
    """Each ``scenario/mode`` run in this process, on a fresh simulated runtime each."""
    from cgguard import _install
    from cgguard.testing import SimulationError

    if _install.is_installed():
        # The table records the simulation alone; cgguard's own refusals would change it.
        raise SimulationError("cgguard is installed in this process (CGGUARD_ENABLED?)")
    return ((key, _probe_scenarios.run_simulated(*key.split("/"))) for key in names)


def _child_environ() -> dict[str, str]:
    # No CGGUARD_* variable reaches a scenario: CGGUARD_ENABLED would activate cgguard there.
    return {k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")}


def _run_child(python: str, key: str, timeout: float, simulated: bool) -> Result:
    command = [
        python,
        str(_SCENARIO_FILE),
        *(["--simulated"] if simulated else []),
        *key.split("/"),
    ]
    try:
        done = subprocess.run(  # noqa: S603 - this interpreter or the one asked for, fixed args
            command,
            env=_child_environ(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"outcome": f"probe failed: no result within {timeout:g} s", "capture": "unknown"}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            result: Result = json.loads(lines[-1])
        except ValueError:
            pass
        else:
            return result
    said = done.stderr.strip().splitlines()
    return {
        "outcome": f"probe failed: exit status {done.returncode}: {said[-1] if said else ''}",
        "capture": "unknown",
    }


def observe_in_subprocesses(
    names: Sequence[str], *, python: str, jobs: int, timeout: float, simulated: bool = False
) -> Iterator[tuple[str, Result]]:
    """Each ``scenario/mode`` in a fresh ``python`` process of its own, ``jobs`` at a time.

    A fresh process each: a failed capture can leave a CUDA context unusable, and CUDA does not
    survive fork.
    """
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = pool.map(lambda key: _run_child(python, key, timeout, simulated), names)
        yield from zip(names, results, strict=True)


def read_table(path: Path) -> dict[str, Result]:
    """The simulated table's results, by ``scenario/mode``."""
    results: dict[str, Result] = json.loads(path.read_text())["results"]
    return results


def write_table(path: Path, results: dict[str, Result]) -> None:
    """Write the simulated table: one result per line, so that a change reads as a small diff."""
    import torch

    lines = [
        f"    {json.dumps(k)}: {json.dumps({'outcome': v['outcome'], 'capture': v['capture']})}"
        for k, v in results.items()
    ]
    path.write_text(
        "{\n"
        f'  "about": "What cgguard\'s simulated CUDA runtime does in each probe scenario. '
        f'Written by: {REGENERATE}",\n'
        f'  "torch": {json.dumps(torch.__version__)},\n'
        '  "results": {\n' + ",\n".join(lines) + "\n  }\n}\n"
    )


def render(result: Result | None) -> str:
    """One side of a line: the outcome, then what became of the capture."""
    if result is None:
        return "missing from the table"
    return f"{result['outcome']}; capture: {result['capture']}"


def report(
    observed: Iterable[tuple[str, Result]], table: dict[str, Result], where: str
) -> Iterator[str]:
    """The probe's output, a line at a time as results come: one per scenario, then the count.

    A line that disagrees ends with ``DISAGREE``.
    """
    side = "cuda" if where.startswith("CUDA") else "simulation now"
    width = max(map(len, keys()))
    yield f"observed on {where}"
    count = disagreements = 0
    for key, result in observed:
        expected = table.get(key)
        agree = expected == result
        count, disagreements = count + 1, disagreements + (not agree)
        yield (
            f"{key:<{width}}  {side}: {render(result)}  |  simulated table: {render(expected)}"
            f"  |  {'agree' if agree else 'DISAGREE'}"
        )
    yield (
        f"{disagreements} of {count} scenarios disagree with the simulated table "
        f"(observed on {where})"
    )


def _describe_device() -> str | None:
    """``CUDA (device, torch, CUDA version)`` where a CUDA device is usable, else None."""
    import torch

    if not torch.cuda.is_available():
        return None
    return (
        f"CUDA ({torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda})"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cgguard.testing.probe",
        description="Compare what real CUDA does in each capture scenario with cgguard's "
        "simulated table. Without a CUDA device, observes the simulated runtime instead.",
    )
    parser.add_argument(
        "--simulated",
        action="store_true",
        help="observe cgguard's simulated runtime even where a CUDA device exists",
    )
    parser.add_argument(
        "--write-simulated",
        action="store_true",
        help="rewrite the simulated table from the simulated runtime, and compare nothing",
    )
    parser.add_argument("--table", type=Path, default=TABLE, help="the simulated table (JSON)")
    parser.add_argument(
        "--only", nargs="+", metavar="SCENARIO", choices=list(SCENARIOS), help="these scenarios"
    )
    parser.add_argument(
        "--subprocess",
        action="store_true",
        help="a fresh interpreter per scenario on the simulation too (always so on CUDA)",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter that runs each scenario on CUDA (default: this one)",
    )
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per scenario")
    parser.add_argument(
        "--census",
        action="store_true",
        help="instead: capture a few graphs under cgguard and print their census",
    )
    return parser


def _usage_problem(args: argparse.Namespace) -> str:
    """What is wrong with the options together, or ""."""
    if args.jobs < 1 or args.timeout <= 0:
        return "--jobs must be at least 1 and --timeout above 0"
    if args.write_simulated and args.only:
        return "--write-simulated writes the whole table; drop --only"
    return ""


def _census(python: str) -> int:
    """The census of the probe's own captures, in a fresh interpreter: the scenarios' table is
    the simulation's alone, and cgguard must not be installed while it is observed."""
    command = [python, "-m", "cgguard.testing._census_probe"]
    return subprocess.run(command, env=_child_environ(), check=False).returncode  # noqa: S603


def main(argv: list[str] | None = None) -> int:
    """Run the probe; 0 when every scenario agrees, 1 when one does not, 2 when it cannot run."""
    from cgguard.testing import SimulationError

    args = _parser().parse_args(argv)
    if args.census:
        return _census(args.python)
    wrong = _usage_problem(args)
    if wrong:
        print(wrong, file=sys.stderr)
        return 2
    table: dict[str, Result] = {}
    if not args.write_simulated:
        try:
            table = read_table(args.table)
        except (OSError, ValueError, KeyError) as exc:
            print(f"cannot read the simulated table {args.table}: {exc!r}", file=sys.stderr)
            return 2
    names = keys(args.only or SCENARIOS)
    device = None if args.simulated or args.write_simulated else _describe_device()
    where = SIMULATED if device is None else device
    disagreements = 0
    try:
        if device is None and not args.subprocess:
            observed = observe_simulated(names)
        else:
            observed = observe_in_subprocesses(
                names,
                python=args.python,
                jobs=args.jobs,
                timeout=args.timeout,
                simulated=device is None,
            )
        if args.write_simulated:
            results = dict(observed)
            write_table(args.table, results)
            print(f"wrote {len(results)} simulated results to {args.table}")
            return 0
        for line in report(observed, table, where):
            print(line, flush=True)
            disagreements += line.endswith("DISAGREE")
    except SimulationError as exc:
        print(f"the probe cannot run on the simulated runtime here: {exc}", file=sys.stderr)
        return 2
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
