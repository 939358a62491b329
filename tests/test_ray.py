"""Ray: which ways of starting a job activate cgguard in Ray's workers, each worker's report
after Ray ends it without exit handlers, and a refusal reaching the driver as a RayTaskError.

One local cluster serves the module: started here with ray.init(), small, without a dashboard,
its job activated through ``runtime_env={"env_vars": ...}`` (cgguard is installed in this
Python, which the cluster's workers run). Workers run on the simulated CUDA runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
from helpers import SourceFile, clean_environ

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray)")

pytestmark = [
    pytest.mark.simulated,
    # The cluster and its workers are new interpreters, started from here.
    pytest.mark.subprocess,
    # Every test here on one xdist worker: one cluster for the module, not one per worker.
    pytest.mark.xdist_group("ray"),
]

# No token written under ~/.ray, no usage statistics sent: the cluster is local and brief.
RAY_ENVIRON = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


class Cluster:
    """The module's cluster: its address, and where its workers' reports and events go."""

    def __init__(self, address: str, reports: Path, log: Path) -> None:
        self.address = address
        self.reports = reports
        self.log = log

    def report(self, pid: int) -> dict[str, Any]:
        return dict(json.loads((self.reports / f"r-{pid}.json").read_text()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("ray")
    reports, log = folder / "reports", folder / "events.jsonl"
    reports.mkdir()
    env_vars = {
        "CGGUARD_ENABLED": "1",
        "CGGUARD_SIMULATE_CUDA": "1",
        "CGGUARD_REPORT": str(reports / "r-{pid}.json"),
        "CGGUARD_LOG_FILE": str(log),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in RAY_ENVIRON.items():
            patch.setenv(name, value)
        context = ray.init(
            # "local": a new cluster even where `ray start` left one that ray.init() would join.
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": env_vars},
        )
        try:
            yield Cluster(context.address_info["gcs_address"], reports, log)
        finally:
            ray.shutdown()


THIS = SourceFile(__file__)


@ray.remote(max_restarts=0)
class Capturer:
    """A worker process of its own that captures on the simulated runtime."""

    def state(self) -> dict[str, Any]:
        import torch

        import cgguard

        status = cgguard.status()
        return {
            "pid": os.getpid(),
            "installed": status.installed,
            "activated_by": status.activated_by,
            "simulated": not torch.cuda.is_available() and hasattr(torch.cuda, "CUDAGraph"),
        }

    def violate(self) -> None:
        import torch

        import cgguard

        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            try:
                with torch.cuda.graph(torch.cuda.CUDAGraph()):  # ray-nested
                    pass
            except cgguard.NestedCaptureError:
                pass  # swallowed, as a library might: the report still holds it
        with cgguard.capture_disabled():
            try:
                with torch.cuda.graph(g):  # ray-disabled
                    pass
            except cgguard.CaptureDisabledError:
                pass


@ray.remote
def refused() -> None:
    import torch

    import cgguard

    cgguard.set_capture_enabled(False)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # ray-refused
        pass


def test_each_worker_is_activated_and_its_report_survives_ray_kill(cluster: Cluster) -> None:
    """Both actors' workers are guarded; after ray.kill (no exit handler runs), the violating
    one's report holds both violations and the clean one's report shows it was guarded."""
    violating, clean = Capturer.remote(), Capturer.remote()  # type: ignore[attr-defined]
    states = ray.get([violating.state.remote(), clean.state.remote()])
    assert [(s["installed"], s["activated_by"], s["simulated"]) for s in states] == [
        (True, "pth", True),
        (True, "pth", True),
    ]
    ray.get(violating.violate.remote())
    for actor in (violating, clean):
        ray.kill(actor, no_restart=True)
    nested = THIS.frame("ray-nested", "violate")
    disabled = THIS.frame("ray-disabled", "violate")
    report = cluster.report(states[0]["pid"])
    assert (
        report["pid"],
        report["totals"],
        [(v["rule"], v["count"], v["first"]["stack"][-1]) for v in report["violations"]],
    ) == (
        states[0]["pid"],
        {"nested_capture": 1, "capture_disabled": 1},
        [("nested_capture", 1, nested), ("capture_disabled", 1, disabled)],
    )
    quiet = cluster.report(states[1]["pid"])
    assert (quiet["pid"], quiet["totals"], quiet["violations"]) == (states[1]["pid"], {}, [])


def test_a_refusal_reaches_the_driver_as_a_ray_task_error(cluster: Cluster) -> None:
    """In raise mode the driver's ray.get raises RayTaskError whose cause is the worker's
    CaptureDisabledError, with its message and full event."""
    import cgguard

    with pytest.raises(ray.exceptions.RayTaskError) as raised:
        ray.get(refused.remote())
    cause = raised.value.cause
    site = THIS.frame("ray-refused", "refused")
    assert (
        type(cause).__name__,
        isinstance(raised.value, cgguard.CaptureDisabledError),
        str(cause).startswith(
            "CUDA graph capturing detected at an inappropriate time. This operation is "
            f"currently disabled. torch.cuda.graph at {site['file']}:{site['line']} "
        ),
        cause.event["rule"],
        cause.event["action"],
        cause.event["stack"][-1],
    ) == ("CaptureDisabledError", True, True, "capture_disabled", "raised", site)


DRIVER = """\
import json
import os
import sys

import ray


@ray.remote
def probe():
    import torch

    import cgguard

    return [cgguard.is_installed(), os.environ.get("CGGUARD_ENABLED")]


address = sys.argv[1] if len(sys.argv) > 1 else None
# The recipe for a cluster someone else started: the driver's settings, handed to the job.
settings = {k: v for k, v in os.environ.items() if k.startswith("CGGUARD_")}
if address:
    ray.init(address=address, runtime_env={"env_vars": settings} if "pass" in sys.argv else None)
else:
    ray.init(address="local", num_cpus=1, include_dashboard=False)
print(json.dumps(ray.get(probe.remote())))
ray.shutdown()
"""


def run_driver(folder: Path, *args: str) -> list[Any]:
    """``cgguard run --simulate-cuda ray_driver.py ARGS``: what its task saw."""
    program = folder / "ray_driver.py"
    program.write_text(DRIVER)
    command = [sys.executable, "-m", "cgguard", "run", "--simulate-cuda", str(program), *args]
    result = subprocess.run(
        command,
        env=clean_environ(**RAY_ENVIRON),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout.splitlines()[-1]))


def test_a_driver_under_cgguard_run_activates_nothing_in_an_existing_cluster(
    cluster: Cluster, tmp_path: Path
) -> None:
    """ray.init(address=...) joins workers the cluster started, with the cluster's environment:
    the driver's activation does not reach them, and nothing says so."""
    assert run_driver(tmp_path, cluster.address) == [False, None]


def test_a_driver_that_hands_its_settings_to_the_job_activates_its_workers(
    cluster: Cluster, tmp_path: Path
) -> None:
    """runtime_env={"env_vars": the driver's CGGUARD_* variables} guards the job's workers on a
    cluster started without cgguard."""
    assert run_driver(tmp_path, cluster.address, "pass") == [True, "1"]


def test_a_cluster_started_by_a_driver_under_cgguard_run_is_activated(tmp_path: Path) -> None:
    """ray.init() that starts the cluster passes the driver's environment to every worker."""
    assert run_driver(tmp_path) == [True, "1"]
