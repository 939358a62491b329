"""cgguard's settings, declared once: each Config field with its variable, values and default.

Config's validation, the CGGUARD_* parser, the runner's options and ``cgguard info`` are all
derived from ``SETTINGS`` and from the rule table (one CGGUARD_RULE_<RULE> per rule).
"""

# Read on the start-up path of every process that sets a CGGUARD_* variable, before torch:
# standard library only, and no ``typing`` at runtime (it alone costs most of a bare
# interpreter's start-up).
import os

from cgguard import _boot
from cgguard._boot import ENABLED
from cgguard._rules.table import ACTIONS, NAMES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from cgguard._rules.exempt_syntax import Pair

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
BOOL = TRUE + FALSE  # the accepted spellings of a boolean, in any case
PATH = ()  # free text: a path
# exemptions: RULE=PLACE entries, separated by ";" (cgguard._rules.exempt_syntax)
EXEMPT = ("RULE=PLACE",)
WINDOWS = ("module:qualname",)  # capture windows: entries separated by "," (cgguard._gate.windows)
WINDOW_SEPARATOR = ","
COUNT = ("N",)  # a whole number, 1 or more
WINDOW_SYNTAX = (
    "module:qualname, naming a function or method (a capture window while it runs), or a "
    "module attribute, a ContextVar or a threading.local's attribute (module:local.attr), "
    "true while captures belong"
)

# The levels of cgguard's events, least severe first (CGGUARD_LOG_LEVEL).
LEVELS = ("debug", "info", "warning", "error")

PREFIX = "CGGUARD_"
RULE_PREFIX = "CGGUARD_RULE_"

# A value quoted in a message is cut to this many characters of its repr: enough to recognise a
# path or to spot a typo, while a runaway value (a file's contents pasted into a variable) still
# makes one readable line rather than ten thousand characters of it.
SHOWN = 200


class Setting:
    """One Config field: its variable, what it accepts, its default, and what unset means."""

    __slots__ = ("choices", "default", "fallback", "field", "help", "name", "unset", "variable")

    def __init__(
        self,
        field: str,
        choices: "tuple[str, ...]",
        default: "Any",
        unset: str = "",
        *,
        name: str = "",
        fallback: "Any" = None,
        help: str = "",
    ) -> None:
        self.field = field
        # What the setting does, a sentence for people: the runner's --help.
        self.help = help
        # The variable's and the option's name, where it is not the field's: one window each.
        self.name = name or field
        self.variable = "CGGUARD_" + self.name.upper()
        # BOOL for a boolean, PATH for free text, else the accepted values.
        self.choices = choices
        self.default: Any = default
        self.unset = unset  # what None means, for people (cgguard info)
        # What a value cgguard does not accept gives way to: the default, unless a setting
        # names a less disruptive one (the mode: a mistyped mode never makes a process raise).
        self.fallback: Any = default if fallback is None else fallback

    def words(self, value: "Any") -> str:
        """``value`` as a warning names the value in force."""
        if value is None or value == ():
            return self.unset or "none"
        if self.choices is BOOL:
            return "on" if value else "off"
        return str(value)

    @property
    def option(self) -> str:
        """The runner's option: ``--log-file``; a boolean's has a ``--no-`` form as well."""
        return "--" + self.name.replace("_", "-")

    def parse(self, raw: str) -> object:
        """The value of ``raw`` (case-insensitive); None when it is not accepted."""
        if self.choices is PATH:
            return raw if is_path(raw) else None
        if self.choices is BOOL:
            return parse_bool(raw)
        if self.choices is EXEMPT:
            from cgguard._rules import exempt_syntax as _exempt_syntax

            pairs = tuple(_exempt_syntax.parse(raw)[0])
            return pairs or None
        if self.choices is WINDOWS:
            return tuple(window_entries(raw)[0]) or None
        if self.choices is COUNT:
            return parse_count(raw)
        folded = raw.strip().lower()
        return folded if folded in self.choices else None


