"""cgguard._config.settings: each setting, its CGGUARD_* variable and spellings; cheap start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from helpers import clean_environ

from cgguard._config import settings as _settings
from cgguard._rules.table import ACTIONS

if TYPE_CHECKING:
    from pathlib import Path

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
        [
            "ignoring CGGUARD_CAPTURE='sometimes': accepted values are enabled, disabled; "
            "using as it is (enabled at start)"
        ],
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
        {"mode": "log"},
        {"mode": "CGGUARD_MODE"},
        [
            "ignoring CGGUARD_MODE='rase': accepted values are raise, log; using log",
            "ignoring CGGUARD_LOG_TARGET='syslog': accepted values are stderr, file, logging; "
            "using stderr, or the log file when set",
            "ignoring CGGUARD_SIMULATE_CUDA='maybe': "
            "accepted values are 1/true/yes/on or 0/false/no/off; using off",
            "ignoring CGGUARD_VLLM_BRIDGE='auto': "
            "accepted values are 1/true/yes/on or 0/false/no/off; using on",
            "ignoring CGGUARD_RULE_CAPTURE_DISABLED='warn': accepted values are raise, log, off; "
            "using the rule's default action",
            "ignoring CGGUARD_RULE_SYNC_DURING_CAPTURE='silent': "
            "accepted values are raise, log, off; using the rule's default action",
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
            "CGGUARD_RULE_IMPLICIT_SYNC": "implicit_sync",
            "CGGUARD_RULE_DEAD_INPUT": "dead_input",
            "CGGUARD_RULE_STALE_BINDING": "stale_binding",
            "CGGUARD_RULE_RNG_DURING_CAPTURE": "rng_during_capture",
            "CGGUARD_RULE_FIRST_USE_IN_CAPTURE": "first_use_in_capture",
            "CGGUARD_RULE_RANK_DIVERGENCE": "rank_divergence",
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
    """Importing cgguard._config.settings loads only it, the rule table, the exceptions and the
    start-up module that names CGGUARD_ENABLED: no typing."""
    bare = _modules_after("pass")
    imported = _modules_after("import cgguard._config.settings")
    assert {
        "cgguard",
        "cgguard._boot",
        "cgguard._config",
        "cgguard._config.settings",
        "cgguard._errors",
        "cgguard._rules",
        "cgguard._rules.table",
    } == imported - bare


def test_misspelt_rule_variable_is_reported() -> None:
    """A CGGUARD_RULE_ variable that names no rule is a problem line, not a silent no-op."""
    values, sources, problems = _settings.read({"CGGUARD_RULE_BOGUS": "off"})
    assert (values, sources) == ({}, {})
    assert problems == [
        "ignoring CGGUARD_RULE_BOGUS: no such rule; the rule variables are "
        "CGGUARD_RULE_CAPTURE_DISABLED, CGGUARD_RULE_NESTED_CAPTURE, "
        "CGGUARD_RULE_CONCURRENT_CAPTURE, CGGUARD_RULE_SYNC_DURING_CAPTURE, "
        "CGGUARD_RULE_ABANDONED_CAPTURE, CGGUARD_RULE_IMPLICIT_SYNC, CGGUARD_RULE_DEAD_INPUT, "
        "CGGUARD_RULE_STALE_BINDING, CGGUARD_RULE_RNG_DURING_CAPTURE, "
        "CGGUARD_RULE_FIRST_USE_IN_CAPTURE, CGGUARD_RULE_RANK_DIVERGENCE"
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
    from cgguard._commands.run import program_environ, run_parser

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
            "--exempt=capture_disabled=torch._inductor.",
            "--exempt",
            "nested_capture=*/kernels.py",
            "--exempt-file=e",
            "--window=pkg.runner:Runner.capture_model",
            "--window",
            "pkg:FLAG, pkg:var",
            "--inspect",
            "--inspect-first=2",
            "--no-census",
            "--census-replays",
            "--metrics=prometheus",
        ]
    )
    env = program_environ(options, {})
    assert {k: v for k, v in env.items() if k != "PYTHONPATH"} == {
        "CGGUARD_ENABLED": "1",
        "CGGUARD_MODE": "log",
        "CGGUARD_LOG_FORMAT": "json",
        # Paths made absolute where the runner ran.
        "CGGUARD_LOG_FILE": os.path.abspath("l"),
        "CGGUARD_LOG_TARGET": "file",
        "CGGUARD_REPORT": os.path.abspath("r"),
        "CGGUARD_CAPTURE": "disabled",
        "CGGUARD_SIMULATE_CUDA": "1",
        "CGGUARD_VLLM_BRIDGE": "0",
        "CGGUARD_EXEMPT": "capture_disabled=torch._inductor.;nested_capture=*/kernels.py",
        "CGGUARD_EXEMPT_FILE": os.path.abspath("e"),
        "CGGUARD_WINDOW": "pkg.runner:Runner.capture_model,pkg:FLAG,pkg:var",
        "CGGUARD_INSPECT": "1",
        "CGGUARD_INSPECT_FIRST": "2",
        "CGGUARD_CENSUS": "0",
        "CGGUARD_CENSUS_REPLAYS": "1",
        "CGGUARD_METRICS": "prometheus",
    }
    assert [s.field for s in _settings.SETTINGS.values()] == [
        "mode",
        "log_format",
        "log_file",
        "log_target",
        "log_level",
        "report",
        "capture",
        "simulate_cuda",
        "vllm_bridge",
        "exempt",
        "exempt_file",
        "windows",
        "profiles",
        "inspect",
        "inspect_first",
        "census",
        "census_replays",
        "metrics",
        "manifest",
        "rank_check",
    ]


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("CGGUARD_MOD", "ignoring CGGUARD_MOD: no such variable; did you mean CGGUARD_MODE?"),
        (
            "CGGUARD_ENABLE",
            "ignoring CGGUARD_ENABLE: no such variable; did you mean CGGUARD_ENABLED?",
        ),
        (
            "CGGUARD_LOGFILE",
            "ignoring CGGUARD_LOGFILE: no such variable; did you mean CGGUARD_LOG_FILE?",
        ),
        (
            "CGGUARD_mode",
            "ignoring CGGUARD_mode: no such variable; did you mean CGGUARD_MODE?",
        ),
        (
            "CGGUARD_RULES_NESTED_CAPTURE",
            "ignoring CGGUARD_RULES_NESTED_CAPTURE: no such variable; "
            "did you mean CGGUARD_RULE_NESTED_CAPTURE?",
        ),
        (
            "CGGUARD_SIMULATE",
            "ignoring CGGUARD_SIMULATE: no such variable; did you mean CGGUARD_SIMULATE_CUDA?",
        ),
    ],
)
def test_unknown_variable_gets_the_closest_name(name: str, line: str) -> None:
    """A CGGUARD_* variable that cgguard does not read is one problem line with the closest name."""
    assert ({}, {}, [line]) == _settings.read({name: "log"})


def test_unknown_variable_without_a_close_name_lists_the_variables() -> None:
    """An unknown CGGUARD_* name like none of cgguard's is a problem line listing its variables."""
    expected = (
        {},
        {},
        [
            "ignoring CGGUARD_XYZZY: no such variable; the variables are CGGUARD_ENABLED, "
            "CGGUARD_MODE, CGGUARD_LOG_FORMAT, CGGUARD_LOG_FILE, CGGUARD_LOG_TARGET, "
            "CGGUARD_LOG_LEVEL, CGGUARD_REPORT, CGGUARD_CAPTURE, CGGUARD_SIMULATE_CUDA, "
            "CGGUARD_VLLM_BRIDGE, "
            "CGGUARD_EXEMPT, CGGUARD_EXEMPT_FILE, CGGUARD_WINDOW, CGGUARD_PROFILES, "
            "CGGUARD_INSPECT, CGGUARD_INSPECT_FIRST, CGGUARD_CENSUS, CGGUARD_CENSUS_REPLAYS, "
            "CGGUARD_METRICS, CGGUARD_MANIFEST, CGGUARD_RANK_CHECK, CGGUARD_RULE_<RULE>"
        ],
    )
    assert expected == _settings.read({"CGGUARD_XYZZY": "1"})


