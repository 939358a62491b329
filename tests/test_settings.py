"""cgguard._settings: each setting, its CGGUARD_* variable and spellings; a cheap start-up path."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cgguard import _settings
from cgguard._rules import ACTIONS

TRUE_SPELLINGS = ["1", "true", "yes", "on", "TRUE", "Yes", "oN", " on ", "\ttrue\n"]
FALSE_SPELLINGS = ["0", "false", "no", "off", "FALSE", "No", "oFf", " 0 ", "\tno\n"]


@pytest.mark.parametrize("raw", TRUE_SPELLINGS)
def test_parse_bool_true_spellings(raw: str) -> None:
    """1/true/yes/on, in any case and with surrounding whitespace, parse as True."""
    assert _settings.parse_bool(raw) is True


@pytest.mark.parametrize("raw", FALSE_SPELLINGS)
def test_parse_bool_false_spellings(raw: str) -> None:
    """0/false/no/off, in any case and with surrounding whitespace, parse as False."""
    assert _settings.parse_bool(raw) is False


@pytest.mark.parametrize("raw", ["", " ", "2", "-1", "enable", "y", "n", "truee", "o n"])
def test_parse_bool_other_spellings_are_none(raw: str) -> None:
    """Anything but the accepted spellings parses as None, not as a guess."""
    assert _settings.parse_bool(raw) is None


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"CGGUARD_ENABLED": ""}, None),
        ({"CGGUARD_ENABLED": "1"}, True),
        ({"CGGUARD_ENABLED": " Yes "}, True),
        ({"CGGUARD_ENABLED": "0"}, False),
        ({"CGGUARD_ENABLED": "OFF"}, False),
        ({"CGGUARD_ENABLED": "maybe"}, None),
    ],
)
def test_is_enabled(environ: dict[str, str], expected: bool | None) -> None:
    """CGGUARD_ENABLED reads True/False for boolean spellings, None when unset, empty or unknown."""
    assert expected is _settings.is_enabled(environ)


def test_read_every_variable() -> None:
    """read() returns each Config field set, the variable it came from, and no problems."""
    environ = {
        "CGGUARD_MODE": "log",
        "CGGUARD_LOG_FORMAT": "console",
        "CGGUARD_LOG_FILE": "/var/log/cgguard.jsonl",
        "CGGUARD_LOG_TARGET": "stderr",
        "CGGUARD_REPORT": "/var/log/cgguard-{pid}.json",
        "CGGUARD_CAPTURE": "disabled",
        "CGGUARD_SIMULATE_CUDA": "1",
        "CGGUARD_VLLM_BRIDGE": "off",
        "CGGUARD_RULE_CAPTURE_DISABLED": "raise",
        "CGGUARD_RULE_NESTED_CAPTURE": "off",
        "CGGUARD_RULE_CONCURRENT_CAPTURE": "log",
        "CGGUARD_RULE_SYNC_DURING_CAPTURE": "raise",
    }
    expected: tuple[dict[str, object], dict[str, str], list[str]] = (
        {
            "mode": "log",
            "log_format": "console",
            "log_file": "/var/log/cgguard.jsonl",
            "log_target": "stderr",
            "report": "/var/log/cgguard-{pid}.json",
            "capture": "disabled",
            "simulate_cuda": True,
            "vllm_bridge": False,
            "rules": {
                "capture_disabled": "raise",
                "nested_capture": "off",
                "concurrent_capture": "log",
                "sync_during_capture": "raise",
            },
        },
        {
            "mode": "CGGUARD_MODE",
            "log_format": "CGGUARD_LOG_FORMAT",
            "log_file": "CGGUARD_LOG_FILE",
            "log_target": "CGGUARD_LOG_TARGET",
            "report": "CGGUARD_REPORT",
            "capture": "CGGUARD_CAPTURE",
            "simulate_cuda": "CGGUARD_SIMULATE_CUDA",
            "vllm_bridge": "CGGUARD_VLLM_BRIDGE",
            "rules.capture_disabled": "CGGUARD_RULE_CAPTURE_DISABLED",
            "rules.nested_capture": "CGGUARD_RULE_NESTED_CAPTURE",
            "rules.concurrent_capture": "CGGUARD_RULE_CONCURRENT_CAPTURE",
            "rules.sync_during_capture": "CGGUARD_RULE_SYNC_DURING_CAPTURE",
        },
        [],
    )
    assert expected == _settings.read(environ)


def test_read_mixed_mapping() -> None:
    """read() folds case and spaces, skips empty and foreign variables, and lists bad values."""
    environ = {
        "CGGUARD_MODE": " LOG ",
        "CGGUARD_LOG_FORMAT": "",
        "CGGUARD_LOG_FILE": " Events Here.log ",
        "CGGUARD_LOG_TARGET": " FILE ",
        "CGGUARD_REPORT": " ",
        "CGGUARD_CAPTURE": "sometimes",
        "CGGUARD_SIMULATE_CUDA": "Off",
        "CGGUARD_VLLM_BRIDGE": "",
        "CGGUARD_RULE_NESTED_CAPTURE": " Log ",
        "CGGUARD_RULE_CAPTURE_DISABLED": "",
        "CGGUARD_ENABLED": "1",
        "HOME": "/root",
    }
    expected: tuple[dict[str, object], dict[str, str], list[str]] = (
        {
            "mode": "log",
            "log_file": " Events Here.log ",
            "log_target": "file",
            "simulate_cuda": False,
            "rules": {"nested_capture": "log"},
        },
        {
            "mode": "CGGUARD_MODE",
            "log_file": "CGGUARD_LOG_FILE",
            "log_target": "CGGUARD_LOG_TARGET",
            "simulate_cuda": "CGGUARD_SIMULATE_CUDA",
            "rules.nested_capture": "CGGUARD_RULE_NESTED_CAPTURE",
        },
        ["ignoring CGGUARD_CAPTURE='sometimes': accepted values are enabled, disabled"],
    )
    assert expected == _settings.read(environ)


def test_read_bad_boolean_and_bad_choice() -> None:
    """Each rejected value is one problem line, in variable order, naming the accepted values."""
    environ = {
        "CGGUARD_RULE_SYNC_DURING_CAPTURE": "silent",
        "CGGUARD_VLLM_BRIDGE": "auto",
        "CGGUARD_SIMULATE_CUDA": "maybe",
        "CGGUARD_RULE_CAPTURE_DISABLED": "warn",
        "CGGUARD_LOG_TARGET": "syslog",
        "CGGUARD_MODE": "rase",
    }
    expected: tuple[dict[str, object], dict[str, str], list[str]] = (
        {},
        {},
        [
            "ignoring CGGUARD_MODE='rase': accepted values are raise, log",
            "ignoring CGGUARD_LOG_TARGET='syslog': accepted values are stderr, file, logging",
            "ignoring CGGUARD_SIMULATE_CUDA='maybe': "
            "accepted values are 1/true/yes/on or 0/false/no/off",
            "ignoring CGGUARD_VLLM_BRIDGE='auto': "
            "accepted values are 1/true/yes/on or 0/false/no/off",
            "ignoring CGGUARD_RULE_CAPTURE_DISABLED='warn': accepted values are raise, log, off",
            "ignoring CGGUARD_RULE_SYNC_DURING_CAPTURE='silent': "
            "accepted values are raise, log, off",
        ],
    )
    assert expected == _settings.read(environ)


def test_rule_variables_name_every_rule() -> None:
    """Each rule has its variable CGGUARD_RULE_<RULE>, and each takes raise, log or off."""
    expected = (
        {
            "CGGUARD_RULE_CAPTURE_DISABLED": "capture_disabled",
            "CGGUARD_RULE_NESTED_CAPTURE": "nested_capture",
            "CGGUARD_RULE_CONCURRENT_CAPTURE": "concurrent_capture",
            "CGGUARD_RULE_SYNC_DURING_CAPTURE": "sync_during_capture",
            "CGGUARD_RULE_ABANDONED_CAPTURE": "abandoned_capture",
        },
        ("raise", "log", "off"),
    )
    assert expected == (_settings.RULE_VARIABLES, ACTIONS)


def _modules_after(code: str) -> set[str]:
    """The names in sys.modules at the end of a fresh interpreter running ``code``."""
    script = f"{code}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return set(result.stdout.split())


@pytest.mark.subprocess
def test_import_adds_no_heavy_modules() -> None:
    """Importing cgguard._settings loads only it, the rule table and the exceptions: no typing."""
    bare = _modules_after("pass")
    imported = _modules_after("import cgguard._settings")
    assert {"cgguard", "cgguard._settings", "cgguard._rules", "cgguard._errors"} == imported - bare


def test_misspelt_rule_variable_is_reported() -> None:
    """A CGGUARD_RULE_ variable that names no rule is a problem line, not a silent no-op."""
    values, sources, problems = _settings.read({"CGGUARD_RULE_NESTED": "off"})
    assert (values, sources) == ({}, {})
    assert problems == [
        "ignoring CGGUARD_RULE_NESTED: no such rule; the rule variables are "
        "CGGUARD_RULE_CAPTURE_DISABLED, CGGUARD_RULE_NESTED_CAPTURE, "
        "CGGUARD_RULE_CONCURRENT_CAPTURE, CGGUARD_RULE_SYNC_DURING_CAPTURE, "
        "CGGUARD_RULE_ABANDONED_CAPTURE"
    ]


def test_the_pth_line_spells_off_as_the_parser_does() -> None:
    """cgguard.pth skips every import for the values the parser reads as off (and for unset)."""
    import ast
    from pathlib import Path

    line = (Path(__file__).resolve().parent.parent / "cgguard.pth").read_text()
    (compare,) = [n for n in ast.walk(ast.parse(line)) if isinstance(n, ast.Compare)]
    skipped = ast.literal_eval(compare.comparators[0])
    assert skipped == ("", *_settings.FALSE)


def test_runner_options_are_the_settings() -> None:
    """Each setting is one runner option: a value, or a switch away from its default."""
    from cgguard._runner import program_environ, run_parser

    options = run_parser().parse_args(
        [
            "--mode=log",
            "--log-format=json",
            "--log-file=l",
            "--log-target=file",
            "--report=r",
            "--capture=disabled",
            "--simulate-cuda",
            "--no-vllm-bridge",
        ]
    )
    env = program_environ(options, {})
    assert {k: v for k, v in env.items() if k != "PYTHONPATH"} == {
        "CGGUARD_ENABLED": "1",
        "CGGUARD_MODE": "log",
        "CGGUARD_LOG_FORMAT": "json",
        "CGGUARD_LOG_FILE": "l",
        "CGGUARD_LOG_TARGET": "file",
        "CGGUARD_REPORT": "r",
        "CGGUARD_CAPTURE": "disabled",
        "CGGUARD_SIMULATE_CUDA": "1",
        "CGGUARD_VLLM_BRIDGE": "0",
    }
    assert [s.field for s in _settings.SETTINGS.values()] == [
        "mode",
        "log_format",
        "log_file",
        "log_target",
        "report",
        "capture",
        "simulate_cuda",
        "vllm_bridge",
    ]
