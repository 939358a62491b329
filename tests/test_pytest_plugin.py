"""The pytest plugin: ``pytest --cgguard`` fails a test during which a capture violation occurs.

Each session here is a real pytest subprocess (pytester): the plugin installs cgguard, patches
torch and keeps global state, none of which may leak into this session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

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
    """pytest in a subprocess, with the repository's strictness, on the files made here."""
    return pytester.runpytest_subprocess("--strict-markers", "--strict-config", "-rA", *args)


def test_importing_the_plugin_loads_neither_torch_nor_wrapt_nor_structlog() -> None:
    """Every pytest run imports the plugin: it loads no dependency and no other cgguard module."""
    code = (
        "import sys, cgguard.pytest_plugin\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "print(sorted(m for m in sys.modules if m.startswith('cgguard')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    expected = (0, "[]\n['cgguard', 'cgguard.pytest_plugin']\n", "")
    assert expected == (done.returncode, done.stdout, done.stderr)


def test_swallowed_violation_fails_the_test_with_its_report(pytester: pytest.Pytester) -> None:
    """A refusal the test catches still fails it; the report shows the rule and both stacks."""
    pytester.makepyfile(test_swallowed=SWALLOWED)
    result = run(pytester, "--cgguard")
    result.assert_outcomes(failed=1)
    # Consecutive: pytest's and pluggy's frames are cut, so the test's line comes first.
    result.stdout.fnmatch_lines(
        [
            "*_ test_swallowed _*",
            "cgguard: capture_disabled violation during the test",
            "",
            "capture_disabled (raised): CUDA graph capturing detected at an inappropriate time. "
            "This operation is currently disabled. torch.cuda.graph at *test_swallowed.py:11 "
            "(in test_swallowed) began a capture; capture was disabled at "
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
    result.stdout.fnmatch_lines(
        ["FAILED test_swallowed.py::test_swallowed - cgguard: capture_disabled*"]
    )


def test_uncaught_violation_keeps_its_traceback_and_adds_the_report(
    pytester: pytest.Pytester,
) -> None:
    """A test already failing with the refusal keeps that failure; the report is a section of it."""
    pytester.makepyfile(
        test_uncaught="""
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
    )
    result = run(pytester, "--cgguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E * cgguard._errors.CaptureDisabledError: CUDA graph capturing detected*",
            "*- cgguard -*",
            "cgguard: capture_disabled violation during the test",
            "FAILED test_uncaught.py::test_uncaught - cgguard._errors.CaptureDisabledError*",
        ]
    )


def test_repeated_violation_is_reported_once_with_its_count(pytester: pytest.Pytester) -> None:
    """The same refusal three times in a loop is one block saying how many times it happened."""
    pytester.makepyfile(
        test_repeated="""
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
    )
    result = run(pytester, "--cgguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "cgguard: 3 violations (capture_disabled) during the test",
            "",
            "capture_disabled (raised, 3 times): CUDA graph capturing detected*",
        ],
        consecutive=True,
    )
    # In the failure's report; the short summary may repeat it (untruncated when CI is set).
    report = result.stdout.str().split("short test summary info")[0]
    assert report.count("capture_disabled (raised") == 1


def test_violation_in_a_fixture_errors_the_test_at_setup(pytester: pytest.Pytester) -> None:
    """A fixture that swallows a refusal errors its test at setup, as a failing fixture does."""
    pytester.makepyfile(
        test_fixture_setup="""
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
    )
    result = run(pytester, "--cgguard")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_uses_graph*",
            "cgguard: capture_disabled violation during setup",
        ]
    )


def test_clean_captures_pass(pytester: pytest.Pytester) -> None:
    """Captures that break no rule leave the test passing."""
    pytester.makepyfile(
        test_clean="""
        import torch
        from cgguard.testing import simulated_cuda


        def test_clean():
            with simulated_cuda():
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    pass
                graph.replay()
        """
    )
    run(pytester, "--cgguard").assert_outcomes(passed=1)


def test_expected_rule_that_occurs_passes(pytester: pytest.Pytester) -> None:
    """cgguard_expect names the rule the test breaks on purpose: the test passes."""
    pytester.makepyfile(
        test_expected="""
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
    )
    run(pytester, "--cgguard").assert_outcomes(passed=1)


def test_expected_rule_that_does_not_occur_fails(pytester: pytest.Pytester) -> None:
    """A test whose expected violation never happens fails, naming the missing rule."""
    pytester.makepyfile(
        test_missing="""
        import pytest


        @pytest.mark.cgguard_expect("nested_capture")
        def test_missing():
            pass
        """
    )
    result = run(pytester, "--cgguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_missing _*",
            "cgguard: expected nested_capture violation did not occur "
            "(@pytest.mark.cgguard_expect)",
        ],
        consecutive=True,
    )


def test_unexpected_rule_fails_next_to_an_expected_one(pytester: pytest.Pytester) -> None:
    """Expecting nested_capture excuses that rule only: a capture_disabled still fails the test."""
    pytester.makepyfile(
        test_mixed="""
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
    )
    result = run(pytester, "--cgguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*_ test_mixed _*", "cgguard: capture_disabled violation during the test"],
        consecutive=True,
    )
    result.stdout.no_fnmatch_line("nested_capture (raised*")


def test_unknown_rule_in_the_marker_is_an_error(pytester: pytest.Pytester) -> None:
    """A misspelt rule in cgguard_expect errors the test at setup and lists the rules."""
    pytester.makepyfile(
        test_typo="""
        import pytest


        @pytest.mark.cgguard_expect("nested")
        def test_typo():
            pass
        """
    )
    result = run(pytester, "--cgguard")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "cgguard_expect: unknown rule(s) 'nested'; the rules are capture_disabled, "
            "nested_capture, concurrent_capture, sync_during_capture",
        ]
    )


def test_violations_fixture_hands_the_events_to_the_test(pytester: pytest.Pytester) -> None:
    """cgguard_violations lists the test's full events; the test judges them, cgguard does not."""
    pytester.makepyfile(
        test_events="""
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
    )
    run(pytester, "--cgguard").assert_outcomes(passed=1)


def test_violations_fixture_skips_without_cgguard(pytester: pytest.Pytester) -> None:
    """Without --cgguard there is nothing to hand over: the test skips and says why."""
    pytester.makepyfile(
        test_skips="""
        def test_skips(cgguard_violations):
            pass
        """
    )
    result = run(pytester)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]1[]] *: cgguard is not active: run pytest with --cgguard"]
    )


def test_without_the_option_the_plugin_does_nothing(pytester: pytest.Pytester) -> None:
    """No --cgguard: nothing installed, no listener, no dependency loaded; the marker accepted."""
    pytester.makepyfile(
        test_idle=f"""
        import sys

        import pytest


        @pytest.mark.cgguard_expect("nested_capture")
        def test_idle():
            assert [] == sorted(m for m in {HEAVY!r} if m in sys.modules)
            import cgguard
            from cgguard import _state

            assert (False, []) == (cgguard.is_installed(), _state.listeners)
        """
    )
    run(pytester).assert_outcomes(passed=1)


def test_swallowed_violation_passes_without_the_option(pytester: pytest.Pytester) -> None:
    """The same swallowed refusal is no failure when the session runs without --cgguard."""
    pytester.makepyfile(test_swallowed=SWALLOWED)
    run(pytester).assert_outcomes(passed=1)


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


def test_simulate_ini_option_without_the_guard(pytester: pytest.Pytester) -> None:
    """``cgguard_simulate_cuda = true`` alone simulates CUDA and guards nothing."""
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
    run(pytester).assert_outcomes(passed=1)


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
        from cgguard import _state
        from cgguard.testing import simulated_cuda


        def test_kept():
            assert cgguard.Config(mode="log") == _state.config
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
    # The activation's own configuration: its log file got the violation and its exit summary.
    expected = ["cgguard.capture_violation", "cgguard.summary"]
    assert expected == [json.loads(line)["event"] for line in log.read_text().splitlines()]


def test_environment_activation_starts_a_session_that_treats_warnings_as_errors(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CGGUARD_ENABLED=1 imports cgguard before pytest: that must not warn that it can't rewrite."""
    pytester.makeini("[pytest]\nfilterwarnings = error\n")
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    monkeypatch.setenv("CGGUARD_ENABLED", "1")
    run(pytester).assert_outcomes(passed=1)
