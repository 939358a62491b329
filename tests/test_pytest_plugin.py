"""The pytest plugin: ``pytest --cgguard`` fails a test during which a capture violation occurs.

Each session here is a real pytest subprocess: the plugin installs cgguard, patches torch and
keeps global state, none of which may leak into this session. Scenarios that run under the same
options, ini file and conftest share one session, which imports torch once for all of them:
their test files are collected and run together, and each test here still judges its own
scenario alone, by that test's outcome and its own section of the report. A scenario that needs
a session of its own (an ini file, a conftest, the environment) gets one from pytester.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING
from xml.etree import ElementTree

import pytest
from helpers import DISABLED_SENTENCE

if TYPE_CHECKING:
    from pathlib import Path

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.subprocess

# A capture refused by cgguard, and the refusal swallowed: the code under test never fails.
SWALLOWED = """
    import cgguard
    import torch
    from cgguard.testing import simulated_cuda


    def test_swallowed():
        with simulated_cuda():
            graph = torch.cuda.CUDAGraph()
            with cgguard.capture_disabled():
                try:
                    with torch.cuda.graph(graph):
                        pass
                except RuntimeError:
                    pass
"""

HEAVY = ("structlog", "torch", "wrapt")


@pytest.fixture(autouse=True)
def _no_cgguard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # pytester's subprocesses inherit this environment; a CGGUARD_* variable of the caller's
    # would activate cgguard in them before the plugin decides anything.
    for name in list(os.environ):
        if name.startswith("CGGUARD_"):
            monkeypatch.delenv(name)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """pytest in a subprocess, with the repository's strictness, on the files made here.

    Without hypothesis's plugin, which takes most of a second to load and has no part in these
    scenarios; the shared sessions below keep every installed plugin, as a user's session would.
    """
    return pytester.runpytest_subprocess(
        "-p", "no:hypothesispytest", "--strict-markers", "--strict-config", "-rA", *args
    )


# A test's section of the report opens with "____ test_x ____" (or "ERROR at setup of test_x");
# its title starts with neither "_" nor a space, as "_ _ _ _" separates traceback entries. The
# next part of the report ("==== PASSES ====", "==== short test summary info ====") closes it.
SECTION = re.compile(r"_+ ([^_ ].*?) _+")
PART = re.compile(r"=+ .* =+")
OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}


class Session:
    """A finished pytest subprocess: its output, and each of its tests' outcome and report."""

    def __init__(self, stdout: str, junit: Path) -> None:
        self.stdout = pytest.LineMatcher(stdout.splitlines())
        self._outcomes: dict[str, str] = {}
        # The session's own per-test record; a file it wrote moments ago, not untrusted input.
        for case in ElementTree.parse(junit).iter("testcase"):  # noqa: S314
            nodeid = f"{case.get('classname')}.py::{case.get('name')}"
            kinds = [OUTCOMES[child.tag] for child in case if child.tag in OUTCOMES]
            self._outcomes[nodeid] = "+".join(kinds) or "passed"
        self._sections: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in self.stdout.lines:
            header = SECTION.fullmatch(line)
            if header:
                current = self._sections.setdefault(header.group(1), [])
            elif PART.fullmatch(line):
                current = None
            if current is not None:
                current.append(line)

    def outcomes(self, file: str) -> dict[str, str]:
        """Each test of ``file`` by node id, with its outcome: passed, failed, error, skipped."""
        return {k: v for k, v in self._outcomes.items() if k.startswith(f"{file}::")}

    def section(self, title: str) -> pytest.LineMatcher:
        """The lines pytest printed under the header ``title``, the header line first."""
        return pytest.LineMatcher(self._sections.get(title, []))


