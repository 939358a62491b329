"""cgguard.Config: defaults, validation with one-line messages, and building from CGGUARD_*."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import cgguard

DEFAULTS = {
    "mode": "raise",
    "rules": {},
    "log_format": None,
    "log_file": None,
    "log_target": None,
    "report": None,
    "capture": None,
    "simulate_cuda": False,
    "vllm_bridge": True,
    "exempt": (),
    "exempt_file": None,
    "windows": (),
    "profiles": "log",
    "inspect": False,
    "inspect_first": None,
    "census": True,
    "census_replays": False,
    "metrics": None,
    "log_level": "debug",
    "manifest": True,
    "rank_check": False,
}
RULES = (
    "capture_disabled",
    "nested_capture",
    "concurrent_capture",
    "sync_during_capture",
    "abandoned_capture",
    "implicit_sync",
    "dead_input",
    "stale_binding",
    "rng_during_capture",
    "first_use_in_capture",
    "rank_divergence",
)
PATHS = "None or a path, a str or os.PathLike (not blank, no NUL character)"
RULES_ACCEPTED = (
    "accepted rules are capture_disabled, nested_capture, concurrent_capture, "
    "sync_during_capture, abandoned_capture, implicit_sync, dead_input, stale_binding, "
    "rng_during_capture, first_use_in_capture, rank_divergence; "
    "actions are raise, log, off"
)


def test_defaults() -> None:
    """Config() raises on violations, picks format and target later, follows vLLM, no more."""
    assert dataclasses.asdict(cgguard.Config()) == DEFAULTS


def test_every_field_set() -> None:
    """Accepted values for every field are kept as given."""
    config = cgguard.Config(
        mode="log",
        rules={"nested_capture": "off", "sync_during_capture": "raise"},
        log_format="console",
        log_file="/tmp/events.log",  # noqa: S108 - a value, never opened
        log_target="logging",
        report="/tmp/report-{pid}.json",  # noqa: S108 - a value, never written
        capture="disabled",
        simulate_cuda=True,
        vllm_bridge=False,
        exempt="capture_disabled=torch._inductor.",
        exempt_file="/etc/cgguard/exempt",
        windows="vllm.v1.worker.gpu.model_runner:GPUModelRunner.capture_model, pkg:FLAG",
        profiles="off",
        inspect=True,
        inspect_first=67,
        census=False,
        census_replays=True,
        metrics="prometheus",
        log_level="warning",
        manifest=False,
        rank_check=True,
    )
    expected = {
        "mode": "log",
        "rules": {"nested_capture": "off", "sync_during_capture": "raise"},
        "log_format": "console",
        "log_file": "/tmp/events.log",  # noqa: S108 - a value, never opened
        "log_target": "logging",
        "report": "/tmp/report-{pid}.json",  # noqa: S108 - a value, never written
        "capture": "disabled",
        "simulate_cuda": True,
        "vllm_bridge": False,
        "exempt": (("capture_disabled", "torch._inductor."),),
        "exempt_file": "/etc/cgguard/exempt",
        "windows": ("vllm.v1.worker.gpu.model_runner:GPUModelRunner.capture_model", "pkg:FLAG"),
        "profiles": "off",
        "inspect": True,
        "inspect_first": 67,
        "census": False,
        "census_replays": True,
        "metrics": "prometheus",
        "log_level": "warning",
        "manifest": False,
        "rank_check": True,
    }
    assert expected == dataclasses.asdict(config)


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "3"])
def test_inspect_first_refuses_what_is_not_a_count(value: object) -> None:
    """inspect_first takes None or an int of 1 or more; anything else is one ConfigError line."""
    with pytest.raises(cgguard.ConfigError) as refused:
        cgguard.Config(inspect_first=value)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"Config(inspect_first={value!r}): accepted values are None or a whole number (int), "
        "1 or more"
    )


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
        ({"log_file": ""}, f"Config(log_file=''): accepted values are {PATHS}"),
        ({"log_file": 3}, f"Config(log_file=3): accepted values are {PATHS}"),
        (
            {"log_target": "syslog"},
            "Config(log_target='syslog'): accepted values are None, 'stderr', 'file', 'logging'",
        ),
        (
            {"log_target": "file"},
            "Config(log_target='file'): needs log_file, a path",
        ),
        ({"report": ""}, f"Config(report=''): accepted values are {PATHS}"),
        ({"report": 3}, f"Config(report=3): accepted values are {PATHS}"),
        ({"vllm_bridge": 0}, "Config(vllm_bridge=0): accepted values are False, True"),
        ({"vllm_bridge": "no"}, "Config(vllm_bridge='no'): accepted values are False, True"),
        (
            {"rules": "nested_capture=off"},
            "Config(rules='nested_capture=off'): accepted values are a mapping of rule to action",
        ),
        (
            {"rules": {"nested": "off"}},
            "Config(rules={'nested': 'off'}): accepted rules are capture_disabled, "
            "nested_capture, concurrent_capture, sync_during_capture, abandoned_capture, "
            "implicit_sync, dead_input, stale_binding, rng_during_capture, "
            "first_use_in_capture, rank_divergence; "
            "actions are raise, log, off",
        ),
        (
            {"rules": {"nested_capture": "warn"}},
            "Config(rules={'nested_capture': 'warn'}): accepted rules are capture_disabled, "
            "nested_capture, concurrent_capture, sync_during_capture, abandoned_capture, "
            "implicit_sync, dead_input, stale_binding, rng_during_capture, "
            "first_use_in_capture, rank_divergence; "
            "actions are raise, log, off",
        ),
        (
            {"rules": {"sync_during_capture": "OFF"}},
            "Config(rules={'sync_during_capture': 'OFF'}): accepted rules are capture_disabled, "
            "nested_capture, concurrent_capture, sync_during_capture, abandoned_capture, "
            "implicit_sync, dead_input, stale_binding, rng_during_capture, "
            "first_use_in_capture, rank_divergence; "
            "actions are raise, log, off",
        ),
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


def test_rules_are_copied_from_the_callers_mapping() -> None:
    """Changing the dict passed as rules after the Config is built does not change the Config."""
    rules = {"nested_capture": "off"}
    config = cgguard.Config(rules=rules)  # type: ignore[arg-type]
    rules["nested_capture"] = "raise"
    rules["capture_disabled"] = "off"
    expected = ({"nested_capture": "off"}, "off", "raise")
    assert expected == (
        dict(config.rules),
        config.action("nested_capture"),
        config.action("capture_disabled"),
    )


def test_rules_cannot_be_changed_after_build() -> None:
    """A Config's rules cannot be changed in place either: the whole configuration is frozen."""
    config = cgguard.Config(rules={"nested_capture": "log"})
    with pytest.raises(TypeError):
        config.rules["nested_capture"] = "off"  # type: ignore[index]
    assert config.action("nested_capture") == "log"


