"""cgguard's settings, declared once: each Config field with its variable, values and default.

Config's validation, the CGGUARD_* parser, the runner's options and ``cgguard info`` are all
derived from ``SETTINGS`` and from the rule table (one CGGUARD_RULE_<RULE> per rule).
"""

# Read on the start-up path of every process that sets a CGGUARD_* variable, before torch:
# standard library only, and no ``typing`` at runtime (it alone costs most of a bare
# interpreter's start-up).
from cgguard._rules import ACTIONS, NAMES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
BOOL = TRUE + FALSE  # the accepted spellings of a boolean, in any case
PATH = ()  # free text: a path

ENABLED = "CGGUARD_ENABLED"
RULE_PREFIX = "CGGUARD_RULE_"


class Setting:
    """One Config field: its variable, what it accepts, its default, and what unset means."""

    __slots__ = ("choices", "default", "field", "unset", "variable")

    def __init__(
        self, field: str, choices: "tuple[str, ...]", default: "Any", unset: str = ""
    ) -> None:
        self.field = field
        self.variable = "CGGUARD_" + field.upper()
        # BOOL for a boolean, PATH for free text, else the accepted values.
        self.choices = choices
        self.default: Any = default
        self.unset = unset  # what None means, for people (cgguard info)

    @property
    def option(self) -> str:
        """The runner's option: ``--log-file``; a boolean is a switch away from its default."""
        name = self.field.replace("_", "-")
        return f"--no-{name}" if self.choices is BOOL and self.default else f"--{name}"

    def parse(self, raw: str) -> object:
        """The value of ``raw`` (case-insensitive); None when it is not accepted."""
        if self.choices is PATH:
            return raw
        if self.choices is BOOL:
            return parse_bool(raw)
        folded = raw.strip().lower()
        return folded if folded in self.choices else None


SETTINGS: "dict[str, Setting]" = {
    s.field: s
    for s in (
        Setting("mode", ("raise", "log"), "raise"),
        Setting(
            "log_format", ("json", "console"), None, "json, or console when stderr is a terminal"
        ),
        Setting("log_file", PATH, None, "none"),
        Setting("log_target", ("stderr", "file", "logging"), None),
        Setting("report", PATH, None, "none"),
        Setting("capture", ("enabled", "disabled"), None, "as it is (enabled at start)"),
        Setting("simulate_cuda", BOOL, False),
        Setting("vllm_bridge", BOOL, True),
    )
}

RULE_VARIABLES = {RULE_PREFIX + rule.upper(): rule for rule in NAMES}


def parse_bool(value: str) -> "bool | None":
    """True or False for the accepted spellings (any case), None for anything else."""
    folded = value.strip().lower()
    if folded in TRUE:
        return True
    if folded in FALSE:
        return False
    return None


def accepted(choices: "tuple[str, ...]") -> str:
    """The accepted values, as an error message lists them."""
    if choices is BOOL:
        return "1/true/yes/on or 0/false/no/off"
    if choices is PATH:
        return "a path"
    return ", ".join(choices)


def read(environ: "Mapping[str, str]") -> "tuple[dict[str, object], dict[str, str], list[str]]":
    """Parse the CGGUARD_* variables of ``environ``.

    Returns the Config fields that were set, the variable each came from, and one line per
    value that was ignored because it is not accepted. An empty or blank value counts as unset.
    """
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    problems: list[str] = []
    for setting in SETTINGS.values():
        raw = environ.get(setting.variable, "")
        if not raw.strip():
            continue
        value = setting.parse(raw)
        if value is None:
            problems.append(
                f"ignoring {setting.variable}={raw!r}: accepted values are "
                f"{accepted(setting.choices)}"
            )
            continue
        values[setting.field] = value
        sources[setting.field] = setting.variable
    if values.get("log_target") == "file" and "log_file" not in values:
        problems.append("ignoring CGGUARD_LOG_TARGET='file': CGGUARD_LOG_FILE is not set")
        del values["log_target"], sources["log_target"]
    rules = _read_rules(environ, sources, problems)
    if rules:
        values["rules"] = rules
    return values, sources, problems


def _read_rules(
    environ: "Mapping[str, str]", sources: "dict[str, str]", problems: "list[str]"
) -> "dict[str, str]":
    """The CGGUARD_RULE_<RULE> settings; adds to ``sources`` and ``problems`` as read() does."""
    for name in environ:
        if name.startswith(RULE_PREFIX) and name not in RULE_VARIABLES:
            names = ", ".join(RULE_VARIABLES)
            problems.append(f"ignoring {name}: no such rule; the rule variables are {names}")
    rules: dict[str, str] = {}
    for name, rule in RULE_VARIABLES.items():
        raw = environ.get(name, "")
        folded = raw.strip().lower()
        if not folded:
            continue
        if folded not in ACTIONS:
            problems.append(f"ignoring {name}={raw!r}: accepted values are {accepted(ACTIONS)}")
            continue
        rules[rule] = folded
        sources[f"rules.{rule}"] = name
    return rules


def is_enabled(environ: "Mapping[str, str]") -> "bool | None":
    """CGGUARD_ENABLED as a boolean; None when unset or empty, or not an accepted spelling."""
    raw = environ.get(ENABLED, "")
    return parse_bool(raw) if raw else None