def run_session(folder: Path, files: dict[str, str], *args: str) -> Session:
    """pytest in a subprocess on ``files`` (name: source), set up as pytester sets up its own."""
    for name, source in files.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source).strip() + "\n")
    junit = folder.parent / f"{folder.name}.xml"
    # As in pytester's sessions: no option, ini file or home folder of the caller's; no colours.
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("CGGUARD_") and name not in ("PYTEST_ADDOPTS", "TOX_ENV_DIR")
    }
    env |= {"HOME": str(folder), "USERPROFILE": str(folder), "PY_COLORS": "0"}
    argv = [sys.executable, "-mpytest", f"--basetemp={folder / 'runpytest-0'}"]
    argv += ["--strict-markers", "--strict-config", "-rA", f"--junitxml={junit}", *args]
    done = subprocess.run(
        argv,
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if not junit.exists():
        pytest.fail(f"the session ended without its report:\n{done.stdout}\n{done.stderr}")
    return Session(done.stdout, junit)


# The scenarios of one ``pytest --cgguard`` session, by test file name; each test below adds its
# own. Its tests are one xdist group, so that one worker runs the session once for them all.
GUARDED: dict[str, str] = {}
# The scenarios of one session without --cgguard that imports no dependency at collection.
IDLE: dict[str, str] = {}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """One ``pytest --cgguard`` session over every scenario in GUARDED."""
    return run_session(tmp_path_factory.mktemp("guarded"), GUARDED, "--cgguard")


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """One plain ``pytest`` session over every scenario in IDLE."""
    return run_session(tmp_path_factory.mktemp("idle"), IDLE)


def test_importing_the_plugin_loads_neither_torch_nor_wrapt_nor_structlog() -> None:
    """Every pytest run imports the plugin: it loads no dependency, and of cgguard its testing
    helpers and fixtures alone, none of the capture path."""
    code = (
        "import sys, cgguard.pytest_plugin\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "print(sorted(m for m in sys.modules if m.startswith('cgguard')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    light = [
        "cgguard",
        "cgguard._boot",
        "cgguard._errors",
        "cgguard._support",
        "cgguard._support.patchset",
        "cgguard.pytest_plugin",
        "cgguard.testing",
        "cgguard.testing._helpers",
        "cgguard.testing._simcuda",
        "cgguard.testing.fixtures",
    ]
    expected = (0, f"[]\n{light}\n", "")
    assert expected == (done.returncode, done.stdout, done.stderr)


GUARDED["test_swallowed"] = SWALLOWED


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_swallowed_violation_fails_the_test_with_its_report(guarded: Session) -> None:
    """A refusal the test catches still fails it; the report shows the rule and both stacks."""
    assert guarded.outcomes("test_swallowed.py") == {"test_swallowed.py::test_swallowed": "failed"}
    # Consecutive: pytest's and pluggy's frames are cut, so the test's line comes first.
    guarded.section("test_swallowed").fnmatch_lines(
        [
            "*_ test_swallowed _*",
            "cgguard: capture_disabled violation during the test",
            "",
            f"capture_disabled (raised): {DISABLED_SENTENCE} torch.cuda.graph at "
            "*test_swallowed.py:11 (in test_swallowed) began a capture; capture was disabled at "
            "*test_swallowed.py:9 (in test_swallowed).",
            "The capture was attempted at (most recent call last):",
            '  File "*test_swallowed.py", line 11, in test_swallowed',
            "    with torch.cuda.graph(graph):",
            "",
            "Capture was disabled at (most recent call last):",
            '  File "*test_swallowed.py", line 9, in test_swallowed',
            "    with cgguard.capture_disabled():",
            "",
            'Declare expected violations with @pytest.mark.cgguard_expect("<rule>", ...), or '
            "take the cgguard_violations fixture and assert on them in the test.",
        ],
        consecutive=True,
    )
    guarded.stdout.fnmatch_lines(
        ["FAILED test_swallowed.py::test_swallowed - cgguard: capture_disabled*"]
    )


GUARDED["test_uncaught"] = """
    import cgguard
    import torch
    from cgguard.testing import simulated_cuda


    def test_uncaught():
        with simulated_cuda():
            graph = torch.cuda.CUDAGraph()
            with cgguard.capture_disabled():
                with torch.cuda.graph(graph):
                    pass
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_uncaught_violation_keeps_its_traceback_and_adds_the_report(guarded: Session) -> None:
    """A test already failing with the refusal keeps that failure; the report is a section of it."""
    assert guarded.outcomes("test_uncaught.py") == {"test_uncaught.py::test_uncaught": "failed"}
    guarded.section("test_uncaught").fnmatch_lines(
        [
            f"E * cgguard.CaptureDisabledError: {DISABLED_SENTENCE}*",
            "",
            "test_uncaught.py:10: CaptureDisabledError",
            "*- cgguard -*",
            "cgguard: capture_disabled violation during the test",
            "",
            # Its message is on the E line above: here, its stacks alone.
            "capture_disabled (raised): the exception above",
            "The capture was attempted at (most recent call last):",
            '  File "*test_uncaught.py", line 10, in test_uncaught',
        ],
        consecutive=True,
    )
    guarded.stdout.fnmatch_lines(
        ["FAILED test_uncaught.py::test_uncaught - cgguard.CaptureDisabledError*"]
    )


GUARDED["test_own_stderr"] = """
    import sys

    import cgguard
    import torch
    from cgguard.testing import simulated_cuda


    def test_own_stderr():
        print("written by the test", file=sys.stderr)
        with simulated_cuda(), cgguard.capture_disabled():
            try:
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    pass
            except RuntimeError:
                pass
"""


GUARDED["test_chained"] = """
    import cgguard
    import torch
    from cgguard.testing import simulated_cuda


    def test_chained():
        with simulated_cuda(), cgguard.capture_disabled():
            try:
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    pass
            except cgguard.CaptureDisabledError as exc:
                raise ValueError("wrapped") from exc
"""


def logged(section: pytest.LineMatcher) -> list[object]:
    """The rules of the violations the console log wrote in ``section`` (as JSON lines)."""
    prefix = '{"event": "cgguard.capture_violation"'
    return [json.loads(line)["rule"] for line in section.lines if line.startswith(prefix)]


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_a_violation_is_shown_once_in_its_test_s_failure(guarded: Session) -> None:
    """A failure shows each violation's message once, with its stacks: the console log's JSON
    copy of the violations it shows is left out of the test's captured stderr, and whatever
    else the test wrote there stays; an expected violation's line stays too."""
    tests = (
        "test_swallowed",
        "test_uncaught",
        "test_chained",
        "test_repeated",
        "test_mixed",
        "test_own_stderr",
    )
    seen = {
        test: (
            guarded.section(test).str().count(DISABLED_SENTENCE),
            logged(guarded.section(test)),
            "Captured stderr call" in guarded.section(test).str(),
        )
        for test in tests
    }
    expected = {
        "test_swallowed": (1, [], False),
        "test_uncaught": (1, [], False),
        "test_chained": (1, [], False),
        "test_repeated": (1, [], False),
        "test_mixed": (1, ["nested_capture"], True),
        "test_own_stderr": (1, [], True),
    }
    assert expected == seen
    guarded.section("test_own_stderr").fnmatch_lines(
        ["*- Captured stderr call -*", "written by the test"], consecutive=True
    )
    # A violation chained to the exception the test failed with: its message on its own E line.
    guarded.section("test_chained").fnmatch_lines(
        [
            ">               with torch.cuda.graph(torch.cuda.CUDAGraph()):",
            f"E               cgguard.CaptureDisabledError: {DISABLED_SENTENCE}*",
            "",
            "test_chained.py:9: CaptureDisabledError",
            "",
            "The above exception was the direct cause of the following exception:",
        ],
        consecutive=True,
    )
    guarded.section("test_chained").fnmatch_lines(
        ["capture_disabled (raised): the exception above"]
    )


GUARDED["test_repeated"] = """
    import cgguard
    import torch
    from cgguard.testing import simulated_cuda


    def test_repeated():
        with simulated_cuda(), cgguard.capture_disabled():
            for _ in range(3):
                try:
                    with torch.cuda.graph(torch.cuda.CUDAGraph()):
                        pass
                except cgguard.CaptureDisabledError:
                    pass
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_repeated_violation_is_reported_once_with_its_count(guarded: Session) -> None:
    """The same refusal three times in a loop is one block saying how many times it happened."""
    assert guarded.outcomes("test_repeated.py") == {"test_repeated.py::test_repeated": "failed"}
    report = guarded.section("test_repeated")
    report.fnmatch_lines(
        [
            "cgguard: 3 violations (capture_disabled) during the test",
            "",
            "capture_disabled (raised, 3 times): CUDA graph capturing detected*",
        ],
        consecutive=True,
    )
    # In the failure's report; the short summary may repeat it (untruncated when CI is set).
    assert report.str().count("capture_disabled (raised") == 1


GUARDED["test_fixture_setup"] = """
    import cgguard
    import pytest
    import torch
    from cgguard.testing import simulated_cuda


    @pytest.fixture
    def graph():
        with simulated_cuda():
            graph = torch.cuda.CUDAGraph()
            with cgguard.capture_disabled():
                try:
                    with torch.cuda.graph(graph):
                        pass
                except RuntimeError:
                    pass
            yield graph


    def test_uses_graph(graph):
        pass
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_violation_in_a_fixture_errors_the_test_at_setup(guarded: Session) -> None:
    """A fixture that swallows a refusal errors its test at setup, as a failing fixture does."""
    expected = {"test_fixture_setup.py::test_uses_graph": "error"}
    assert expected == guarded.outcomes("test_fixture_setup.py")
    guarded.section("ERROR at setup of test_uses_graph").fnmatch_lines(
        [
            "*ERROR at setup of test_uses_graph*",
            "cgguard: capture_disabled violation during setup",
        ]
    )


GUARDED["test_leak"] = """
    import threading

    import torch
    from cgguard.testing import simulated_cuda


    def test_leaks_a_capture():
        def leave():
            with torch.cuda.stream(torch.cuda.Stream()):
                torch.cuda.CUDAGraph().capture_begin(capture_error_mode="thread_local")

        with simulated_cuda():
            thread = threading.Thread(target=leave)
            thread.start()
            thread.join()


    def test_innocent():
        pass
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_a_capture_abandoned_by_a_test_s_thread_fails_that_test(guarded: Session) -> None:
    """A thread the test started ended inside a capture: that test fails, not the next one."""
    expected = {
        "test_leak.py::test_leaks_a_capture": "failed",
        "test_leak.py::test_innocent": "passed",
    }
    assert expected == guarded.outcomes("test_leak.py")
    guarded.section("test_leaks_a_capture").fnmatch_lines(
        ["cgguard: abandoned_capture violation during the test"]
    )


GUARDED["test_left_open"] = """
    import threading

    import torch
    from cgguard.testing import simulated_cuda

    RELEASE = threading.Event()
    THREADS = []


    def test_leaves_a_capture_open():
        with simulated_cuda(), torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.CUDAGraph().capture_begin()  # line 12


    def test_captures_after_it():
        with simulated_cuda():
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass


    def test_leaves_a_thread_capturing():
        began = threading.Event()

        def capture():
            with torch.cuda.stream(torch.cuda.Stream()):
                torch.cuda.CUDAGraph().capture_begin(capture_error_mode="thread_local")
                began.set()
                RELEASE.wait()

        with simulated_cuda():
            THREADS.append(threading.Thread(target=capture, name="cgg-capturer", daemon=True))
            THREADS[0].start()
            began.wait()


    def test_ends_that_thread():
        RELEASE.set()
        THREADS[0].join()
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_a_capture_left_open_fails_the_test_that_left_it(guarded: Session) -> None:
    """A capture still open after a test's teardown errors that test, on any thread still
    running; the tests after it start with no capture open."""
    expected = {
        "test_left_open.py::test_leaves_a_capture_open": "error",
        "test_left_open.py::test_captures_after_it": "passed",
        "test_left_open.py::test_leaves_a_thread_capturing": "error",
        "test_left_open.py::test_ends_that_thread": "passed",
    }
    assert expected == guarded.outcomes("test_left_open.py")
    guarded.section("ERROR at teardown of test_leaves_a_capture_open").fnmatch_lines(
        [
            "*ERROR at teardown of test_leaves_a_capture_open*",
            "cgguard: a capture begun during this test was still open after its teardown",
            "",
            "CUDAGraph.capture_begin (global mode) on thread 'MainThread' (*), begun at "
            "(most recent call last):",
            '  File "*test_left_open.py", line 12, in test_leaves_a_capture_open',
            "    torch.cuda.CUDAGraph().capture_begin()  # line 12",
            "",
            "cgguard no longer counts it as open, so the tests after this one do not run inside "
            "it. End every capture in the test that begins it: leave its torch.cuda.graph block, "
            "or call capture_end().",
        ],
        consecutive=True,
    )
    guarded.section("ERROR at teardown of test_leaves_a_thread_capturing").fnmatch_lines(
        [
            "cgguard: a capture begun during this test was still open after its teardown",
            "",
            "CUDAGraph.capture_begin (thread_local mode) on thread 'cgg-capturer' (*), begun at "
            "(most recent call last):",
        ],
        consecutive=True,
    )
    guarded.stdout.fnmatch_lines(
        ["ERROR test_left_open.py::test_leaves_a_capture_open - cgguard: *"]
    )


GUARDED["test_clean"] = """
    import torch
    from cgguard.testing import simulated_cuda


    def test_clean():
        with simulated_cuda():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                pass
            graph.replay()
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_clean_captures_pass(guarded: Session) -> None:
    """Captures that break no rule leave the test passing."""
    assert guarded.outcomes("test_clean.py") == {"test_clean.py::test_clean": "passed"}


GUARDED["test_expected"] = """
    import cgguard
    import pytest
    import torch
    from cgguard.testing import simulated_cuda


    @pytest.mark.cgguard_expect("capture_disabled")
    def test_expected():
        with simulated_cuda(), cgguard.capture_disabled():
            with pytest.raises(cgguard.CaptureDisabledError):
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    pass
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_expected_rule_that_occurs_passes(guarded: Session) -> None:
    """cgguard_expect names the rule the test breaks on purpose: the test passes."""
    assert guarded.outcomes("test_expected.py") == {"test_expected.py::test_expected": "passed"}


GUARDED["test_missing"] = """
    import pytest


    @pytest.mark.cgguard_expect("nested_capture")
    def test_missing():
        pass
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_expected_rule_that_does_not_occur_fails(guarded: Session) -> None:
    """A test whose expected violation never happens fails, naming the missing rule."""
    assert guarded.outcomes("test_missing.py") == {"test_missing.py::test_missing": "failed"}
    guarded.section("test_missing").fnmatch_lines(
        [
            "*_ test_missing _*",
            "cgguard: expected nested_capture violation did not occur "
            "(@pytest.mark.cgguard_expect)",
        ],
        consecutive=True,
    )


GUARDED["test_mixed"] = """
    import cgguard
    import pytest
    import torch
    from cgguard.testing import simulated_cuda


    @pytest.mark.cgguard_expect("nested_capture")
    def test_mixed():
        with simulated_cuda():
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                with pytest.raises(cgguard.NestedCaptureError):
                    with torch.cuda.graph(torch.cuda.CUDAGraph()):
                        pass
            with cgguard.capture_disabled():
                with pytest.raises(cgguard.CaptureDisabledError):
                    with torch.cuda.graph(torch.cuda.CUDAGraph()):
                        pass
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_unexpected_rule_fails_next_to_an_expected_one(guarded: Session) -> None:
    """Expecting nested_capture excuses that rule only: a capture_disabled still fails the test."""
    assert guarded.outcomes("test_mixed.py") == {"test_mixed.py::test_mixed": "failed"}
    report = guarded.section("test_mixed")
    report.fnmatch_lines(
        ["*_ test_mixed _*", "cgguard: capture_disabled violation during the test"],
        consecutive=True,
    )
    report.no_fnmatch_line("nested_capture (raised*")


GUARDED["test_typo"] = """
    import pytest


    @pytest.mark.cgguard_expect("nested")
    def test_typo():
        pass
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_unknown_rule_in_the_marker_is_an_error(guarded: Session) -> None:
    """A misspelt rule in cgguard_expect errors the test at setup and lists the rules."""
    assert guarded.outcomes("test_typo.py") == {"test_typo.py::test_typo": "error"}
    guarded.section("ERROR at setup of test_typo").fnmatch_lines(
        [
            "cgguard_expect: unknown rule(s) 'nested'; the rules are capture_disabled, "
            "nested_capture, concurrent_capture, sync_during_capture, abandoned_capture, "
            "implicit_sync, dead_input, stale_binding, rng_during_capture, "
            "first_use_in_capture, rank_divergence",
        ]
    )


GUARDED["test_events"] = """
    import cgguard
    import torch
    from cgguard.testing import simulated_cuda


    def test_events(cgguard_violations):
        assert cgguard_violations == []
        with simulated_cuda(), cgguard.capture_disabled():
            try:
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    pass
            except cgguard.CaptureDisabledError:
                pass
        (event,) = cgguard_violations
        assert ("capture_disabled", "raised", "torch.cuda.graph") == (
            event["rule"], event["action"], event["api"]
        )
        assert {
            "file": __file__,
            "line": 10,
            "function": "test_events",
            "code": "with torch.cuda.graph(torch.cuda.CUDAGraph()):",
        } == event["stack"][-1]
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_violations_fixture_hands_the_events_to_the_test(guarded: Session) -> None:
    """cgguard_violations lists the test's full events; the test judges them, cgguard does not."""
    assert guarded.outcomes("test_events.py") == {"test_events.py::test_events": "passed"}


GUARDED["test_stacks"] = """
    import cgguard
    import pytest
    import torch
    from cgguard.testing import simulated_cuda


    def capture():
        with torch.cuda.graph(torch.cuda.CUDAGraph()):  # line 8
            pass


    def frames(stack):
        return [(frame["function"], frame["line"]) for frame in stack]


    def test_stacks(cgguard_violations):
        with simulated_cuda(), cgguard.capture_disabled():  # line 17
            try:
                capture()  # line 19
            except cgguard.CaptureDisabledError:
                pass
            pytest.raises(cgguard.CaptureDisabledError, capture)
        first, second = cgguard_violations
        assert ([("test_stacks", 19), ("capture", 8)], [("test_stacks", 17)]) == (
            frames(first["stack"]), frames(first["disabled_stack"])
        )
        # A pytest helper the test calls is part of the test's stack, as any library is.
        assert ["test_stacks", "raises", "capture"] == [f["function"] for f in second["stack"]]
"""


@pytest.mark.xdist_group("pytest_plugin-guarded")
def test_event_stacks_start_at_the_test_function(guarded: Session) -> None:
    """Both stacks of an event start at the test: none of pytest's or pluggy's frames above it."""
    assert guarded.outcomes("test_stacks.py") == {"test_stacks.py::test_stacks": "passed"}


IDLE["test_skips"] = """
    def test_skips(cgguard_violations):
        pass
"""


@pytest.mark.xdist_group("pytest_plugin-idle")
def test_violations_fixture_skips_without_cgguard(idle: Session) -> None:
    """Without --cgguard there is nothing to hand over: the test skips and says why."""
    assert idle.outcomes("test_skips.py") == {"test_skips.py::test_skips": "skipped"}
    # The session's only skip, so the only SKIPPED line: this test's.
    idle.stdout.fnmatch_lines(
        ["SKIPPED [[]1[]] *: cgguard is not active: run pytest with --cgguard"]
    )


# Its session must stay free of torch, wrapt and structlog: no scenario there imports them.
IDLE["test_idle"] = f"""
    import sys

    import pytest


    @pytest.mark.cgguard_expect("nested_capture")
    def test_idle():
        assert [] == sorted(m for m in {HEAVY!r} if m in sys.modules)
        import cgguard
        from cgguard import _process

        assert (False, []) == (cgguard.is_installed(), _process.PROCESS.listeners)
"""


@pytest.mark.xdist_group("pytest_plugin-idle")
def test_without_the_option_the_plugin_does_nothing(idle: Session) -> None:
    """No --cgguard: nothing installed, no listener, no dependency loaded; the marker accepted."""
    assert idle.outcomes("test_idle.py") == {"test_idle.py::test_idle": "passed"}


def test_swallowed_violation_passes_without_the_option(pytester: pytest.Pytester) -> None:
    """The same swallowed refusal is no failure when the session runs without --cgguard."""
    pytester.makepyfile(test_swallowed=SWALLOWED)
    run(pytester).assert_outcomes(passed=1)


TRACEBACKS = """
    import cgguard
    import pytest
    import torch
    from cgguard.testing import simulated_cuda


    @pytest.fixture(autouse=True)
    def guarded():
        with simulated_cuda():
            cgguard.install(cgguard.Config(rules={"sync_during_capture": "raise"}))
            try:
                yield
            finally:
                cgguard.uninstall()


    def test_graph():
        with cgguard.capture_disabled():
            with torch.cuda.graph(torch.cuda.CUDAGraph()):  # @graph
                pass


    def test_capture_begin():
        with torch.cuda.stream(torch.cuda.Stream()), cgguard.capture_disabled():
            torch.cuda.CUDAGraph().capture_begin()  # @capture-begin


    def test_stream_synchronize():
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.cuda.current_stream().synchronize()  # @stream-synchronize
"""


def test_a_raised_violation_s_traceback_ends_at_the_user_s_line(
    pytester: pytest.Pytester,
) -> None:
    """pytest's traceback of a refusal shows the test's line last, and none of cgguard's frames."""
    pytester.makepyfile(test_tracebacks=TRACEBACKS)
    result = run(pytester, "--show-capture=no")
    result.assert_outcomes(failed=3)
    for marker, error in (
        ("graph", "CaptureDisabledError"),
        ("capture-begin", "CaptureDisabledError"),
        ("stream-synchronize", "SyncDuringCaptureError"),
    ):
        # The failing line, then its place: the last entry of the traceback is the test's.
        result.stdout.re_match_lines(
            [rf">\s+.*  # @{marker}$", rf"^test_tracebacks\.py:\d+: {error}$"]
        )
    result.stdout.no_fnmatch_line("*cgguard*_capture.py*")


def test_ini_option_turns_the_guard_on(pytester: pytest.Pytester) -> None:
    """``cgguard = true`` in the ini file does what --cgguard does."""
    pytester.makeini("[pytest]\ncgguard = true\n")
    pytester.makepyfile(test_swallowed=SWALLOWED)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["cgguard: capture_disabled violation during the test"])


def test_simulated_session_runs_graph_code_on_cpu(pytester: pytest.Pytester) -> None:
    """--cgguard-simulate-cuda: torch.cuda's graph code runs in every test on a CPU-only build."""
    pytester.makepyfile(
        test_on_cpu="""
        import cgguard
        import torch


        def test_capture_and_replay():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                pass
            graph.replay()


        def test_swallowed():
            with cgguard.capture_disabled():
                try:
                    with torch.cuda.graph(torch.cuda.CUDAGraph()):
                        pass
                except RuntimeError:
                    pass
        """
    )
    result = run(pytester, "--cgguard", "--cgguard-simulate-cuda")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_on_cpu.py::test_swallowed - cgguard: *"])


def test_simulated_session_keeps_the_latest_10000_calls(pytester: pytest.Pytester) -> None:
    """--cgguard-simulate-cuda lasts the whole session: its record of calls keeps the latest
    10,000, so that a long run does not grow without bound."""
    pytester.makepyfile(
        test_soak="""
        import torch
        from cgguard.testing import active_simulation


        def test_replays():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                pass
            for _ in range(20_000):
                graph.replay()
            calls = active_simulation().calls
            assert (len(calls), {call.name for call in calls}) == (10_000, {"replay"})
        """
    )
    run(pytester, "--no-cgguard", "--cgguard-simulate-cuda").assert_outcomes(passed=1)


def test_simulated_session_runs_torch_compile_on_cpu(pytester: pytest.Pytester) -> None:
    """--cgguard-simulate-cuda: a torch.compile'd function on CPU tensors compiles and passes."""
    pytester.makepyfile(
        test_compiled="""
        import math

        import torch


        def test_compiled():
            compiled = torch.compile(lambda t: (t * 3).sin())
            expected = torch.tensor([math.sin(3.0 * x) for x in range(4)])
            torch.testing.assert_close(compiled(torch.arange(4.0)), expected)
        """
    )
    result = run(pytester, "--cgguard", "--cgguard-simulate-cuda")
    result.assert_outcomes(passed=1)


def test_simulate_ini_option_with_no_cgguard_runs_the_simulation_alone(
    pytester: pytest.Pytester,
) -> None:
    """``cgguard_simulate_cuda = true`` with --no-cgguard simulates CUDA and guards nothing,
    and the session's header says so."""
    pytester.makeini("[pytest]\ncgguard_simulate_cuda = true\n")
    pytester.makepyfile(
        test_sim_only="""
        import cgguard
        import torch


        def test_sim_only():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                pass
            graph.replay()
            assert not cgguard.is_installed()
        """
    )
    result = run(pytester, "--no-cgguard")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["cgguard: the guard is off (--no-cgguard); the session runs on the simulated CUDA runtime"]
    )


def test_installation_made_before_the_session_is_kept(pytester: pytest.Pytester) -> None:
    """A conftest's own install() keeps its configuration, stays after the session, still fails."""
    pytester.makeconftest(
        """
        import atexit

        import cgguard

        cgguard.install(cgguard.Config(mode="log"))
        atexit.register(lambda: print("installed at exit:", cgguard.is_installed()))
        """
    )
    pytester.makepyfile(
        test_kept="""
        import cgguard
        import torch
        from cgguard.testing import simulated_cuda


        def test_kept():
            assert cgguard.Config(mode="log") == cgguard.status().config
            with simulated_cuda(), cgguard.capture_disabled():
                with torch.cuda.graph(torch.cuda.CUDAGraph()):  # logged, not raised
                    pass
        """
    )
    result = run(pytester, "--cgguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["capture_disabled (logged): CUDA graph capturing detected*", "installed at exit: True"]
    )


def test_environment_activation_is_kept(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Under CGGUARD_ENABLED=1 the plugin keeps that activation and its configuration."""
    pytester.makepyfile(test_swallowed=SWALLOWED)
    pytester.makeconftest(
        """
        import atexit

        import cgguard

        atexit.register(lambda: print("installed at exit:", cgguard.is_installed()))
        """
    )
    log = tmp_path / "violations.log"
    monkeypatch.setenv("CGGUARD_ENABLED", "1")
    monkeypatch.setenv("CGGUARD_LOG_FILE", str(log))
    result = run(pytester, "--cgguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["cgguard: capture_disabled violation during the test", "installed at exit: True"]
    )
    # The activation's own configuration: its log file got the violation and its exit summary,
    # and the census of the capture that went ahead.
    expected = ["cgguard.capture_violation", "cgguard.summary", "cgguard.census"]
    assert expected == [json.loads(line)["event"] for line in log.read_text().splitlines()]


def test_environment_activation_starts_a_session_that_treats_warnings_as_errors(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CGGUARD_ENABLED=1 imports cgguard before pytest: that must not warn that it can't rewrite."""
    pytester.makeini("[pytest]\nfilterwarnings = error\n")
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    monkeypatch.setenv("CGGUARD_ENABLED", "1")
    run(pytester).assert_outcomes(passed=1)


LEFT_ON_THE_SIMULATION = """
    import torch
    from cgguard.testing import active_simulation


    def test_enters_a_capture_and_never_leaves():
        torch.cuda.graph(torch.cuda.CUDAGraph()).__enter__()  # line 6


    def test_starts_on_a_clean_runtime():
        assert (torch.cuda.default_stream(), []) == (
            torch.cuda.current_stream(), active_simulation().active_captures()
        )
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
"""


def test_a_capture_left_open_on_the_session_s_simulation_is_ended_there(
    pytester: pytest.Pytester,
) -> None:
    """--cgguard-simulate-cuda: the simulated runtime ends a capture a test left open, and the
    test's thread is back on the default stream for the next test."""
    pytester.makepyfile(test_left_on_the_simulation=LEFT_ON_THE_SIMULATION)
    result = run(pytester, "--cgguard", "--cgguard-simulate-cuda")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_enters_a_capture_and_never_leaves*",
            "cgguard: a capture begun during this test was still open after its teardown",
            "",
            "torch.cuda.graph (global mode) on thread 'MainThread' (*), begun at "
            "(most recent call last):",
            '  File "*test_left_on_the_simulation.py", line 6, in '
            "test_enters_a_capture_and_never_leaves",
            "    torch.cuda.graph(torch.cuda.CUDAGraph()).__enter__()  # line 6",
            "",
            "cgguard no longer counts it as open, so the tests after this one do not run inside "
            "it; the simulated CUDA runtime has dropped it too. End every capture in the test "
            "that begins it: leave its torch.cuda.graph block, or call capture_end().",
        ],
        consecutive=True,
    )


BROKEN_TEARDOWN = """
    import cgguard
    import pytest
    import torch
    from cgguard.testing import active_simulation


    @pytest.fixture
    def breaks_at_teardown():
        yield
        raise RuntimeError("teardown broke")


    def test_leaves_a_capture_and_a_change(breaks_at_teardown):
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.CUDAGraph().capture_begin()  # line 15
        cgguard.install(cgguard.Config(mode="log"))


    @pytest.mark.xfail(reason="fails inside its capture", strict=True)
    def test_fails_inside_a_capture():
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.CUDAGraph().capture_begin()
        raise AssertionError("inside the capture")


    def test_starts_clean_and_guarded():
        assert ("raise", []) == (
            cgguard.status().config.mode, active_simulation().active_captures()
        )
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
"""


def test_a_teardown_that_fails_still_cleans_up_and_says_what_the_test_left(
    pytester: pytest.Pytester,
) -> None:
    """A test whose own teardown fails keeps that error, with what it left open and changed as a
    cgguard section; an xfailed test's open capture is not judged; both are cleaned up."""
    pytester.makepyfile(test_broken_teardown=BROKEN_TEARDOWN)
    result = run(pytester, "--cgguard", "--cgguard-simulate-cuda")
    result.assert_outcomes(passed=2, errors=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaves_a_capture_and_a_change*",
            "E * RuntimeError: teardown broke",
            "*- cgguard -*",
            "cgguard: a capture begun during this test was still open after its teardown",
            "",
            "CUDAGraph.capture_begin (global mode) on thread 'MainThread' (*), begun at "
            "(most recent call last):",
            '  File "*test_broken_teardown.py", line 15, in test_leaves_a_capture_and_a_change',
            "    torch.cuda.CUDAGraph().capture_begin()  # line 15",
            "",
            "cgguard no longer counts it as open, *; the simulated CUDA runtime has dropped it "
            "too. End every capture *",
            "",
            "cgguard: this test changed cgguard's configuration (mode: 'raise' -> 'log'); the "
            "plugin put the session's configuration back for the tests after it",
        ]
    )
    result.stdout.no_fnmatch_line("*test_fails_inside_a_capture*still open*")