def test_equal_configs_hash_equal() -> None:
    """A frozen Config is hashable, and equal configurations hash equal."""
    first = cgguard.Config(mode="log", rules={"nested_capture": "off"})
    second = cgguard.Config(mode="log", rules={"nested_capture": "off"})
    assert hash(first) == hash(second)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (
            "raise",
            {
                "capture_disabled": "raise",
                "nested_capture": "raise",
                "implicit_sync": "raise",
                "dead_input": "raise",
                "stale_binding": "raise",
                "rng_during_capture": "raise",
                "concurrent_capture": "log",
                "sync_during_capture": "log",
                "abandoned_capture": "log",
                "first_use_in_capture": "log",
                "rank_divergence": "log",
            },
        ),
        (
            "log",
            {
                "capture_disabled": "log",
                "nested_capture": "log",
                "implicit_sync": "log",
                "dead_input": "log",
                "stale_binding": "log",
                "rng_during_capture": "log",
                "concurrent_capture": "log",
                "sync_during_capture": "log",
                "abandoned_capture": "log",
                "first_use_in_capture": "log",
                "rank_divergence": "log",
            },
        ),
    ],
)
def test_action_defaults(mode: str, expected: dict[str, str]) -> None:
    """Unset rules: capture_disabled, nested_capture and the inspection's rules follow mode;
    the diagnostics log."""
    config = cgguard.Config(mode=mode)  # type: ignore[arg-type]
    assert expected == {rule: config.action(rule) for rule in RULES}


