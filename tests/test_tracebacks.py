"""An uncaught violation's traceback ends at the user's line, and names it by its public name.

The uncaught ones are shown by real interpreters, as a user sees them (the exception hooks run
when the program dies, which a test in this process cannot let happen); the hooks' choices are
pinned in this process, on the exceptions themselves.
"""

from __future__ import annotations

import inspect
import os
import pickle
import re
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest

import cgguard

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

    from conftest import Runtime

# Real CUDA where it is usable, the simulated runtime elsewhere: the nested capture is refused
# before it begins either way, and the outer one ends as it would.
PREAMBLE = """
import contextlib
import sys
import threading

import cgguard
import torch
from cgguard.testing import simulated_cuda

runtime = contextlib.nullcontext() if torch.cuda.is_available() else simulated_cuda()
"""

MAIN_THREAD = """
def previous(kind, value, tb):
    print(value)  # the message, for the test to expect it whole
    print("previous hook:", kind.__name__, file=sys.stderr)
    sys.__excepthook__(kind, value, tb)


sys.excepthook = previous
cgguard.install()
with runtime, torch.cuda.graph(torch.cuda.CUDAGraph()):
    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # the nested capture
        pass
"""

IN_A_THREAD = """
def previous(args):
    print(args.exc_value)
    print("previous hook:", args.exc_type.__name__, args.thread.name, file=sys.stderr)
    threading.__excepthook__(args)


def capture():
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):  # the nested capture
            pass


threading.excepthook = previous
cgguard.install()
with runtime:
    worker = threading.Thread(target=capture, name="capturer")
    worker.start()
    worker.join()
"""

# Python 3.11+ marks the failing part of a line with ^ and ~ on a line of its own, depending on
# the version and the line: not what these tests are about.
MARKERS = re.compile(r"\s*[~^]+\s*")