CHANGES = """
    import cgguard
    import torch
    from cgguard.testing import simulated_cuda


    def swallow_a_refusal():
        with simulated_cuda(), cgguard.capture_disabled():
            try:
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    pass
            except RuntimeError:
                pass


    def test_uninstalls():
        cgguard.uninstall()


    def test_guarded_after_an_uninstall():
        swallow_a_refusal()


    def test_turns_a_rule_off():
        cgguard.install(cgguard.Config(rules={"capture_disabled": "off"}))


    def test_guarded_after_a_rule_was_turned_off():
        swallow_a_refusal()


    def test_puts_the_configuration_back_itself():
        session = cgguard.status().config
        cgguard.install(cgguard.Config(mode="log"))
        cgguard.install(session)
"""

UNINSTALLED = (
    "cgguard: this test uninstalled cgguard; the plugin installed it again, with the "
    "session's configuration, for the tests after it"
)
RECONFIGURED = (
    "cgguard: this test changed cgguard's configuration (rules: {} -> "
    "{'capture_disabled': 'off'}); the plugin put the session's configuration back for the "
    "tests after it"
)

# The tests after those that changed cgguard are guarded by the session's installation again.
GUARDED_AGAIN = [
    "FAILED test_changes.py::test_guarded_after_an_uninstall - cgguard: *",
    "FAILED test_changes.py::test_guarded_after_a_rule_was_turned_off - cgguard: *",
]