@pytest.mark.parametrize("mode", ["raise", "log"])
def test_action_set_per_rule_wins_over_mode(mode: str) -> None:
    """A rule's own action is used whatever the mode; unset rules keep their defaults."""
    config = cgguard.Config(
        mode=mode,  # type: ignore[arg-type]
        rules={
            "capture_disabled": "off",
            "concurrent_capture": "raise",
            "sync_during_capture": "off",
        },
    )
    expected = {
        "capture_disabled": "off",
        "nested_capture": mode,
        "concurrent_capture": "raise",
        "sync_during_capture": "off",
        "abandoned_capture": "log",
        "implicit_sync": mode,
        "dead_input": mode,
        "stale_binding": mode,
        "rng_during_capture": mode,
        "first_use_in_capture": "log",
        "rank_divergence": "log",
    }
    assert expected == {rule: config.action(rule) for rule in RULES}


@pytest.mark.parametrize(
    ("kwargs", "target"),
    [
        ({}, "stderr"),
        ({"log_file": "cg.log"}, "file"),
        ({"log_file": "cg.log", "log_target": "file"}, "file"),
        ({"log_file": "cg.log", "log_target": "stderr"}, "stderr"),
        ({"log_file": "cg.log", "log_target": "logging"}, "logging"),
        ({"log_target": "logging"}, "logging"),
        ({"log_target": "stderr"}, "stderr"),
    ],
)
def test_target(kwargs: dict[str, Any], target: str) -> None:
    """target(): the explicit log_target, else the file when log_file is set, else stderr."""
    assert target == cgguard.Config(**kwargs).target()


def test_from_environ_every_variable(capsys: pytest.CaptureFixture[str]) -> None:
    """Every CGGUARD_* variable set gives the Config they spell, silently."""
    environ = {
        "CGGUARD_MODE": "log",
        "CGGUARD_LOG_FORMAT": "json",
        "CGGUARD_LOG_FILE": "/srv/cg/events.jsonl",
        "CGGUARD_LOG_TARGET": "file",
        "CGGUARD_REPORT": "/srv/cg/report-{pid}.json",
        "CGGUARD_CAPTURE": "enabled",
        "CGGUARD_SIMULATE_CUDA": "yes",
        "CGGUARD_VLLM_BRIDGE": "0",
        "CGGUARD_RULE_CAPTURE_DISABLED": "log",
        "CGGUARD_RULE_NESTED_CAPTURE": "off",
        "CGGUARD_RULE_CONCURRENT_CAPTURE": "raise",
        "CGGUARD_RULE_SYNC_DURING_CAPTURE": "off",
    }
    expected = cgguard.Config(
        mode="log",
        rules={
            "capture_disabled": "log",
            "nested_capture": "off",
            "concurrent_capture": "raise",
            "sync_during_capture": "off",
        },
        log_format="json",
        log_file="/srv/cg/events.jsonl",
        log_target="file",
        report="/srv/cg/report-{pid}.json",
        capture="enabled",
        simulate_cuda=True,
        vllm_bridge=False,
    )
    assert expected == cgguard.Config.from_environ(environ)
    assert capsys.readouterr() == ("", "")


def test_from_environ_nothing_set(capsys: pytest.CaptureFixture[str]) -> None:
    """No CGGUARD_* variable (other variables ignored) gives the default Config."""
    assert cgguard.Config() == cgguard.Config.from_environ({"HOME": "/root", "MODE": "log"})
    assert capsys.readouterr() == ("", "")


