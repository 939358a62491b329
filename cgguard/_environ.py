"""The CGGUARD_* environment variables: their names, what each accepts, one parser for all."""

# Read on the start-up path of every process, before torch: standard library only, and no
# ``typing`` at runtime (it alone costs most of a bare interpreter's start-up).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
BOOL = TRUE + FALSE

ENABLED = "CGGUARD_ENABLED"

# variable: (Config field, accepted values: BOOL for a boolean, None for free text)
VARIABLES: "dict[str, tuple[str, tuple[str, ...] | None]]" = {
    "CGGUARD_MODE": ("mode", ("raise", "log")),
    "CGGUARD_LOG_FORMAT": ("log_format", ("json", "console")),
    "CGGUARD_LOG_FILE": ("log_file", None),
    "CGGUARD_LOG_TARGET": ("log_target", ("stderr", "file", "logging")),
    "CGGUARD_REPORT": ("report", None),
    "CGGUARD_CAPTURE": ("capture", ("enabled", "disabled")),
    "CGGUARD_SIMULATE_CUDA": ("simulate_cuda", BOOL),
    "CGGUARD_VLLM_BRIDGE": ("vllm_bridge", BOOL),
}

# The rules, each with its own variable CGGUARD_RULE_<NAME> = raise | log | off.
RULES = ("capture_disabled", "nested_capture", "concurrent_capture", "sync_during_capture")
ACTIONS = ("raise", "log", "off")
RULE_VARIABLES = {f"CGGUARD_RULE_{rule.upper()}": rule for rule in RULES}


def parse_bool(value: str) -> bool | None:
    """True or False for the accepted spellings (any case), None for anything else."""
    folded = value.strip().lower()
    if folded in TRUE:
        return True
    if folded in FALSE:
        return False
    return None


def accepted(choices: tuple[str, ...]) -> str:
    """The accepted values, as an error message lists them."""
    if choices is BOOL:
        return "1/true/yes/on or 0/false/no/off"
    return ", ".join(choices)


def read(environ: "Mapping[str, str]") -> tuple[dict[str, object], dict[str, str], list[str]]:
    """Parse the CGGUARD_* variables of ``environ``.

    Returns the Config fields that were set, the variable each came from, and one line per
    value that was ignored because it is not accepted. An empty or blank value counts as unset.
    """
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    problems: list[str] = []
    for name, (field, choices) in VARIABLES.items():
        raw = environ.get(name, "")
        if not raw.strip():
            continue
        value: object
        if choices is None:
            value = raw
        elif choices is BOOL:
            value = parse_bool(raw)
        else:
            folded = raw.strip().lower()
            value = folded if folded in choices else None
        if value is None:
            assert choices is not None  # noqa: S101 - free text is never rejected
            problems.append(f"ignoring {name}={raw!r}: accepted values are {accepted(choices)}")
            continue
        values[field] = value
        sources[field] = name
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
        if name.startswith("CGGUARD_RULE_") and name not in RULE_VARIABLES:
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


def is_enabled(environ: "Mapping[str, str]") -> bool | None:
    """CGGUARD_ENABLED as a boolean; None when unset or empty, or not an accepted spelling."""
    raw = environ.get(ENABLED, "")
    return parse_bool(raw) if raw else None