SETTINGS: "dict[str, Setting]" = {
    s.field: s
    for s in (
        Setting(
            "mode",
            ("raise", "log"),
            "raise",
            fallback="log",
            help=(
                "what a broken capture rule does: raise stops the offending call with an "
                "exception, log reports it and lets the call go on (and fail as CUDA fails)"
            ),
        ),
        Setting(
            "log_format",
            ("json", "console"),
            None,
            "json, or console when stderr is a terminal",
            help=(
                "how events are written: one JSON object a line, or console's coloured lines "
                "(json by default, console when events go to a terminal)"
            ),
        ),
        Setting(
            "log_file",
            PATH,
            None,
            "none",
            help=(
                "append events to this file, in every process of the program (e.g. "
                "/var/log/cgguard.jsonl)"
            ),
        ),
        Setting(
            "log_target",
            ("stderr", "file", "logging"),
            None,
            "stderr, or the log file when set",
            help=(
                "where events go: stderr, the --log-file, or the standard library logger "
                "'cgguard' (logging)"
            ),
        ),
        # The least severe event written to the log; every event still reaches the report,
        # the census, the metrics and pytest's plugin.
        Setting(
            "log_level",
            LEVELS,
            "debug",
            help=(
                "the least severe event written to the log: debug (every event, exempted captures"
                " included), info (the census at exit), warning (logged violations, the summary) "
                "or error (raised violations); the report and the metrics still count every one"
            ),
        ),
        Setting(
            "report",
            PATH,
            None,
            "none",
            help=(
                "write a JSON report of violations and the capture census to PATH at exit and as "
                "violations appear; {pid} becomes each process's id (e.g. --report "
                "'reports/r-{pid}.json'), read them with 'cgguard report'"
            ),
        ),
        Setting(
            "capture",
            ("enabled", "disabled"),
            None,
            "as it is (enabled at start)",
            help=(
                "the capture flag at start: disabled refuses every capture until the program "
                "calls cgguard.set_capture_enabled(True)"
            ),
        ),
        Setting(
            "simulate_cuda",
            BOOL,
            False,
            help=("run on cgguard's simulated CUDA runtime, for demos and CI without a GPU"),
        ),
        Setting(
            "vllm_bridge",
            BOOL,
            True,
            help=("follow vLLM's own capture flag, so a capture vLLM would refuse is refused"),
        ),
        Setting(
            "exempt",
            EXEMPT,
            (),
            "none",
            help=("let these captures break a rule without a violation"),
        ),
        Setting(
            "exempt_file",
            PATH,
            None,
            "none",
            help=("read exemptions from a file, one RULE=PLACE a line, '#' starts a comment"),
        ),
        Setting(
            "windows",
            WINDOWS,
            (),
            "none",
            name="window",
            help=(
                "let captures happen only while these functions run or these flags are true (e.g."
                " --window 'mypkg.runner:Runner.capture_model')"
            ),
        ),
        # The built-in profiles (cgguard._gate.profiles): on, with their refusals logged even in
        # raise mode (their first release), "raise" to let the mode decide, or "off".
        Setting(
            "profiles",
            ("log", "raise", "off"),
            "log",
            help=(
                "vLLM's, SGLang's and TensorRT-LLM's built-in capture windows: log their "
                "refusals, let --mode decide (raise), or leave them off"
            ),
        ),
        Setting(
            "inspect",
            BOOL,
            False,
            help=(
                "watch each capture op by op and each replay: .item() and other implicit "
                "synchronizes, RNG calls, replays of graphs whose inputs were freed or rebound"
            ),
        ),
        Setting(
            "inspect_first",
            COUNT,
            None,
            "every capture of each site",
            help=(
                "inspect only the first N captures of each site (e.g. 3), to bound the cost in a "
                "long-running server"
            ),
        ),
        Setting(
            "census",
            BOOL,
            True,
            help=(
                "count, time and weigh every capture per site, and torch.compile's skipped "
                "cudagraphs, printed at exit and written to the report"
            ),
        ),
        Setting(
            "census_replays",
            BOOL,
            False,
            help=("count each graph's replays in the census too (wraps CUDAGraph.replay)"),
        ),
        Setting(
            "metrics",
            ("prometheus",),
            None,
            "none",
            help=(
                "export cgguard's counters to prometheus_client's default registry, for the "
                "/metrics endpoint the program serves"
            ),
        ),
        # The capture manifest, where the process is one rank of a job, and its live check.
        Setting(
            "manifest",
            BOOL,
            True,
            help=(
                "keep the capture manifest where the process is one rank of a job: each capture "
                "in order, with the collectives issued inside it, for 'cgguard report' to compare"
                " the ranks"
            ),
        ),
        Setting(
            "rank_check",
            BOOL,
            False,
            help=(
                "compare the ranks' manifests through torch.distributed's store when a capture "
                "window closes, and report the ranks that captured differently or never arrived"
            ),
        ),
    )
}