def test_unknown_variables_do_not_hide_known_ones() -> None:
    """Unknown names are reported after the values, in the environment's order; others apply."""
    environ = {
        "CGGUARD_REPORTS": "r.json",
        "CGGUARD_MODE": "log",
        "CGGUARD_CAPTURE": "never",
        "CGGUARD_MOD": "",  # a misspelt name is reported whatever its value, as rule names are
        "CGGUARD_RULE_NESTED_CAPTURE": "off",
    }
    expected = (
        {"mode": "log", "rules": {"nested_capture": "off"}},
        {"mode": "CGGUARD_MODE", "rules.nested_capture": "CGGUARD_RULE_NESTED_CAPTURE"},
        [
            "ignoring CGGUARD_CAPTURE='never': accepted values are enabled, disabled; "
            "using as it is (enabled at start)",
            "ignoring CGGUARD_REPORTS: no such variable; did you mean CGGUARD_REPORT?",
            "ignoring CGGUARD_MOD: no such variable; did you mean CGGUARD_MODE?",
        ],
    )
    assert expected == _settings.read(environ)


def test_misspelt_rule_variable_gets_the_closest_rule() -> None:
    """A CGGUARD_RULE_ variable close to a rule's variable names it."""
    expected = (
        {},
        {},
        [
            "ignoring CGGUARD_RULE_NESTED: no such rule; did you mean CGGUARD_RULE_NESTED_CAPTURE?",
            "ignoring CGGUARD_RULE_SYNC_DURING_CAPTUR: no such rule; "
            "did you mean CGGUARD_RULE_SYNC_DURING_CAPTURE?",
        ],
    )
    environ = {"CGGUARD_RULE_NESTED": "off", "CGGUARD_RULE_SYNC_DURING_CAPTUR": "raise"}
    assert expected == _settings.read(environ)


