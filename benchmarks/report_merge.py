"""Cost of ``cgguard report`` on a large report, in one run: time and peak memory against the
file's size; and what it writes for a job of many processes.

Writes one report of N distinct sites (each a full violation event with a two-frame stack and
a two-frame cause, as cgguard writes them), then runs ``cgguard report`` on it in a fresh
process for each format, output to os.devnull, at N/10 sites and at N sites. For each it prints
the CPU time (user and system, which a busy machine does not inflate as it does wall time) per
100 MB of report, and the peak resident memory beyond that of a run on a report of one site,
as a multiple of the report's size: both staying put from N/10 to N shows the cost linear.
Targets: at most 15 s of CPU per 100 MB, and a peak of at most 4 times the report's size.

Then a job: R reports, one per process, each hitting one site shared by all, merged in each
format: the CPU time, and the lines and bytes written (a view for a person names the top
processes, so its lines stay put as R grows; the JSON view lists every process).

    python benchmarks/report_merge.py [--sites N] [--reports R]
                                      [--format text|json|markdown|html ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

TARGET_S_PER_100MB = 15.0
TARGET_MEMORY = 4.0  # times the report's size


def report(sites: int) -> dict[str, object]:
    """A report of ``sites`` distinct sites, one process's, as cgguard writes it."""

    def frame(file: str, line: int, function: str, code: str) -> dict[str, object]:
        return {"file": file, "line": line, "function": function, "code": code}

    main = frame("/srv/model/serve.py", 120, "<module>", "main()")
    violations = []
    for i in range(sites):
        where = frame(f"/srv/model/layers_{i % 97}.py", 10 + i, f"forward_{i}", "with g:")
        off = frame("/srv/model/runner.py", 55, "serve", "cgguard.set_capture_enabled(False)")
        first = {
            "event": "cgguard.capture_violation",
            "level": "warning",
            "rule": "capture_disabled",
            "action": "logged",
            "api": "torch.cuda.graph",
            "message": "CUDA graph capturing detected at an inappropriate time. This operation "
            f"is currently disabled. torch.cuda.graph at {where['file']}:{where['line']} "
            f"(in {where['function']}) began a capture; capture was disabled at "
            "/srv/model/runner.py:55 (in serve).",
            "count": 1,
            "thread": "MainThread",
            "thread_id": 140000000000001,
            "pid": 4242,
            "rank": 0,
            "timestamp": f"2026-12-01T05:{i // 60000 % 60:02d}:{i // 1000 % 60:02d}.{i:06d}Z",
            "stack": [main, where],
            "disabled_stack": [main, off],
        }
        violations.append({"rule": "capture_disabled", "count": 1 + i % 5, "first": first})
    return {
        "cgguard": "0.1.0",
        "python": "3.11.9",
        "torch": "2.13.0",
        "host": "node-a",
        "pid": 4242,
        "rank": 0,
        "written_at": "2026-12-01T06:00:00.000000Z",
        "config": {"mode": "log"},
        "totals": {"capture_disabled": sum(int(str(v["count"])) for v in violations)},
        "violations": violations,
        "exempted_totals": {},
        "exempted": [],
    }


def job(folder: str, reports: int) -> None:
    """``reports`` reports in ``folder``, one per rank of a job, each with one violation site
    that every rank shares (rank r hits it 1 + r % 3 times), as the ranks' cgguard writes them."""
    one = report(1)
    first = one["violations"][0]["first"]  # type: ignore[index]
    for rank in range(reports):
        pid = 10_000 + rank
        count = 1 + rank % 3
        event = {**first, "pid": pid, "rank": rank}
        document = {
            **one,
            "host": f"node-{rank // 8}",
            "pid": pid,
            "rank": rank,
            "local_rank": rank % 8,
            "world_size": reports,
            "totals": {"capture_disabled": count},
            "violations": [{"rule": "capture_disabled", "count": count, "first": event}],
        }
        with open(os.path.join(folder, f"r-{pid}.json"), "w") as file:
            json.dump(document, file)


def measure(path: str, fmt: str, output: str = os.devnull) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, peak resident MB, exit status) of ``cgguard report``, its
    standard output written to ``output``."""
    command = [sys.executable, "-m", "cgguard", "report", "--format", fmt, path]
    start = time.perf_counter()
    with open(output, "w") as out:
        child = subprocess.Popen(command, stdout=out)
        # wait4: the child's own usage, not the largest of every child this process waited for.
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=100_000, help="sites in the large report")
    parser.add_argument(
        "--reports", type=int, default=3_000, help="processes in the job (0: no job measured)"
    )
    parser.add_argument(
        "--format",
        nargs="+",
        default=["text", "json", "markdown", "html"],
        choices=["text", "json", "markdown", "html"],
    )
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        base = os.path.join(folder, "r-1.json")
        with open(base, "w") as file:
            json.dump(report(1), file)
        base_mb = max(measure(base, fmt)[2] for fmt in args.format)
        print(f"peak of a run on a report of one site: {base_mb:.0f} MB")
        for sites in (max(1, args.sites // 10), args.sites):
            path = os.path.join(folder, f"r-{sites}.json")
            with open(path, "w") as file:
                json.dump(report(sites), file)
            size_mb = os.path.getsize(path) / 1e6
            print(f"{sites} sites, {size_mb:.1f} MB of report:")
            for fmt in args.format:
                wall, cpu, peak_mb, status = measure(path, fmt)
                per_100mb = cpu / size_mb * 100
                ratio = (peak_mb - base_mb) / size_mb
                missed = status != 1 or per_100mb > TARGET_S_PER_100MB or ratio > TARGET_MEMORY
                failed |= missed
                print(
                    f"  {fmt:8} CPU {cpu:6.2f} s ({per_100mb:5.2f} s per 100 MB; wall {wall:.2f} s)"
                    f", peak {peak_mb:5.0f} MB ({ratio:4.2f}x the report beyond the base)"
                    + ("  MISSED" if missed else "")
                )
        if args.reports:
            reports = os.path.join(folder, "job")
            os.mkdir(reports)
            job(reports, args.reports)
            print(f"a job of {args.reports} reports, one site shared by all:")
            for fmt in args.format:
                written = os.path.join(folder, f"view.{fmt}")
                wall, cpu, peak_mb, status = measure(reports, fmt, written)
                with open(written, "rb") as file:
                    data = file.read()
                lines = data.count(b"\n")
                failed |= status != 1
                print(
                    f"  {fmt:8} CPU {cpu:6.2f} s (wall {wall:.2f} s), peak {peak_mb:5.0f} MB, "
                    f"{lines:6} lines, {len(data) / 1e3:8.1f} kB written"
                    + ("" if status == 1 else f"  MISSED (status {status})")
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