RULE_VARIABLES = {RULE_PREFIX + rule.upper(): rule for rule in NAMES}
# Every variable cgguard reads; any other CGGUARD_* name is a mistake worth a warning.
VARIABLES = (ENABLED, *(s.variable for s in SETTINGS.values()), *RULE_VARIABLES)
# Set by cgguard itself, for the processes a program starts: no setting, and no mistake.
REPORT_OWNER = "CGGUARD_REPORT_OWNER"


def is_path(text: str) -> bool:
    """Whether ``text`` can name a file: not blank (unset, to the environment), and no NUL."""
    return bool(text.strip()) and "\0" not in text


def shown(value: object) -> str:
    """``value`` as a message quotes it: its repr, cut to SHOWN characters with its length.

    Never raises: a value whose repr fails is shown by its type and address.
    """
    try:
        text = repr(value)
        if len(text) <= SHOWN:
            return text
        if type(value) is str:
            return f"{text[:SHOWN]}... ({len(value)} characters)"
        return f"{text[:SHOWN]}... (a repr of {len(text)} characters)"
    except Exception:
        return object.__repr__(value)


def _named(name: str) -> str:
    """A variable's name as a message gives it: cut as shown() cuts a value, without quotes."""
    return name if len(name) <= SHOWN else f"{name[:SHOWN]}... ({len(name)} characters)"


def parse_bool(value: str) -> "bool | None":
    """True or False for the accepted spellings (any case), None for anything else."""
    folded = value.strip().lower()
    if folded in TRUE:
        return True
    if folded in FALSE:
        return False
    return None


def parse_count(value: str) -> "int | None":
    """A whole number of 1 or more, written in ASCII digits; None for anything else.

    Not isdigit(): it is true for "²", which int() refuses.
    """
    text = value.strip()
    if not (text.isascii() and text.isdecimal()):
        return None
    number = int(text)
    return number if number >= 1 else None


def accepted(choices: "tuple[str, ...]") -> str:
    """The accepted values, as an error message lists them."""
    if choices is COUNT:
        return "a whole number, 1 or more"
    if choices is BOOL:
        return "1/true/yes/on or 0/false/no/off"
    if choices is PATH:
        return "a path (not blank, no NUL character)"
    if choices is EXEMPT:
        from cgguard._rules import exempt_syntax as _exempt_syntax

        return f"entries separated by {_exempt_syntax.SEPARATOR!r}, each {_exempt_syntax.SYNTAX}"
    if choices is WINDOWS:
        return f"entries separated by {WINDOW_SEPARATOR!r}, each {WINDOW_SYNTAX}"
    return ", ".join(choices)


def read(environ: "Mapping[str, str]") -> "tuple[dict[str, object], dict[str, str], list[str]]":
    """Parse the CGGUARD_* variables of ``environ``.

    Returns the Config fields that were set, the variable each came from, and one line per
    value that was ignored because it is not accepted, and per CGGUARD_* name that cgguard does
    not read. An empty or blank value counts as unset. Never raises for what ``environ`` holds:
    a mapping built in code may hold values that are not text, and they are ignored the same way.
    """
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    problems: list[str] = []
    for setting in SETTINGS.values():
        raw = environ.get(setting.variable, "")
        if isinstance(raw, str) and not raw.strip():
            continue
        if setting.choices is EXEMPT and isinstance(raw, str):
            # Only here, with exemptions given: start-up loads no more than it must.
            from cgguard._rules import exempt_syntax as _exempt_syntax

            # Each entry on its own: one mistyped entry must not drop the others.
            pairs, refused = _exempt_syntax.parse(raw)
            problems += [
                refused_entry(entry, reason, setting.variable) for entry, reason in refused
            ]
            if pairs:
                values[setting.field] = tuple(pairs)
                sources[setting.field] = setting.variable
                problems += catch_alls(pairs)
            continue
        if setting.choices is WINDOWS and isinstance(raw, str):
            windows, unformed = window_entries(raw)
            problems += [refused_window(entry, setting.variable) for entry in unformed]
            if windows:
                values[setting.field] = tuple(windows)
                sources[setting.field] = setting.variable
            continue
        value = setting.parse(raw) if isinstance(raw, str) else None
        if value is None:
            problems.append(
                f"ignoring {setting.variable}={shown(raw)}: accepted values are "
                f"{accepted(setting.choices)}; using {setting.words(setting.fallback)}"
            )
            if setting.fallback != setting.default:
                values[setting.field] = setting.fallback
                sources[setting.field] = setting.variable
            continue
        values[setting.field] = value
        sources[setting.field] = setting.variable
    if values.get("log_target") == "file" and "log_file" not in values:
        problems.append("ignoring CGGUARD_LOG_TARGET='file': CGGUARD_LOG_FILE is not set")
        del values["log_target"], sources["log_target"]
    if "exempt_file" in values:
        found, lines = exemptions_file(str(values["exempt_file"]))
        problems += lines + catch_alls(found)
    problems += [_unknown(name) for name in environ if _is_unknown(name)]
    rules = _read_rules(environ, sources, problems)
    if rules:
        values["rules"] = rules
    return values, sources, problems