LONG = "x" * 10_000


@pytest.mark.parametrize(
    ("environ", "line"),
    [
        (
            {"CGGUARD_MODE": LONG},
            f"ignoring CGGUARD_MODE='{'x' * 199}... (10000 characters): "
            "accepted values are raise, log; using log",
        ),
        (
            {"CGGUARD_RULE_NESTED_CAPTURE": LONG},
            f"ignoring CGGUARD_RULE_NESTED_CAPTURE='{'x' * 199}... (10000 characters): "
            "accepted values are raise, log, off; using the rule's default action",
        ),
        (
            {"CGGUARD_SIMULATE_CUDA": "yes " + LONG},
            f"ignoring CGGUARD_SIMULATE_CUDA='yes {'x' * 195}... (10004 characters): "
            "accepted values are 1/true/yes/on or 0/false/no/off; using off",
        ),
        (
            {"CGGUARD_" + LONG: "1"},
            f"ignoring CGGUARD_{'x' * 192}... (10008 characters): no such variable; "
            "the variables are CGGUARD_ENABLED, CGGUARD_MODE, CGGUARD_LOG_FORMAT, "
            "CGGUARD_LOG_FILE, CGGUARD_LOG_TARGET, CGGUARD_LOG_LEVEL, CGGUARD_REPORT, "
            "CGGUARD_CAPTURE, CGGUARD_SIMULATE_CUDA, CGGUARD_VLLM_BRIDGE, CGGUARD_EXEMPT, "
            "CGGUARD_EXEMPT_FILE, "
            "CGGUARD_WINDOW, CGGUARD_PROFILES, CGGUARD_INSPECT, CGGUARD_INSPECT_FIRST, "
            "CGGUARD_CENSUS, CGGUARD_CENSUS_REPLAYS, CGGUARD_METRICS, CGGUARD_MANIFEST, "
            "CGGUARD_RANK_CHECK, CGGUARD_RULE_<RULE>",
        ),
    ],
)
def test_long_values_are_cut_in_problem_lines(environ: dict[str, str], line: str) -> None:
    """A value or name of 10,000 characters shows its first 200 and its length, not all of it."""
    assert [line] == _settings.read(environ)[2]


def test_path_with_a_nul_character_is_a_problem() -> None:
    """A path with a NUL character (possible in a mapping, not in an environment) is refused."""
    expected = (
        {"log_file": "ok.log"},
        {"log_file": "CGGUARD_LOG_FILE"},
        [
            "ignoring CGGUARD_REPORT='r\\x00.json': "
            "accepted values are a path (not blank, no NUL character); using none"
        ],
    )
    assert expected == _settings.read({"CGGUARD_REPORT": "r\0.json", "CGGUARD_LOG_FILE": "ok.log"})


