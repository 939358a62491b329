"""cgguard.Config: defaults, validation with one-line messages, and building from CGGUARD_*."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import cgguard
from cgguard import _warn

DEFAULTS = {
    "mode": "raise",
    "log_format": None,
    "log_file": None,
    "capture": None,
    "simulate_cuda": False,
}


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """warn_once remembers keys process-wide; each test starts with none said."""
    monkeypatch.setattr(_warn, "_said", set())


def test_defaults() -> None:
    """Config() raises on violations, picks the format by terminal, and changes nothing else."""
    assert dataclasses.asdict(cgguard.Config()) == DEFAULTS


def test_every_field_set() -> None:
    """Accepted values for every field are kept as given."""
    config = cgguard.Config(
        mode="log",
        log_format="console",
        log_file="/tmp/events.log",  # noqa: S108 - a value, never opened
        capture="disabled",
        simulate_cuda=True,
    )
    expected = {
        "mode": "log",
        "log_format": "console",
        "log_file": "/tmp/events.log",  # noqa: S108 - a value, never opened
        "capture": "disabled",
        "simulate_cuda": True,
    }
    assert expected == dataclasses.asdict(config)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "rase"}, "Config(mode='rase'): accepted values are 'raise', 'log'"),
        ({"mode": "RAISE"}, "Config(mode='RAISE'): accepted values are 'raise', 'log'"),
        ({"mode": None}, "Config(mode=None): accepted values are 'raise', 'log'"),
        (
            {"log_format": "xml"},
            "Config(log_format='xml'): accepted values are None, 'json', 'console'",
        ),
        (
            {"capture": True},
            "Config(capture=True): accepted values are None, 'enabled', 'disabled'",
        ),
        ({"simulate_cuda": 1}, "Config(simulate_cuda=1): accepted values are False, True"),
        ({"simulate_cuda": 0}, "Config(simulate_cuda=0): accepted values are False, True"),
        ({"simulate_cuda": "yes"}, "Config(simulate_cuda='yes'): accepted values are False, True"),
        ({"log_file": ""}, "Config(log_file=''): accepted values are None or a path"),
        ({"log_file": 3}, "Config(log_file=3): accepted values are None or a path"),
    ],
)
def test_invalid_value_message(kwargs: dict[str, Any], message: str) -> None:
    """An invalid value raises ConfigError (a ValueError) naming field, value, accepted values."""
    with pytest.raises(cgguard.ConfigError) as info:
        cgguard.Config(**kwargs)
    assert isinstance(info.value, ValueError)
    assert message == str(info.value)


def test_frozen() -> None:
    """A Config cannot be changed after it is built."""
    config = cgguard.Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.mode = "log"  # type: ignore[misc]
    assert dataclasses.asdict(config) == DEFAULTS


def test_from_environ_every_variable(capsys: pytest.CaptureFixture[str]) -> None:
    """Every CGGUARD_* variable set gives the Config they spell, silently."""
    environ = {
        "CGGUARD_MODE": "log",
        "CGGUARD_LOG_FORMAT": "json",
        "CGGUARD_LOG_FILE": "/srv/cg/events.jsonl",
        "CGGUARD_CAPTURE": "enabled",
        "CGGUARD_SIMULATE_CUDA": "yes",
    }
    expected = cgguard.Config(
        mode="log",
        log_format="json",
        log_file="/srv/cg/events.jsonl",
        capture="enabled",
        simulate_cuda=True,
    )
    assert expected == cgguard.Config.from_environ(environ)
    assert capsys.readouterr() == ("", "")


def test_from_environ_nothing_set(capsys: pytest.CaptureFixture[str]) -> None:
    """No CGGUARD_* variable (other variables ignored) gives the default Config."""
    assert cgguard.Config() == cgguard.Config.from_environ({"HOME": "/root", "MODE": "log"})
    assert capsys.readouterr() == ("", "")


def test_from_environ_bad_value_warns_and_uses_default(capsys: pytest.CaptureFixture[str]) -> None:
    """A rejected value falls back to the default, with exactly one stderr line saying so."""
    environ = {"CGGUARD_MODE": "rase", "CGGUARD_LOG_FORMAT": "console"}
    assert cgguard.Config(log_format="console") == cgguard.Config.from_environ(environ)
    expected_err = "cgguard: ignoring CGGUARD_MODE='rase': accepted values are raise, log\n"
    assert ("", expected_err) == capsys.readouterr()


def test_from_environ_bad_value_warns_once(capsys: pytest.CaptureFixture[str]) -> None:
    """Reading the same rejected value again does not repeat the warning."""
    environ = {"CGGUARD_SIMULATE_CUDA": "maybe"}
    cgguard.Config.from_environ(environ)
    cgguard.Config.from_environ(environ)
    expected_err = (
        "cgguard: ignoring CGGUARD_SIMULATE_CUDA='maybe': "
        "accepted values are 1/true/yes/on or 0/false/no/off\n"
    )
    assert ("", expected_err) == capsys.readouterr()


def test_from_environ_warn_false_is_silent(capsys: pytest.CaptureFixture[str]) -> None:
    """warn=False still ignores a rejected value, but prints nothing."""
    environ = {"CGGUARD_MODE": "rase", "CGGUARD_CAPTURE": "sometimes"}
    assert cgguard.Config() == cgguard.Config.from_environ(environ, warn=False)
    assert capsys.readouterr() == ("", "")


def test_from_environ_empty_values_are_unset(capsys: pytest.CaptureFixture[str]) -> None:
    """An empty variable counts as unset: the default, and no warning."""
    environ = dict.fromkeys(
        [
            "CGGUARD_MODE",
            "CGGUARD_LOG_FORMAT",
            "CGGUARD_LOG_FILE",
            "CGGUARD_CAPTURE",
            "CGGUARD_SIMULATE_CUDA",
        ],
        "",
    )
    assert cgguard.Config() == cgguard.Config.from_environ(environ)
    assert capsys.readouterr() == ("", "")


def test_from_environ_case_and_spaces() -> None:
    """Choice and boolean values are read case-insensitively and stripped of spaces."""
    environ = {
        "CGGUARD_MODE": "LOG ",
        "CGGUARD_LOG_FORMAT": " Console",
        "CGGUARD_CAPTURE": "\tDISABLED\n",
        "CGGUARD_SIMULATE_CUDA": " TRUE ",
    }
    expected = cgguard.Config(
        mode="log", log_format="console", capture="disabled", simulate_cuda=True
    )
    assert expected == cgguard.Config.from_environ(environ)


def test_from_environ_log_file_is_free_text() -> None:
    """CGGUARD_LOG_FILE is taken verbatim: neither folded in case nor stripped."""
    environ = {"CGGUARD_LOG_FILE": " /Data/Run 1/CG.LOG "}
    expected = cgguard.Config(log_file=" /Data/Run 1/CG.LOG ")
    assert expected == cgguard.Config.from_environ(environ)