def test_a_test_that_changes_the_installation_is_named_and_the_session_s_is_restored(
    pytester: pytest.Pytester,
) -> None:
    """A test that uninstalls or reconfigures cgguard gets a warning saying so; the tests after
    it run under the session's installation again."""
    pytester.makepyfile(test_changes=CHANGES)
    result = run(pytester, "--cgguard")
    result.assert_outcomes(passed=3, failed=2, warnings=2)
    result.stdout.fnmatch_lines(GUARDED_AGAIN)
    # Each warning under the name of the test that changed cgguard, at that test's line.
    result.stdout.fnmatch_lines(
        [
            "*= warnings summary =*",
            "test_changes.py::test_uninstalls",
            f"  test_changes.py:15: InstallationChangedWarning: {UNINSTALLED}",
            "    def test_uninstalls():",
            "",
            "test_changes.py::test_turns_a_rule_off",
            f"  test_changes.py:23: InstallationChangedWarning: {RECONFIGURED}",
            "    def test_turns_a_rule_off():",
            "",
            "-- Docs: *",
        ],
        consecutive=True,
    )


def test_the_installation_warning_as_an_error_errors_the_test(
    pytester: pytest.Pytester,
) -> None:
    """Turned into an error (-W error::...), the warning errors the test that changed cgguard
    at its teardown, and the tests after it still run under the session's installation."""
    pytester.makepyfile(test_changes=CHANGES)
    warning = "cgguard.pytest_plugin.InstallationChangedWarning"
    result = run(pytester, "--cgguard", "-W", f"error::{warning}")
    result.assert_outcomes(passed=3, failed=2, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*_ ERROR at teardown of test_uninstalls _*",
            "",
            f"E   {warning}: {UNINSTALLED}",
            "All traceback entries are hidden.*",
            "*_ ERROR at teardown of test_turns_a_rule_off _*",
            "",
            f"E   {warning}: {RECONFIGURED}",
            "All traceback entries are hidden.*",
        ],
        consecutive=True,
    )
    result.stdout.fnmatch_lines(GUARDED_AGAIN)