def test_values_that_are_not_text_are_problems() -> None:
    """A mapping built in code may hold other values than text: each is refused, none raises."""
    environ: dict[object, object] = {
        "CGGUARD_MODE": 1,
        "CGGUARD_SIMULATE_CUDA": True,
        "CGGUARD_REPORT": b"r.json",
        "CGGUARD_RULE_NESTED_CAPTURE": None,
        ("CGGUARD_MOD",): "log",
        7: "x",
    }
    expected = (
        {"mode": "log"},
        {"mode": "CGGUARD_MODE"},
        [
            "ignoring CGGUARD_MODE=1: accepted values are raise, log; using log",
            "ignoring CGGUARD_REPORT=b'r.json': "
            "accepted values are a path (not blank, no NUL character); using none",
            "ignoring CGGUARD_SIMULATE_CUDA=True: "
            "accepted values are 1/true/yes/on or 0/false/no/off; using off",
            "ignoring CGGUARD_RULE_NESTED_CAPTURE=None: accepted values are raise, log, off; "
            "using the rule's default action",
        ],
    )
    assert expected == _settings.read(environ)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("short", "'short'"),
        ("x" * 198, "'" + "x" * 198 + "'"),  # the quotes count: 200 characters in all
        ("x" * 199, "'" + "x" * 199 + "... (199 characters)"),
        (LONG, "'" + "x" * 199 + "... (10000 characters)"),
        (list(range(1000)), str(list(range(1000)))[:200] + "... (a repr of 4890 characters)"),
    ],
)
def test_shown_cuts_at_200_characters(value: object, shown: str) -> None:
    """shown(): the repr when it fits in 200 characters, else its first 200 and the length."""
    assert shown == _settings.shown(value)


def test_shown_survives_a_failing_repr() -> None:
    """A value whose repr raises is shown by its type and address, never by an exception."""

    class Nasty:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    nasty = Nasty()
    assert object.__repr__(nasty) == _settings.shown(nasty)


def test_the_report_owner_mark_is_no_unknown_variable() -> None:
    """CGGUARD_REPORT_OWNER, which cgguard sets for the children of a report's writer, is no
    mistake to warn about."""
    assert _settings.read({"CGGUARD_REPORT_OWNER": "12"})[2] == []


@pytest.mark.subprocess
def test_exemptions_at_start_up_load_only_the_standard_library(tmp_path: Path) -> None:
    """Activated with exemptions, a bad one and a catch-all among them, in the variable and a
    file: start-up warns and loads cgguard's parsers alone, no typing, dataclasses, json or re."""
    path = tmp_path / "exemptions"
    path.write_text("capture_disabled=*/*\noops\n")
    env = clean_environ(
        CGGUARD_ENABLED="1",
        CGGUARD_EXEMPT="nested_capture=pkg.mod:f",
        CGGUARD_EXEMPT_FILE=str(path),
    )
    code = "import sys\nprint('\\n'.join(sorted(sys.modules)))"

    def modules(environ: dict[str, str]) -> tuple[set[str], str]:
        done = subprocess.run(
            [sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True
        )
        return set(done.stdout.split()), done.stderr

    bare, _ = modules(clean_environ())
    loaded, stderr = modules(env)
    expected = (
        [
            "cgguard",
            "cgguard._boot",
            "cgguard._config",
            "cgguard._config.settings",
            "cgguard._errors",
            "cgguard._rules",
            "cgguard._rules.exempt_syntax",
            "cgguard._rules.table",
            "cgguard._support",
            "cgguard._support.text",
            "cgguard._support.warn",
        ],
        f"cgguard: ignoring the exemption 'oops' in {str(path)!r} line 2: not RULE=PLACE; an "
        "entry is RULE=PLACE, PLACE a module (torch._inductor.), a file glob with a '/' "
        "(*/kernels.py) or a function (module:qualname)\n"
        "cgguard: the exemption 'capture_disabled=*/*' matches every file: it exempts every "
        "capture from capture_disabled; an exemption meant for one place names its file "
        "(*/vllm_plugin/kernels.py), module or module:qualname\n",
    )
    assert expected == (sorted(loaded - bare), stderr)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", 1), (" 67 ", 67), ("0", None), ("-3", None), ("²", None), ("two", None), ("1.5", None)],
)
def test_inspect_first_takes_a_whole_number_of_one_or_more(raw: str, expected: object) -> None:
    """CGGUARD_INSPECT_FIRST is a count: 1 or more in ASCII digits; anything else is one
    problem line naming the variable and what it accepts."""
    values, _, problems = _settings.read({"CGGUARD_INSPECT_FIRST": raw})
    if expected is None:
        assert (values, problems) == (
            {},
            [
                f"ignoring CGGUARD_INSPECT_FIRST={raw!r}: accepted values are a whole number, "
                "1 or more; using every capture of each site"
            ],
        )
    else:
        assert (values, problems) == ({"inspect_first": expected}, [])
