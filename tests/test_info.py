"""cgguard._commands.info: the configuration ``cgguard info`` prints, read from a mapping."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
from helpers import DEFAULT_CONFIGURATION

from cgguard._commands.info import _configuration

if TYPE_CHECKING:
    from pathlib import Path


def test_configuration_shows_unknown_variables_and_cut_values() -> None:
    """Unknown CGGUARD_* names and bad values are warning lines, long values cut to 200."""
    environ = {"CGGUARD_MOD": "log", "CGGUARD_CAPTURE": "x" * 10_000, "CGGUARD_ENABLED": "1"}
    expected = [
        "  enabled        1            (CGGUARD_ENABLED)",
        *DEFAULT_CONFIGURATION,
        f"  warning: ignoring CGGUARD_CAPTURE='{'x' * 199}... (10000 characters): "
        "accepted values are enabled, disabled; using as it is (enabled at start)",
        "  warning: ignoring CGGUARD_MOD: no such variable; did you mean CGGUARD_MODE?",
    ]
    assert expected == _configuration(environ)


def test_configuration_names_the_variable_a_value_follows() -> None:
    """A rule that takes the mode, and the target that takes the log file, name that variable."""
    environ = {
        "CGGUARD_MODE": "log",
        "CGGUARD_LOG_FILE": "events.log",
        "CGGUARD_RULE_NESTED_CAPTURE": "raise",
    }
    expected = [
        "  enabled        (unset)      (CGGUARD_ENABLED)",
        "  mode           log          (CGGUARD_MODE)",
        "  log_format     json, or console when stderr is a terminal (default)",
        "  log_file       events.log   (CGGUARD_LOG_FILE)",
        "  log_target     file         (from CGGUARD_LOG_FILE)",
        "  log_level      debug        (default)",
        "  report         none         (default)",
        "  capture        as it is (enabled at start) (default)",
        "  simulate_cuda  False        (default)",
        "  vllm_bridge    True         (default)",
        "  exempt         none         (default)",
        "  exempt_file    none         (default)",
        "  window         none         (default)",
        "  profiles       log          (default)",
        "  profile        vllm: vLLM Model Runner V2, 2 windows, 3 exemptions",
        "  profile        sglang: SGLang, 6 windows, 8 exemptions",
        "  profile        tensorrt_llm: TensorRT-LLM (PyTorch backend), 2 windows, 0 exemptions",
        "  inspect        False        (default)",
        "  inspect_first  every capture of each site (default)",
        "  census         True         (default)",
        "  census_replays False        (default)",
        "  metrics        none         (default)",
        "  manifest       True         (default)",
        "  rank_check     False        (default)",
        "  rule           capture_disabled: log (from CGGUARD_MODE)",
        "  rule           nested_capture: raise (CGGUARD_RULE_NESTED_CAPTURE)",
        # The diagnostics log whatever the mode: their default is their own.
        "  rule           concurrent_capture: log (default)",
        "  rule           sync_during_capture: log (default)",
        "  rule           abandoned_capture: log (default)",
        "  rule           implicit_sync: log (from CGGUARD_MODE)",
        "  rule           dead_input: log (from CGGUARD_MODE)",
        "  rule           stale_binding: log (from CGGUARD_MODE)",
        "  rule           rng_during_capture: log (from CGGUARD_MODE)",
        "  rule           first_use_in_capture: log (default)",
        "  rule           rank_divergence: log (default)",
    ]
    assert expected == _configuration(environ)


@pytest.mark.subprocess
def test_the_activation_check_writes_no_report_or_log(tmp_path: Path) -> None:
    """cgguard info's check child neither replaces the configured report nor logs to its file."""
    import io

    from cgguard._commands.info import report

    held = tmp_path / "report.json"
    held.write_text('{"violations": ["the run\'s"]}\n')
    log = tmp_path / "events.jsonl"
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CGGUARD_")},
        "CGGUARD_REPORT": str(held),
        "CGGUARD_LOG_FILE": str(log),
    }
    report(environ, io.StringIO())
    assert (held.read_text(), log.exists()) == ('{"violations": ["the run\'s"]}\n', False)
