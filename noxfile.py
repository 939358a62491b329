"""The supported range, tested: the whole suite on the oldest claimed torch and the newest one.

Each session makes its own virtual environment, installs cgguard with its test extra and one
torch release pinned exactly, prints what it got, and runs the suite. The capture scenarios run
on cgguard's simulated CUDA runtime: PyPI's Linux wheels of torch are CUDA builds, and the
simulation runs on those where no CUDA device is usable, as on a CPU-only build.

    nox -l                         # the sessions
    nox -s "tests(3.10-torch2.1.2)"
    nox -- -m "not subprocess"     # arguments after -- go to pytest
    nox -s frameworks              # the audit and the profiles against real vLLM and SGLang

nox itself is not among cgguard's extras (``pip install nox``). Each Python a session names must
be on PATH as ``python3.X``. Each session downloads a CUDA build of torch with its CUDA
libraries (2.6 GB for torch 2.1.2) unless pip finds them in its cache or a ``--find-links``
folder, and takes about 5 GB installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True

OLDEST_TORCH = "2.1.2"  # the last bug-fix release of 2.1, the oldest claimed minor release
NEWEST_TORCH = "2.15.0"  # needs CPython 3.11 or later
NEWEST_TORCH_ON_3_10 = "2.14.1"  # the last release with CPython 3.10 wheels

# (Python, torch, further pins). Each torch release runs on the oldest and the newest Python it
# has wheels for, within the claimed 3.10 to 3.13: torch 2.1 has wheels for CPython 3.8 to 3.11
# only, and torch 2.15 for 3.11 and later, so 3.10 gets the newest torch that still supports it.
MATRIX = [
    # torch 2.1 was built against NumPy 1.x and cannot use NumPy 2.
    ("3.10", OLDEST_TORCH, ("numpy<2",)),
    ("3.11", OLDEST_TORCH, ("numpy<2",)),
    ("3.10", NEWEST_TORCH_ON_3_10, ()),
    ("3.12", NEWEST_TORCH, ()),  # the one claimed Python between the two ends
    ("3.13", NEWEST_TORCH, ()),
]


@nox.session
@nox.parametrize(
    ("python", "torch", "pins"),
    [nox.param(python, torch, pins, id=f"{python}-torch{torch}") for python, torch, pins in MATRIX],
)
def tests(session: nox.Session, torch: str, pins: tuple[str, ...]) -> None:
    """The whole suite on one Python and one torch release."""
    session.install("-e", ".[test]", f"torch=={torch}", *pins)
    session.run(
        "python",
        "-c",
        "import sys, torch; print('Python', sys.version.split()[0], '| torch', torch.__version__,"
        " '| CUDA built:', torch.backends.cuda.is_built(),"
        " '| CUDA available:', torch.cuda.is_available())",
    )
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *session.posargs)


# What vLLM 0.33.0's vllm.v1.worker.gpu.model_runner and SGLang 0.5.23's window modules need to
# import on CPU torch. xgrammar and apache-tvm-ffi go in without their dependencies, which would
# bring a CUDA build of torch into the folder and shadow the session's own.
VLLM_DEPS = (
    "transformers", "pydantic", "regex", "cbor2", "psutil", "pyzmq", "pyyaml", "httpx", "numpy",
    "urllib3", "aiohttp", "attrs", "requests", "openai", "openai_harmony", "sniffio", "pillow",
    "pybase64", "cachetools", "msgspec", "cloudpickle", "uvloop", "py-cpuinfo", "fastapi",
    "partial_json_parser", "llguidance", "einops", "prometheus_client",
)  # fmt: skip
VLLM_NO_DEPS = ("xgrammar", "apache-tvm-ffi")
SGLANG_DEPS = (
    "orjson", "psutil", "pybase64", "requests", "triton", "pillow", "starlette", "msgspec",
    "pydantic==2.13.*", "pyzmq", "tqdm", "ipython", "aiohttp",
)  # fmt: skip
FRAMEWORKS = ("vllm==0.33.0", "sglang==0.5.23")


@nox.session(python="3.11")
def frameworks(session: nox.Session) -> None:
    """The capture-site audit and the built-in profiles against the real vLLM and SGLang.

    Downloads into $FRAMEWORKS_CACHE (default .nox/frameworks-cache), once: the two wheels
    (about 380 MB) and their import dependencies (about 400 MB).
    """
    cache = Path(os.environ.get("FRAMEWORKS_CACHE", ".nox/frameworks-cache")).resolve()
    session.install("-e", ".[test]", "torch==2.13.0")
    wheels = cache / "wheels"
    for spec in FRAMEWORKS:
        name, _, version = spec.partition("==")
        if not list(wheels.glob(f"{name}-{version}-*.whl")):
            session.run("python", "-m", "pip", "download", "--no-deps", spec, "-d", str(wheels))
    for name, deps, no_deps in (("vllm", VLLM_DEPS, VLLM_NO_DEPS), ("sglang", SGLANG_DEPS, ())):
        target = cache / f"{name}-deps"
        if not target.is_dir():
            session.run("python", "-m", "pip", "install", "--target", str(target), *deps)
            if no_deps:
                pip = ("python", "-m", "pip", "install", "--no-deps", "--target", str(target))
                session.run(*pip, *no_deps)
    session.run(
        "python",
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-m",
        "frameworks",
        "tests/test_audit.py",
        "tests/test_frameworks.py",
        *session.posargs,
        env={"FRAMEWORKS_CACHE": str(cache)},
    )