def run_script(folder: Path, body: str) -> tuple[str, str, str]:
    """Run the script ``PREAMBLE + body``: (its path, its stdout, its stderr without the log's
    JSON lines and Python's markers under a traceback's lines)."""
    script = folder / "uncaught_violation.py"  # no standard library module's name
    script.write_text(PREAMBLE + body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")}
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    stderr = [
        line
        for line in done.stderr.splitlines()
        if not line.startswith('{"event": ') and not MARKERS.fullmatch(line)
    ]
    return str(script), done.stdout, "\n".join(stderr) + "\n"


def line_of(source: str, text: str) -> int:
    """The number of the line of ``source`` that ends with ``text``."""
    return next(n for n, line in enumerate(source.splitlines(), 1) if line.endswith(text))


@pytest.mark.subprocess
def test_an_uncaught_violation_ends_at_the_user_s_line_after_the_previous_hook(
    tmp_path: Path,
) -> None:
    """The main thread's uncaught violation: the hook set before install() runs, and the
    traceback it prints ends at the script's line, under the exception's public name."""
    script, message, stderr = run_script(tmp_path, MAIN_THREAD)
    line = line_of(PREAMBLE + MAIN_THREAD, "# the nested capture")
    expected = (
        "previous hook: NestedCaptureError\n"
        "Traceback (most recent call last):\n"
        f'  File "{script}", line {line}, in <module>\n'
        "    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # the nested capture\n"
        f"cgguard.NestedCaptureError: {message}"
    )
    assert expected == stderr


@pytest.mark.subprocess
def test_a_thread_s_uncaught_violation_ends_at_the_user_s_line_after_the_previous_hook(
    tmp_path: Path,
) -> None:
    """A thread's uncaught violation: threading's frames above the user's stay, cgguard's and
    torch's below it go, and the hook set before install() runs."""
    script, message, stderr = run_script(tmp_path, IN_A_THREAD)

    def line_in(function: Any, text: str) -> int:
        lines, first = inspect.getsourcelines(function)
        return first + next(i for i, line in enumerate(lines) if line.strip() == text)

    run = "self._target(*self._args, **self._kwargs)"
    expected = (
        "previous hook: NestedCaptureError capturer\n"
        "Exception in thread capturer:\n"
        "Traceback (most recent call last):\n"
        f'  File "{threading.__file__}", line '
        f"{line_in(threading.Thread._bootstrap_inner, 'self.run()')}, in _bootstrap_inner\n"
        "    self.run()\n"
        f'  File "{threading.__file__}", line {line_in(threading.Thread.run, run)}, in run\n'
        f"    {run}\n"
        f'  File "{script}", line {line_of(PREAMBLE + IN_A_THREAD, "# the nested capture")}, '
        "in capture\n"
        "    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # the nested capture\n"
        f"cgguard.NestedCaptureError: {message}"
    )
    assert expected == stderr


def nested_capture() -> cgguard.NestedCaptureError:
    """A real violation, caught here: its traceback runs from this frame into cgguard's."""
    import torch

    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass
    except cgguard.NestedCaptureError as exc:
        return exc
    raise AssertionError("the nested capture was not refused")


def places(tb: TracebackType | None) -> list[tuple[str, str]]:
    """Each entry of ``tb``: (its file, relative to the package's folder where inside it, its
    function)."""
    root = os.path.dirname(os.path.dirname(cgguard.__file__)) + os.sep
    out = []
    while tb is not None:
        code = tb.tb_frame.f_code
        out.append((code.co_filename.removeprefix(root), code.co_name))
        tb = tb.tb_next
    return out


HERE = os.path.relpath(__file__, os.path.dirname(os.path.dirname(cgguard.__file__)))


def test_a_violation_chained_to_another_error_is_shown_trimmed_and_kept_whole(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A violation as the cause of an uncaught error: the hook before cgguard's sees it end at
    the user's frame, and the exception keeps its every frame once shown."""
    seen = []

    def previous(kind: type[BaseException], value: BaseException, tb: TracebackType) -> None:
        seen.append((kind, places(tb), places(value.__cause__.__traceback__)))  # type: ignore[union-attr]

    monkeypatch.setattr(sys, "excepthook", previous)
    cgguard.install()
    violation = nested_capture()
    whole = violation.__traceback__
    try:
        raise ValueError("wrapped") from violation
    except ValueError as exc:
        error = exc
    sys.excepthook(ValueError, error, error.__traceback__)
    inner = places(whole)[1:]
    assert (
        [(ValueError, places(error.__traceback__), [(HERE, "nested_capture")])],
        whole,
        True,
    ) == (seen, violation.__traceback__, bool(inner) and inner[-1][0].startswith("cgguard/"))


def test_another_error_reaches_the_previous_hook_untouched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error that is not a violation, raised inside torch's own Python code: the previous
    hook is handed the very traceback, torch's frames and all."""
    import torch

    seen = []

    def previous(kind: type[BaseException], value: BaseException, tb: TracebackType) -> None:
        seen.append((kind, value, tb, value.__traceback__))

    monkeypatch.setattr(sys, "excepthook", previous)
    cgguard.install()
    try:
        torch.nn.functional.relu("not a tensor")  # type: ignore[arg-type]
    except TypeError as exc:
        error = exc
    tb = error.__traceback__
    sys.excepthook(TypeError, error, tb)
    assert ([(TypeError, error, tb, tb)], "torch/nn/functional.py") == (
        seen,
        places(tb)[-1][0].rpartition("site-packages/")[2],
    )


def test_uninstall_puts_back_the_hooks_that_were_there() -> None:
    """install() puts cgguard's hooks in front of both; uninstall() puts the previous back."""
    before = (sys.excepthook, threading.excepthook)
    cgguard.install()
    during = (sys.excepthook, threading.excepthook)
    cgguard.uninstall()
    assert (True, True, before) == (
        during[0] is not before[0],
        during[1] is not before[1],
        (sys.excepthook, threading.excepthook),
    )


def test_a_hook_set_after_install_is_left_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook the program sets after install() is neither wrapped again by a reconfiguration
    nor taken away by uninstall()."""

    def own(kind: type[BaseException], value: BaseException, tb: TracebackType) -> None:
        pass

    def own_thread(args: threading.ExceptHookArgs) -> None:
        pass

    cgguard.install()
    monkeypatch.setattr(sys, "excepthook", own)
    monkeypatch.setattr(threading, "excepthook", own_thread)
    cgguard.install(cgguard.Config(mode="log"))
    reconfigured = (sys.excepthook, threading.excepthook)
    cgguard.uninstall()
    assert [(own, own_thread)] * 2 == [reconfigured, (sys.excepthook, threading.excepthook)]


def test_a_failure_to_shorten_shows_the_whole_traceback_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """cgguard's own failure while shortening a traceback is one line on stderr; the previous
    hook still shows the violation, whole."""
    from cgguard._reporting import tracebacks

    seen = []

    def previous(kind: type[BaseException], value: BaseException, tb: TracebackType) -> None:
        seen.append((value, tb))

    def broken(tb: TracebackType | None) -> TracebackType | None:
        raise RuntimeError("broken")

    monkeypatch.setattr(sys, "excepthook", previous)
    monkeypatch.setattr(tracebacks, "trimmed", broken)
    cgguard.install()
    violation = cgguard.NestedCaptureError("nested")
    try:
        raise violation
    except cgguard.NestedCaptureError:
        tb = violation.__traceback__
    sys.excepthook(cgguard.NestedCaptureError, violation, tb)
    expected = "cgguard: could not shorten a violation's traceback: RuntimeError('broken')\n"
    assert ([(violation, tb)], expected) == (seen, capsys.readouterr().err)


PUBLIC_ERRORS = sorted(
    name
    for name in cgguard.__all__
    if isinstance(getattr(cgguard, name), type) and issubclass(getattr(cgguard, name), Exception)
)


def test_every_exception_is_public() -> None:
    """Each exception class cgguard defines is exported by ``cgguard``, where its public name
    (below) has pickle look for it."""
    from cgguard import _errors

    defined = sorted(
        name
        for name, value in vars(_errors).items()
        if isinstance(value, type) and issubclass(value, cgguard.CgguardError)
    )
    exported = PUBLIC_ERRORS
    assert exported == defined


def test_every_exception_goes_by_its_public_name_and_pickles() -> None:
    """Each of cgguard's exceptions is ``cgguard.<Name>``, as a traceback prints it, and comes
    back from pickle whole: its class, message and event."""
    shown, back = {}, {}
    for name in PUBLIC_ERRORS:
        kind = getattr(cgguard, name)
        shown[name] = f"{kind.__module__}.{kind.__qualname__}"
        error = kind("message")
        error.event = {"rule": getattr(kind, "rule", None), "count": 1}
        again = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own objects, round trip
        back[name] = (type(again), again.args, again.event)
    assert ({n: f"cgguard.{n}" for n in PUBLIC_ERRORS}, back) == (
        shown,
        {
            n: (
                getattr(cgguard, n),
                ("message",),
                {"rule": getattr(getattr(cgguard, n), "rule", None), "count": 1},
            )
            for n in PUBLIC_ERRORS
        },
    )