def test_a_violation_s_names_are_shown_safe_in_the_test_s_report(
    pytester: pytest.Pytester,
) -> None:
    """A capture made from code whose file name holds terminal escapes: the failing test's
    report shows them escaped, in its message as in its stacks, never raw."""
    pytester.makepyfile(
        test_hostile="""
        import cgguard
        import torch
        from cgguard.testing import simulated_cuda

        SOURCE = "def kernel(graph):\\n    with torch.cuda.graph(graph):\\n        pass\\n"
        namespace = {"torch": torch}
        exec(compile(SOURCE, "plugin\\x1b]0;pwned\\x07.py", "exec"), namespace)


        def test_hostile():
            with simulated_cuda(), cgguard.capture_disabled():
                try:
                    namespace["kernel"](torch.cuda.CUDAGraph())
                except RuntimeError:
                    pass
        """
    )
    result = run(pytester, "--cgguard")
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert ("\x1b" in output, "plugin\\x1b]0;pwned\\x07.py:2 (in kernel)" in output) == (
        False,
        True,
    )


INSPECTED = """
import torch


def test_item_in_capture():
    x = torch.arange(3.0)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        y = x * 2
        try:
            y.sum().item()
        except RuntimeError:
            pass


def test_clean_capture():
    x = torch.arange(3.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
    graph.replay()
"""