def refused_entry(entry: str, reason: str, where: str) -> str:
    """The problem line of an exemption entry that is ignored, ``where`` it was given."""
    from cgguard._rules import exempt_syntax as _exempt_syntax

    line = f"ignoring the exemption {shown(entry)} in {where}: {reason}"
    if not reason.startswith("no rule"):  # that one lists what is accepted already
        line += f"; an entry is {_exempt_syntax.SYNTAX}"
    return line


def window_entries(raw: str) -> "tuple[list[str], list[str]]":
    """The capture windows of ``raw``, entries separated by commas, and the entries refused.

    An entry is ``module:qualname``: a dotted module name, a colon, dotted names within it.
    What it names (a function, or state to read) is known only once the module is imported.
    """
    entries: list[str] = []
    refused: list[str] = []
    for part in raw.split(WINDOW_SEPARATOR):
        entry = part.strip()
        if not entry:
            continue
        (entries if is_window(entry) else refused).append(entry)
    return list(dict.fromkeys(entries)), refused


def is_window(entry: str) -> bool:
    """Whether ``entry`` has a window's form, ``module:qualname``, each part of dotted names."""
    module, colon, qualname = entry.partition(":")
    return bool(colon) and all(
        name.isidentifier() for part in (module, qualname) for name in part.split(".")
    )


def refused_window(entry: str, where: str) -> str:
    """The problem line of a capture window entry that is ignored, ``where`` it was given."""
    return f"ignoring the capture window {shown(entry)} in {where}: an entry is {WINDOW_SYNTAX}"


def catch_alls(pairs: "Iterable[Pair]") -> "list[str]":
    """One problem line per exemption of ``pairs`` whose place matches every file: it applies,
    and lets every capture break its rule, which is seldom what was meant. The line names the
    entry, not where it was given, so that an entry read at start-up and again at install, or
    given in two places, is said once."""
    from cgguard._rules import exempt_syntax as _exempt_syntax

    return [
        f"the exemption {shown(_exempt_syntax.text(pair))} matches every file: it exempts "
        f"every capture from {pair[0]}; an exemption meant for one place names its file "
        "(*/vllm_plugin/kernels.py), module or module:qualname"
        for pair in pairs
        if _exempt_syntax.is_catch_all(pair[1])
    ]


def exemptions_file(path: str) -> "tuple[list[Pair], list[str]]":
    """The exemptions in the file at ``path``, and one problem line per entry ignored, or one
    for the whole file when it cannot be read."""
    from cgguard._rules import exempt_syntax as _exempt_syntax

    pairs, refused, unread = _exempt_syntax.parse_file(path)
    if unread is not None:
        return [], [f"ignoring the exemptions file {shown(path)}: {unread}"]
    return pairs, [
        refused_entry(entry, reason, f"{shown(path)} line {line}")
        for line, entry, reason in refused
    ]


def _read_rules(
    environ: "Mapping[str, str]", sources: "dict[str, str]", problems: "list[str]"
) -> "dict[str, str]":
    """The CGGUARD_RULE_<RULE> settings; adds to ``sources`` and ``problems`` as read() does."""
    rules: dict[str, str] = {}
    for name, rule in RULE_VARIABLES.items():
        raw = environ.get(name, "")
        folded = raw.strip().lower() if isinstance(raw, str) else None
        if folded == "":
            continue
        if folded not in ACTIONS:
            problems.append(
                f"ignoring {name}={shown(raw)}: accepted values are {accepted(ACTIONS)}; "
                "using the rule's default action"
            )
            continue
        rules[rule] = folded
        sources[f"rules.{rule}"] = name
    return rules


def _is_unknown(name: object) -> bool:
    return (
        isinstance(name, str)
        and name.startswith(PREFIX)
        and name not in VARIABLES
        and name != REPORT_OWNER
    )


