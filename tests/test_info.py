"""cgguard._info: the configuration ``cgguard info`` prints, read from a mapping in-process."""

from __future__ import annotations

from cgguard._info import _configuration


def test_configuration_shows_unknown_variables_and_cut_values() -> None:
    """Unknown CGGUARD_* names and bad values are warning lines, long values cut to 200."""
    environ = {"CGGUARD_MOD": "log", "CGGUARD_CAPTURE": "x" * 10_000, "CGGUARD_ENABLED": "1"}
    expected = [
        "  enabled        1            (CGGUARD_ENABLED)",
        "  mode           raise        (default)",
        "  log_format     json, or console when stderr is a terminal (default)",
        "  log_file       none         (default)",
        "  log_target     stderr       (default)",
        "  report         none         (default)",
        "  capture        as it is (enabled at start) (default)",
        "  simulate_cuda  False        (default)",
        "  vllm_bridge    True         (default)",
        "  rule           capture_disabled: raise (default)",
        "  rule           nested_capture: raise (default)",
        "  rule           concurrent_capture: log (default)",
        "  rule           sync_during_capture: log (default)",
        "  rule           abandoned_capture: log (default)",
        f"  warning: ignoring CGGUARD_CAPTURE='{'x' * 199}... (10000 characters): "
        "accepted values are enabled, disabled",
        "  warning: ignoring CGGUARD_MOD: no such variable; did you mean CGGUARD_MODE?",
    ]
    assert expected == _configuration(environ)
