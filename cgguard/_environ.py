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
VARIABLES: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "CGGUARD_MODE": ("mode", ("raise", "log")),
    "CGGUARD_LOG_FORMAT": ("log_format", ("json", "console")),
    "CGGUARD_LOG_FILE": ("log_file", None),
    "CGGUARD_CAPTURE": ("capture", ("enabled", "disabled")),
    "CGGUARD_SIMULATE_CUDA": ("simulate_cuda", BOOL),
}


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
    return values, sources, problems


def is_enabled(environ: "Mapping[str, str]") -> bool | None:
    """CGGUARD_ENABLED as a boolean; None when unset or empty, or not an accepted spelling."""
    raw = environ.get(ENABLED, "")
    return parse_bool(raw) if raw else None