def _unknown(name: str) -> str:
    """The problem line of a CGGUARD_* name cgguard does not read, with the closest known name."""
    return f"ignoring {_named(name)}: {_no_such(name, listing=True)}"


def _no_such(name: str, *, listing: bool = False) -> str:
    """ "no such variable", with the known name closest to ``name`` where one is close; with
    ``listing``, the known names where none is."""
    if name.startswith(RULE_PREFIX):
        known, what = tuple(RULE_VARIABLES), "rule"
        listed = f"the rule variables are {', '.join(known)}"
    else:
        known, what = VARIABLES, "variable"
        # The rule variables are compared too, but listed as one pattern.
        names = (v for v in VARIABLES if v not in RULE_VARIABLES)
        listed = f"the variables are {', '.join(names)}, {RULE_PREFIX}<RULE>"
    close = _closest(name, known)
    if close is not None:
        return f"no such {what}; did you mean {close}?"
    return f"no such {what}; {listed}" if listing else f"no such {what}"


def _closest(name: str, known: "tuple[str, ...]") -> "str | None":
    """The known name most like ``name``, if one is close enough to be the one meant."""
    # Only here, with a name already known to be wrong: difflib brings re and enum with it,
    # about 5 ms, more than half a bare interpreter's start-up.
    import difflib

    # Compared without the prefix they all share, which would make every name look close.
    cut = len(PREFIX) if not name.startswith(RULE_PREFIX) else len(RULE_PREFIX)
    suffixes = {k[cut:]: k for k in known}
    found = difflib.get_close_matches(name[cut:].upper(), suffixes, n=1)
    return suffixes[found[0]] if found else None


def is_enabled(environ: "Mapping[str, str]") -> "bool | None":
    """CGGUARD_ENABLED as a boolean; None when unset or empty, or not an accepted spelling."""
    raw = environ.get(ENABLED, "")
    return parse_bool(raw) if raw else None


def activation_says_on(default: bool) -> bool:
    """Whether activation goes on: CGGUARD_ENABLED parsed (``default`` when unset); if on,
    every bad CGGUARD_* value is reported, so that a typo is seen at start even by a process
    that never imports torch."""
    from cgguard._support.warn import warn_once

    enabled = is_enabled(os.environ)
    raw = os.environ.get(ENABLED, "")
    on = default if enabled is None else enabled
    if enabled is None and raw.strip():
        # Each start-up path (the .pth, a sitecustomize) has its own default: said once, as
        # the variable being unset, which is what each then does.
        line = (
            f"ignoring {ENABLED}={shown(raw)}: accepted values are {accepted(BOOL)}; "
            "treated as unset"
        )
        warn_once(line, line)
    if on:
        for line in read(os.environ)[2]:
            warn_once(line, line)
    return on


def say_if_off(_: object = None) -> None:
    """One line if CGGUARD_* variables are set and nothing has switched cgguard on: the
    ``cgguard.pth`` line's watch, called when torch is imported."""
    if _boot.activated_by is not None or _boot.switched_on:
        return
    line = unheeded("before torch was imported")
    if line is not None:
        from cgguard._support.warn import warn_once

        warn_once("off", line)


def unheeded(when: str, switch: str = f"{ENABLED}=1") -> "str | None":
    """The line saying that the set CGGUARD_* variables go unheeded, cgguard being off ``when``
    ("before torch was imported"), naming the ``switch`` that turns it on; None where none is
    set, or CGGUARD_ENABLED is (off: the choice is made). An empty CGGUARD_ENABLED is unset."""
    if os.environ.get(ENABLED, "").strip():
        return None
    names = sorted(
        n for n in os.environ if n.startswith(PREFIX) and n not in (ENABLED, REPORT_OWNER)
    )
    if not names:
        return None
    unknown = [n for n in names if _is_unknown(n)]
    verb = "is" if len(unknown or names) == 1 else "are"
    if unknown:
        # The likely cause first: a misspelt on-switch is a name cgguard does not read.
        said = ", ".join(f"{_named(n)} ({_no_such(n)})" for n in unknown)
        return f"{said} {verb} set, and nothing switched cgguard on {when}: {UNGUARDED}"
    said = ", ".join(_named(n) for n in names)
    return f"{said} {verb} set, but nothing switched cgguard on {when} ({switch} does): {UNGUARDED}"


UNGUARDED = "captures are not guarded"