def test_from_environ_bad_value_warns_and_uses_default(capsys: pytest.CaptureFixture[str]) -> None:
    """A rejected value falls back, with exactly one stderr line naming the value in force: the
    default, or for the mode the least disruptive one, log (a mistyped mode never makes a
    process raise)."""
    environ = {"CGGUARD_MODE": "rase", "CGGUARD_LOG_FORMAT": "console", "CGGUARD_CAPTURE": "x"}
    assert cgguard.Config(mode="log", log_format="console") == cgguard.Config.from_environ(environ)
    expected_err = (
        "cgguard: ignoring CGGUARD_MODE='rase': accepted values are raise, log; using log\n"
        "cgguard: ignoring CGGUARD_CAPTURE='x': accepted values are enabled, disabled; "
        "using as it is (enabled at start)\n"
    )
    assert ("", expected_err) == capsys.readouterr()


def test_from_environ_bad_value_warns_once(capsys: pytest.CaptureFixture[str]) -> None:
    """Reading the same rejected value again does not repeat the warning."""
    environ = {"CGGUARD_SIMULATE_CUDA": "maybe"}
    cgguard.Config.from_environ(environ)
    cgguard.Config.from_environ(environ)
    expected_err = (
        "cgguard: ignoring CGGUARD_SIMULATE_CUDA='maybe': "
        "accepted values are 1/true/yes/on or 0/false/no/off; using off\n"
    )
    assert ("", expected_err) == capsys.readouterr()


def test_from_environ_warn_false_is_silent(capsys: pytest.CaptureFixture[str]) -> None:
    """warn=False still ignores a rejected value, but prints nothing."""
    environ = {"CGGUARD_MODE": "rase", "CGGUARD_CAPTURE": "sometimes"}
    assert cgguard.Config(mode="log") == cgguard.Config.from_environ(environ, warn=False)
    assert capsys.readouterr() == ("", "")


