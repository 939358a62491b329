"""Start-up cost of activation, measured in one run: ``python -c pass`` and ``import torch``.

Prints the median wall time of each command with and without CGGUARD_ENABLED=1, and the
ratios. Targets: idle activation <= 1.05x a bare interpreter start, torch import <= 1.02x.
Then ``python -c pass`` activated with an exemptions file of 1 MiB, the most one may hold
(about 22,000 entries), against the bare start: at most 0.2 s added. The file's cost is work
in one thread, judged by the processes' CPU time, which a busy machine inflates far less than
their wall time; both are printed.
cgguard's bytecode is compiled first, as ``pip install`` does: an editable install under
PYTHONDONTWRITEBYTECODE would otherwise recompile cgguard's modules in every process.

    python benchmarks/startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time

TARGETS = {"python -c pass": 1.05, "python -c 'import torch'": 1.02}
CODE = {"python -c pass": "pass", "python -c 'import torch'": "import torch"}
FILE_TARGET = 0.2  # seconds of CPU time that a 1 MiB exemptions file may add


def once(code: str, env: dict[str, str]) -> tuple[float, float]:
    """The wall time and the CPU time (user and system) of ``python -c code``."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args)
    return wall, usage.ru_utime + usage.ru_stime


def medians(
    code: str, off: dict[str, str], on: dict[str, str], runs: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The median (wall, CPU) times of ``code`` in ``off`` and in ``on``."""
    once(code, off)  # warm the page cache for both
    plain: list[tuple[float, float]] = []
    active: list[tuple[float, float]] = []
    for i in range(runs):
        # Interleaved and alternating, so that a noisy neighbour hits both alike.
        for activated in (False, True) if i % 2 else (True, False):
            (active if activated else plain).append(once(code, on if activated else off))

    def median(times: list[tuple[float, float]]) -> tuple[float, float]:
        return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)

    return median(plain), median(active)


def exemptions_file(path: str) -> int:
    """Write an exemptions file of as many entries as fit in 1 MiB, every kind of place and
    rule in turn, and a comment now and then; return how many entries it holds."""
    from cgguard._rules.exempt_syntax import LONGEST_FILE
    from cgguard._rules.table import NAMES

    places = ("vllm_plugin{}.kernels:Kernel.run", "*/plugin{}/kernels.py", "vllm_plugin{}.ops.")
    lines: list[str] = []
    size = 0
    while True:
        n = len(lines)
        line = f"{NAMES[n % len(NAMES)]}={places[n % len(places)].format(n)}"
        line += "  # fused ops\n" if n % 10 == 0 else "\n"
        if size + len(line) > LONGEST_FILE:
            break
        lines.append(line)
        size += len(line)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(lines))
    return len(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs of each command and setting")
    args = parser.parse_args()
    import cgguard

    compileall.compile_dir(os.path.dirname(cgguard.__file__), quiet=1)
    off = {k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")}
    on = {**off, "CGGUARD_ENABLED": "1"}
    failed = False
    for label, code in CODE.items():
        runs = args.runs if "torch" not in code else max(5, args.runs // 4)
        (plain, _), (active, _) = medians(code, off, on, runs)
        ratio = active / plain
        failed |= ratio > TARGETS[label]
        print(
            f"{label:<26} without: {plain * 1e3:7.1f} ms   "
            f"CGGUARD_ENABLED=1: {active * 1e3:7.1f} ms   "
            f"ratio {ratio:.3f} (target <= {TARGETS[label]})   [{runs} runs each]"
        )
    runs = max(5, args.runs // 4)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "exemptions")
        entries = exemptions_file(path)
        with_file = {**on, "CGGUARD_EXEMPT_FILE": path}
        (plain, plain_cpu), (active, active_cpu) = medians("pass", off, with_file, runs)
    added = active_cpu - plain_cpu
    failed |= added > FILE_TARGET
    print(
        f"{'python -c pass, 1 MiB file':<26} CPU without: {plain_cpu * 1e3:5.1f} ms   "
        f"{entries} entries: {active_cpu * 1e3:5.1f} ms   ratio {active_cpu / plain_cpu:.2f}, "
        f"{added * 1e3:.0f} ms added (target <= {FILE_TARGET * 1e3:.0f} ms)   "
        f"wall {plain * 1e3:.1f} and {active * 1e3:.1f} ms   [{runs} runs each]"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
