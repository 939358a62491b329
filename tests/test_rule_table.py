"""cgguard._rules.table: one table of rules, from which every other place naming a rule derives."""

from __future__ import annotations

import pytest

import cgguard
from cgguard._commands.run import run_parser
from cgguard._config import settings as _settings
from cgguard._reporting.log import format_stacks
from cgguard._rules.table import NAMES, RULES
from cgguard.pytest_plugin import _unknown_rules

EXCEPTIONS = {
    "capture_disabled": cgguard.CaptureDisabledError,
    "nested_capture": cgguard.NestedCaptureError,
    "concurrent_capture": cgguard.ConcurrentCaptureError,
    "sync_during_capture": cgguard.SyncDuringCaptureError,
    "abandoned_capture": cgguard.AbandonedCaptureError,
    "implicit_sync": cgguard.ImplicitSyncError,
    "dead_input": cgguard.DeadInputError,
    "stale_binding": cgguard.StaleBindingError,
    "rng_during_capture": cgguard.RngDuringCaptureError,
    "first_use_in_capture": cgguard.FirstUseInCaptureError,
    "rank_divergence": cgguard.RankDivergenceError,
}


def test_the_rules_and_their_exceptions() -> None:
    """Eleven rules, in the order they are checked, each with its own public exception."""
    assert {name: rule.error for name, rule in RULES.items()} == EXCEPTIONS
    assert list(NAMES) == list(EXCEPTIONS)


@pytest.mark.parametrize("name", list(EXCEPTIONS))
def test_every_rule_reaches_every_place_that_names_rules(name: str) -> None:
    """A rule in the table has its variable, a Config entry, a runner option and a pytest marker."""
    variable = f"CGGUARD_RULE_{name.upper()}"
    config = cgguard.Config.from_environ({variable: "off"}, warn=False)
    options = run_parser().parse_args(["--rule", f"{name}=off"])
    assert (
        _settings.RULE_VARIABLES[variable],
        cgguard.Config(rules={name: "raise"}).action(name),
        config.action(name),
        options.rule,
        _unknown_rules(frozenset({name})),
    ) == (name, "raise", "off", [(name, "off")], [])


@pytest.mark.parametrize(
    ("name", "action"),
    [
        ("capture_disabled", "raise"),
        ("nested_capture", "raise"),
        ("concurrent_capture", "log"),
        ("sync_during_capture", "log"),
        ("abandoned_capture", "log"),
    ],
)
def test_diagnostics_log_whatever_the_mode(name: str, action: str) -> None:
    """The table's diagnostics log in raise mode; the two rules take the mode."""
    assert (cgguard.Config().action(name), cgguard.Config(mode="log").action(name)) == (
        action,
        "log",
    )


ATTEMPT = "The capture was attempted at (most recent call last):"


@pytest.mark.parametrize(
    ("name", "cause_key", "titles"),
    [
        ("capture_disabled", "disabled_stack", (ATTEMPT, "Capture was disabled at")),
        ("nested_capture", "outer_stack", (ATTEMPT, "The outer capture began at")),
        (
            "concurrent_capture",
            "other_stack",
            (ATTEMPT, "The other thread's capture began at"),
        ),
        (
            "sync_during_capture",
            "capture_stack",
            (
                "The synchronize or query was made at (most recent call last):",
                "The capture began at",
            ),
        ),
    ],
)
def test_console_titles_come_from_the_table(
    name: str, cause_key: str, titles: tuple[str, str]
) -> None:
    """The console shows each rule's two stacks under the titles its record gives."""
    frame = {"file": "f.py", "line": 3, "function": "g", "code": "x()"}
    text = '  File "f.py", line 3, in g\n    x()'
    event = {"rule": name, "stack": [frame], cause_key: [frame]}
    attempt, cause = titles
    expected = f"{attempt}\n{text}\n\n{cause} (most recent call last):\n{text}"
    assert (RULES[name].cause_key, format_stacks(event)) == (cause_key, expected)


def test_a_rule_without_a_cause_shows_one_stack() -> None:
    """abandoned_capture has no cause: the console shows where the abandoned capture began."""
    frame = {"file": "f.py", "line": 3, "function": "g", "code": "x()"}
    event = {"rule": "abandoned_capture", "stack": [frame]}
    assert format_stacks(event) == (
        "The abandoned capture began at (most recent call last):\n"
        '  File "f.py", line 3, in g\n    x()'
    )