def test_from_environ_empty_values_are_unset(capsys: pytest.CaptureFixture[str]) -> None:
    """An empty variable counts as unset: the default, and no warning."""
    environ = dict.fromkeys(
        [
            "CGGUARD_MODE",
            "CGGUARD_LOG_FORMAT",
            "CGGUARD_LOG_FILE",
            "CGGUARD_LOG_TARGET",
            "CGGUARD_REPORT",
            "CGGUARD_CAPTURE",
            "CGGUARD_SIMULATE_CUDA",
            "CGGUARD_VLLM_BRIDGE",
            "CGGUARD_RULE_CAPTURE_DISABLED",
            "CGGUARD_RULE_NESTED_CAPTURE",
            "CGGUARD_RULE_CONCURRENT_CAPTURE",
            "CGGUARD_RULE_SYNC_DURING_CAPTURE",
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
        "CGGUARD_LOG_TARGET": " Logging",
        "CGGUARD_CAPTURE": "\tDISABLED\n",
        "CGGUARD_SIMULATE_CUDA": " TRUE ",
        "CGGUARD_VLLM_BRIDGE": "No ",
        "CGGUARD_RULE_NESTED_CAPTURE": " OFF",
        "CGGUARD_RULE_SYNC_DURING_CAPTURE": "Raise\n",
    }
    expected = cgguard.Config(
        mode="log",
        rules={"nested_capture": "off", "sync_during_capture": "raise"},
        log_format="console",
        log_target="logging",
        capture="disabled",
        simulate_cuda=True,
        vllm_bridge=False,
    )
    assert expected == cgguard.Config.from_environ(environ)


def test_from_environ_log_file_is_free_text() -> None:
    """CGGUARD_LOG_FILE is taken verbatim: neither folded in case nor stripped."""
    environ = {"CGGUARD_LOG_FILE": " /Data/Run 1/CG.LOG "}
    expected = cgguard.Config(log_file=" /Data/Run 1/CG.LOG ")
    assert expected == cgguard.Config.from_environ(environ)


def test_from_environ_report_is_free_text() -> None:
    """CGGUARD_REPORT is taken verbatim, {pid} and all: neither folded in case nor stripped."""
    environ = {"CGGUARD_REPORT": " /Data/Run 1/Report-{pid}.JSON "}
    expected = cgguard.Config(report=" /Data/Run 1/Report-{pid}.JSON ")
    assert expected == cgguard.Config.from_environ(environ)


def test_from_environ_bad_rule_action_warns_and_uses_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A rule variable with an unknown action is ignored with one line; other rules still apply."""
    environ = {
        "CGGUARD_RULE_NESTED_CAPTURE": "warn",
        "CGGUARD_RULE_CONCURRENT_CAPTURE": "off",
    }
    config = cgguard.Config.from_environ(environ)
    expected_err = (
        "cgguard: ignoring CGGUARD_RULE_NESTED_CAPTURE='warn': "
        "accepted values are raise, log, off; using the rule's default action\n"
    )
    assert (cgguard.Config(rules={"concurrent_capture": "off"}), ("", expected_err)) == (
        config,
        capsys.readouterr(),
    )
    expected = ("raise", "off")
    assert expected == (config.action("nested_capture"), config.action("concurrent_capture"))


def test_from_environ_file_target_without_log_file_warns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """CGGUARD_LOG_TARGET=file without CGGUARD_LOG_FILE is ignored with one line, not an error."""
    environ = {"CGGUARD_LOG_TARGET": "file", "CGGUARD_MODE": "log"}
    expected_err = "cgguard: ignoring CGGUARD_LOG_TARGET='file': CGGUARD_LOG_FILE is not set\n"
    assert (cgguard.Config(mode="log"), ("", expected_err)) == (
        cgguard.Config.from_environ(environ),
        capsys.readouterr(),
    )


def test_from_environ_file_target_without_log_file_warn_false_is_silent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """warn=False drops CGGUARD_LOG_TARGET=file without CGGUARD_LOG_FILE silently."""
    environ = {"CGGUARD_LOG_TARGET": "file"}
    assert (cgguard.Config(), ("", "")) == (
        cgguard.Config.from_environ(environ, warn=False),
        capsys.readouterr(),
    )


@pytest.mark.parametrize(
    ("field", "raw", "value"),
    [
        ("mode", "log", "log"),
        ("log_format", "json", "json"),
        ("log_file", "/srv/cg.log", "/srv/cg.log"),
        ("log_target", "stderr", "stderr"),
        ("report", "/srv/r.json", "/srv/r.json"),
        ("capture", "disabled", "disabled"),
        ("simulate_cuda", "1", True),
        ("vllm_bridge", "0", False),
        ("exempt", "capture_disabled=vllm_plugin.", (("capture_disabled", "vllm_plugin."),)),
        ("exempt_file", "/srv/exempt.txt", "/srv/exempt.txt"),
        (
            "windows",
            "pkg.mod:Runner.capture_model,pkg:on",
            ("pkg.mod:Runner.capture_model", "pkg:on"),
        ),
        ("profiles", "RAISE", "raise"),
        ("census", "0", False),
        ("census_replays", "yes", True),
        ("metrics", "Prometheus", "prometheus"),
        ("log_level", "WARNING", "warning"),
        ("manifest", "off", False),
        ("rank_check", "1", True),
    ],
)
def test_each_field_but_rules_is_read_from_the_variable_named_after_it(
    field: str, raw: str, value: object
) -> None:
    """CGGUARD_<FIELD> (CGGUARD_WINDOW for windows) sets that field, and no other; Config has
    no field it does not read."""
    import dataclasses

    assert sorted(f.name for f in dataclasses.fields(cgguard.Config)) == sorted(DEFAULTS)
    variable = "CGGUARD_WINDOW" if field == "windows" else f"CGGUARD_{field.upper()}"
    got = dataclasses.asdict(cgguard.Config.from_environ({variable: raw}))
    assert got == {**DEFAULTS, field: value}


def test_paths_may_be_path_like() -> None:
    """log_file and report take os.PathLike paths, kept as plain str: equal, hashable, JSON."""
    import json
    import pathlib

    config = cgguard.Config(
        log_file=pathlib.PurePosixPath("logs/cg.log"),  # type: ignore[arg-type]
        report=pathlib.PurePosixPath("reports/cg-{pid}.json"),  # type: ignore[arg-type]
    )
    expected = cgguard.Config(log_file="logs/cg.log", report="reports/cg-{pid}.json")
    assert (expected, hash(expected), str, str) == (
        config,
        hash(config),
        type(config.log_file),
        type(config.report),
    )
    assert json.dumps(expected.as_dict()) == json.dumps(config.as_dict())


def test_str_subclasses_are_kept_as_plain_str() -> None:
    """A str subclass (a str-valued Enum, say) is accepted by value and kept as a plain str."""
    import enum

    class Mode(str, enum.Enum):
        LOG = "log"

    class Text(str):
        pass

    config = cgguard.Config(
        mode=Mode.LOG,  # type: ignore[arg-type]
        rules={Text("nested_capture"): Unequal("off")},  # type: ignore[dict-item]
        log_file=Text("cg.log"),
        capture=Text("disabled"),  # type: ignore[arg-type]
    )
    expected = cgguard.Config(
        mode="log", rules={"nested_capture": "off"}, log_file="cg.log", capture="disabled"
    )
    kept = [config.mode, config.log_file, config.capture, *config.rules, *config.rules.values()]
    assert (expected, {str}) == (config, {type(value) for value in kept})


class Unequal(str):
    """A str whose comparisons raise."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing")

    __hash__ = str.__hash__


