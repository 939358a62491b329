"""cgguard._environ: the CGGUARD_* variables, their spellings, a start-up path without imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cgguard import _environ

TRUE_SPELLINGS = ["1", "true", "yes", "on", "TRUE", "Yes", "oN", " on ", "\ttrue\n"]
FALSE_SPELLINGS = ["0", "false", "no", "off", "FALSE", "No", "oFf", " 0 ", "\tno\n"]


@pytest.mark.parametrize("raw", TRUE_SPELLINGS)
def test_parse_bool_true_spellings(raw: str) -> None:
    """1/true/yes/on, in any case and with surrounding whitespace, parse as True."""
    assert _environ.parse_bool(raw) is True


@pytest.mark.parametrize("raw", FALSE_SPELLINGS)
def test_parse_bool_false_spellings(raw: str) -> None:
    """0/false/no/off, in any case and with surrounding whitespace, parse as False."""
    assert _environ.parse_bool(raw) is False


@pytest.mark.parametrize("raw", ["", " ", "2", "-1", "enable", "y", "n", "truee", "o n"])
def test_parse_bool_other_spellings_are_none(raw: str) -> None:
    """Anything but the accepted spellings parses as None, not as a guess."""
    assert _environ.parse_bool(raw) is None


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
    assert expected is _environ.is_enabled(environ)


def test_read_every_variable() -> None:
    """read() returns each Config field set, the variable it came from, and no problems."""
    environ = {
        "CGGUARD_MODE": "log",
        "CGGUARD_LOG_FORMAT": "console",
        "CGGUARD_LOG_FILE": "/var/log/cgguard.jsonl",
        "CGGUARD_CAPTURE": "disabled",
        "CGGUARD_SIMULATE_CUDA": "1",
    }
    expected: tuple[dict[str, object], dict[str, str], list[str]] = (
        {
            "mode": "log",
            "log_format": "console",
            "log_file": "/var/log/cgguard.jsonl",
            "capture": "disabled",
            "simulate_cuda": True,
        },
        {
            "mode": "CGGUARD_MODE",
            "log_format": "CGGUARD_LOG_FORMAT",
            "log_file": "CGGUARD_LOG_FILE",
            "capture": "CGGUARD_CAPTURE",
            "simulate_cuda": "CGGUARD_SIMULATE_CUDA",
        },
        [],
    )
    assert expected == _environ.read(environ)


def test_read_mixed_mapping() -> None:
    """read() folds case and spaces, skips empty and foreign variables, and lists bad values."""
    environ = {
        "CGGUARD_MODE": " LOG ",
        "CGGUARD_LOG_FORMAT": "",
        "CGGUARD_LOG_FILE": " Events Here.log ",
        "CGGUARD_CAPTURE": "sometimes",
        "CGGUARD_SIMULATE_CUDA": "Off",
        "CGGUARD_ENABLED": "1",
        "HOME": "/root",
    }
    expected: tuple[dict[str, object], dict[str, str], list[str]] = (
        {"mode": "log", "log_file": " Events Here.log ", "simulate_cuda": False},
        {
            "mode": "CGGUARD_MODE",
            "log_file": "CGGUARD_LOG_FILE",
            "simulate_cuda": "CGGUARD_SIMULATE_CUDA",
        },
        ["ignoring CGGUARD_CAPTURE='sometimes': accepted values are enabled, disabled"],
    )
    assert expected == _environ.read(environ)


def test_read_bad_boolean_and_bad_choice() -> None:
    """Each rejected value is one problem line, in variable order, naming the accepted values."""
    environ = {"CGGUARD_SIMULATE_CUDA": "maybe", "CGGUARD_MODE": "rase"}
    expected: tuple[dict[str, object], dict[str, str], list[str]] = (
        {},
        {},
        [
            "ignoring CGGUARD_MODE='rase': accepted values are raise, log",
            "ignoring CGGUARD_SIMULATE_CUDA='maybe': "
            "accepted values are 1/true/yes/on or 0/false/no/off",
        ],
    )
    assert expected == _environ.read(environ)


def _modules_after(code: str) -> set[str]:
    """The names in sys.modules at the end of a fresh interpreter running ``code``."""
    script = f"{code}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return set(result.stdout.split())


def test_import_adds_no_heavy_modules() -> None:
    """Importing cgguard._environ loads only cgguard and cgguard._environ: no typing, no json."""
    bare = _modules_after("pass")
    imported = _modules_after("import cgguard._environ")
    assert {"cgguard", "cgguard._environ"} == imported - bare