def test_inspected_simulated_session_fails_a_test_that_calls_item_in_a_capture(
    pytester: pytest.Pytester,
) -> None:
    """--cgguard-inspect on the simulation: a CPU-only session fails the test whose captured
    code calls .item(), and passes the clean one; without the option both pass."""
    pytester.makepyfile(test_inspected=INSPECTED)
    run(pytester, "--cgguard", "--cgguard-simulate-cuda").assert_outcomes(passed=2)
    result = run(pytester, "--cgguard", "--cgguard-simulate-cuda", "--cgguard-inspect")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_inspected.py::test_item_in_capture - cgguard: *"])


def test_inspect_ini_option_and_its_need_of_cgguard(pytester: pytest.Pytester) -> None:
    """cgguard_inspect in the ini file does what --cgguard-inspect does; alone, without
    --cgguard, it is a usage error naming what it needs, as cgguard_simulate_cuda is."""
    pytester.makepyfile(test_inspected=INSPECTED)
    pytester.makeini("[pytest]\ncgguard_inspect = true\ncgguard_simulate_cuda = true\n")
    run(pytester, "--cgguard").assert_outcomes(passed=1, failed=1)
    refused = run(pytester)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(
        [
            "ERROR: --cgguard-simulate-cuda (or cgguard_simulate_cuda) and --cgguard-inspect (or "
            "cgguard_inspect) need --cgguard (or cgguard = true) to guard the session, or "
            "--no-cgguard to run it unguarded"
        ]
    )