class Unprintable:
    """An object whose repr and str raise."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


class BrokenPath:
    """An os.PathLike whose __fspath__ raises."""

    def __fspath__(self) -> str:
        raise RuntimeError("no path")

    def __repr__(self) -> str:
        return "BrokenPath()"


class BytesPath:
    """An os.PathLike that gives bytes."""

    def __fspath__(self) -> bytes:
        return b"cg.log"

    def __repr__(self) -> str:
        return "BytesPath()"


class PosingAsStr:
    """An object that says it is a str (``__class__``) without being one."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        return str

    def __repr__(self) -> str:
        return "PosingAsStr()"


class BrokenMapping(dict[str, str]):
    """A mapping whose items() raises."""

    def items(self) -> Any:
        raise RuntimeError("no items")


class PairsOfThree(dict[str, str]):
    """A mapping whose items() are not pairs."""

    def items(self) -> Any:
        return [("nested_capture", "off", "extra")]


# Values no field accepts, none of which may escape as anything but a ConfigError.
NASTY = [
    pytest.param([], id="list"),
    pytest.param({}, id="dict"),
    pytest.param({"log"}, id="set"),
    pytest.param(b"log", id="bytes"),
    pytest.param(bytearray(b"log"), id="bytearray"),
    pytest.param(1.5, id="float"),
    pytest.param(Unequal("\0"), id="raising __eq__"),
    pytest.param(Unprintable(), id="raising __repr__"),
    pytest.param(BrokenPath(), id="raising __fspath__"),
    pytest.param(BytesPath(), id="bytes __fspath__"),
    pytest.param(PosingAsStr(), id="posing as str"),
    pytest.param(object(), id="object"),
    pytest.param(cgguard.Config, id="a class"),
    pytest.param("a\0b", id="NUL"),
    pytest.param(" ", id="blank"),
]


