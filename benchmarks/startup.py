"""Start-up cost of activation, measured in one run: ``python -c pass`` and ``import torch``.

Prints the median wall time of each command with and without CGGUARD_ENABLED=1, and the
ratios. Targets: idle activation <= 1.05x a bare interpreter start, torch import <= 1.02x.
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
import time

TARGETS = {"python -c pass": 1.05, "python -c 'import torch'": 1.02}
CODE = {"python -c pass": "pass", "python -c 'import torch'": "import torch"}


def once(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - start


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
        once(code, off)  # warm the page cache for both
        plain: list[float] = []
        active: list[float] = []
        for i in range(runs):
            # Interleaved and alternating, so that a noisy neighbour hits both alike.
            for activated in (False, True) if i % 2 else (True, False):
                (active if activated else plain).append(once(code, on if activated else off))
        ratio = statistics.median(active) / statistics.median(plain)
        failed |= ratio > TARGETS[label]
        print(
            f"{label:<26} without: {statistics.median(plain) * 1e3:7.1f} ms   "
            f"CGGUARD_ENABLED=1: {statistics.median(active) * 1e3:7.1f} ms   "
            f"ratio {ratio:.3f} (target <= {TARGETS[label]})   [{runs} runs each]"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