def test_each_option_that_says_how_to_guard_needs_the_switch(pytester: pytest.Pytester) -> None:
    """--cgguard-simulate-cuda alone is the usage error --cgguard-inspect alone is: neither
    switches the guard on by itself, and neither is ignored."""
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    outcomes = {}
    for option in ("--cgguard-simulate-cuda", "--cgguard-inspect"):
        refused = run(pytester, option)
        outcomes[option] = (refused.ret, refused.stderr.lines[0])
    needs = (
        "needs --cgguard (or cgguard = true) to guard the session, or --no-cgguard to run it "
        "unguarded"
    )
    assert {
        "--cgguard-simulate-cuda": (
            pytest.ExitCode.USAGE_ERROR,
            f"ERROR: --cgguard-simulate-cuda (or cgguard_simulate_cuda) {needs}",
        ),
        "--cgguard-inspect": (
            pytest.ExitCode.USAGE_ERROR,
            f"ERROR: --cgguard-inspect (or cgguard_inspect) {needs}",
        ),
    } == outcomes


def test_no_cgguard_switches_off_the_ini_s_guard_and_its_inspection(
    pytester: pytest.Pytester,
) -> None:
    """--no-cgguard wins over ``cgguard = true`` and --cgguard, and over inspection, which is
    part of the guard; the simulation asked for stays, so the tests still run."""
    pytester.makeini(
        "[pytest]\ncgguard = true\ncgguard_inspect = true\ncgguard_simulate_cuda = true\n"
    )
    pytester.makepyfile(
        test_off="""
        import cgguard
        import torch


        def test_swallowed_and_an_item():
            x = torch.arange(3.0)
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                (x * 2).sum().item()
            with cgguard.capture_disabled():
                try:
                    with torch.cuda.graph(torch.cuda.CUDAGraph()):
                        pass
                except RuntimeError:
                    pass
            assert not cgguard.is_installed()


        def test_takes_the_events(cgguard_violations):
            pass
        """
    )
    result = run(pytester, "--cgguard", "--no-cgguard")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "cgguard: the guard is off (--no-cgguard); the session runs on the simulated CUDA "
            "runtime",
            "SKIPPED [[]1[]] *: cgguard is switched off by --no-cgguard",
        ]
    )