# What exempt reads as no exemptions, and windows as no windows, as rules reads {}: nothing for
# them to refuse.
NO_EXEMPTIONS = ("list", "dict", "blank")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param(field, nasty.values[0], id=f"{nasty.id}-{field}")
        for field in DEFAULTS
        if field != "rules"
        for nasty in NASTY
        if not (field in ("exempt", "windows") and nasty.id in NO_EXEMPTIONS)
    ],
)
def test_any_bad_value_is_a_one_line_config_error(field: str, value: object) -> None:
    """Whatever the value, a field that refuses it raises ConfigError, one line naming it."""
    with pytest.raises(cgguard.ConfigError) as info:
        cgguard.Config(**{field: value})
    message = str(info.value)
    expected = (True, 1)
    assert expected == (message.startswith(f"Config({field}="), len(message.splitlines()))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"log_file": "a\0b"}, f"Config(log_file='a\\x00b'): accepted values are {PATHS}"),
        ({"report": " "}, f"Config(report=' '): accepted values are {PATHS}"),
        ({"report": b"r.json"}, f"Config(report=b'r.json'): accepted values are {PATHS}"),
        ({"log_file": BytesPath()}, f"Config(log_file=BytesPath()): accepted values are {PATHS}"),
        (
            {"log_file": BrokenPath()},
            f"Config(log_file=BrokenPath()): accepted values are {PATHS}",
        ),
        (
            {"mode": Unequal("lg")},
            "Config(mode='lg'): accepted values are 'raise', 'log'",
        ),
        ({"mode": ["log"]}, "Config(mode=['log']): accepted values are 'raise', 'log'"),
        (
            {"capture": PosingAsStr()},
            "Config(capture=PosingAsStr()): accepted values are None, 'enabled', 'disabled'",
        ),
        (
            {"mode": "x" * 10_000},
            f"Config(mode='{'x' * 199}... (10000 characters)): accepted values are 'raise', 'log'",
        ),
        ({"rules": {1: "off"}}, f"Config(rules={{1: 'off'}}): {RULES_ACCEPTED}"),
        (
            {"rules": {"nested_capture": ["off"]}},
            f"Config(rules={{'nested_capture': ['off']}}): {RULES_ACCEPTED}",
        ),
        (
            {"rules": {"nested_capture": Unequal("of")}},
            f"Config(rules={{'nested_capture': 'of'}}): {RULES_ACCEPTED}",
        ),
        (
            {"rules": {("nested_capture",): "off"}},
            f"Config(rules={{('nested_capture',): 'off'}}): {RULES_ACCEPTED}",
        ),
        (
            {"rules": [("nested_capture", "off")]},
            "Config(rules=[('nested_capture', 'off')]): "
            "accepted values are a mapping of rule to action",
        ),
        (
            {"rules": BrokenMapping()},
            "Config(rules={}): accepted values are a mapping of rule to action",
        ),
        (
            {"rules": PairsOfThree()},
            "Config(rules={}): accepted values are a mapping of rule to action",
        ),
    ],
)
def test_hostile_values_message(kwargs: dict[str, Any], message: str) -> None:
    """Paths of bytes, NUL or blank, objects that fail, non-str rule keys: ConfigError, one line."""
    with pytest.raises(cgguard.ConfigError) as info:
        cgguard.Config(**kwargs)
    assert message == str(info.value)


def test_unprintable_value_is_named_by_its_type() -> None:
    """A value whose repr raises is named in the message by its type and address."""
    value = Unprintable()
    with pytest.raises(cgguard.ConfigError) as info:
        cgguard.Config(mode=value)  # type: ignore[arg-type]
    assert f"Config(mode={object.__repr__(value)}): accepted values are 'raise', 'log'" == str(
        info.value
    )


def test_from_environ_never_raises_for_a_mapping_built_in_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A NUL in a path or a value that is not text: warned and ignored, never an exception."""
    environ = {"CGGUARD_REPORT": "r\0.json", "CGGUARD_LOG_FILE": b"cg.log", "CGGUARD_MODE": "log"}
    config = cgguard.Config.from_environ(environ)  # type: ignore[arg-type]
    expected_err = (
        "cgguard: ignoring CGGUARD_LOG_FILE=b'cg.log': "
        "accepted values are a path (not blank, no NUL character); using none\n"
        "cgguard: ignoring CGGUARD_REPORT='r\\x00.json': "
        "accepted values are a path (not blank, no NUL character); using none\n"
    )
    assert (cgguard.Config(mode="log"), ("", expected_err)) == (config, capsys.readouterr())


def test_the_signature_type_checkers_see_is_the_fields() -> None:
    """The __init__ written for type checkers names Config's fields, in order, with no others."""
    import ast
    import inspect

    from cgguard._config import config as _config

    tree = ast.parse(inspect.getsource(_config.Config))
    (init,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    declared = [arg.arg for arg in init.args.args[1:]]
    assert [f.name for f in dataclasses.fields(cgguard.Config)] == declared