def test_a_bad_ini_value_names_the_option_and_what_it_accepts(pytester: pytest.Pytester) -> None:
    """A cgguard ini option that is no boolean is one line naming it, its value and the
    accepted ones."""
    pytester.makeini("[pytest]\ncgguard_simulate_cuda = maybe\n")
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    refused = run(pytester)
    expected = (
        pytest.ExitCode.USAGE_ERROR,
        [
            "ERROR: ini option cgguard_simulate_cuda: invalid truth value 'maybe'; accepted "
            "values are true or false (as text also yes/no, on/off, 1/0)"
        ],
    )
    assert expected == (refused.ret, [line for line in refused.stderr.lines if line])


INSPECTED_UNCAUGHT = """
import torch


def test_item_uncaught():
    x = torch.arange(3.0)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        y = x * 2
        y.sum().item()
"""


def test_an_inspected_failure_ends_at_the_test_s_line(pytester: pytest.Pytester) -> None:
    """An .item() refused by inspection fails its test at the test's line: no torch frame or
    dispatch mode between that line and the error, and the message shown once."""
    pytester.makepyfile(test_uncaught_item=INSPECTED_UNCAUGHT)
    result = run(pytester, "--cgguard", "--cgguard-simulate-cuda", "--cgguard-inspect")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    def test_item_uncaught():",
            "        x = torch.arange(3.0)",
            "        with torch.cuda.graph(torch.cuda.CUDAGraph()):",
            "            y = x * 2",
            ">           y.sum().item()",
            "E           cgguard.ImplicitSyncError: Implicit synchronize during CUDA graph "
            "capture: aten::_local_scalar_dense at *test_uncaught_item.py:8 *",
            "",
            "test_uncaught_item.py:8: ImplicitSyncError",
            "*- cgguard -*",
            "cgguard: implicit_sync violation during the test",
            "",
            "implicit_sync (raised): the exception above",
            "The synchronizing operation was called at (most recent call last):",
            '  File "*test_uncaught_item.py", line 8, in test_item_uncaught',
            "    y.sum().item()",
        ],
        consecutive=True,
    )
    for hidden in ("*torch/_*", "*InspectionMode*", "*Captured stderr*", "*cgguard/_*"):
        result.stdout.no_fnmatch_line(hidden)
