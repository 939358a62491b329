"""cgguard's configuration: one frozen value, built in code or from the environment."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Literal, NoReturn, cast

from cgguard._config import settings as _settings
from cgguard._config.settings import (
    BOOL,
    COUNT,
    EXEMPT,
    PATH,
    SETTINGS,
    WINDOW_SYNTAX,
    WINDOWS,
    Setting,
    is_path,
    is_window,
    shown,
    window_entries,
)
from cgguard._errors import ConfigError
from cgguard._rules import exempt_syntax as _exempt_syntax
from cgguard._rules.table import ACTIONS, NAMES, RULES
from cgguard._support.text import plain
from cgguard._support.warn import warn_once

Mode = Literal["raise", "log"]
Action = Literal["raise", "log", "off"]
LogFormat = Literal["json", "console"]
LogTarget = Literal["stderr", "file", "logging"]
LogLevel = Literal["debug", "info", "warning", "error"]
Capture = Literal["enabled", "disabled"]
Profiles = Literal["log", "raise", "off"]
Metrics = Literal["prometheus"]
# What Config(exempt=...) takes: "RULE=PLACE" entries (";" between them in one str), (rule,
# place) pairs, or a mapping of rule to places. It keeps the pairs.
Exempt = str | Iterable[str | tuple[str, str]] | Mapping[str, str | Iterable[str]] | None
# What Config(windows=...) takes: "module:qualname" entries ("," between them in one str), or
# an iterable of them. It keeps the entries, each once, in order.
Windows = str | Iterable[str] | None


class Rules(dict[str, Action]):
    """The per-rule actions of a Config: read-only and hashable, as the Config itself is."""

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a Config's rules cannot be changed: build a new Config")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[type[Rules], tuple[dict[str, Action]]]:
        # dict's own pickling refills through __setitem__, which a read-only dict refuses.
        return Rules, (dict(self),)


@dataclasses.dataclass(frozen=True)
class Config:
    """How cgguard acts on violations and where it reports them.

    ``mode``: "raise" refuses a violating capture with a CaptureViolation; "log" reports it and
    lets it go on. It is the action of capture_disabled and nested_capture; the diagnostics
    concurrent_capture and sync_during_capture log by default. ``rules`` sets any rule's
    action to "raise", "log" or "off". ``log_format``: "json" lines or structlog's "console"
    rendering; None picks console when stderr is a terminal, JSON otherwise. ``log_target``:
    "stderr", "file" (``log_file``) or "logging" (the standard library logger "cgguard");
    None means the file when ``log_file`` is set, stderr otherwise. ``report``: a path for
    the JSON report, ``{pid}`` expanded. Paths may be given as os.PathLike and are kept as
    str. ``capture``: the capture flag's value at install (None
    leaves it as it is). ``simulate_cuda``: put the simulated CUDA runtime in place at
    activation. ``vllm_bridge``: follow vLLM's capture flag when vLLM is imported.
    ``exempt``: exemptions, kept as (rule, place) pairs: a capture that breaks the rule goes
    ahead, counted, when the place (a module, a file glob or ``module:qualname``) is on its
    stack; given as "RULE=PLACE" entries (";" between them), pairs, or a mapping of rule to
    places. ``exempt_file``: a file of more exemptions, read at install (docs/exemptions.md).
    ``windows``: capture windows, "module:qualname" entries ("," between them in one str):
    once one has been entered and closed, a capture outside every open window breaks
    capture_disabled (docs/integrations.md#capture-windows). ``profiles``: the built-in
    profiles of vLLM, SGLang and TensorRT-LLM, each switched on when its framework's modules
    are imported: "log" (their refusals are logged even in raise mode), "raise" (the mode and
    the rules decide, as for any window) or "off" (docs/integrations.md#built-in-profiles).
    ``inspect``: watch each capture
    op by op and each replay of the graphs it made (implicit_sync, dead_input,
    rng_during_capture; docs/inspection.md). ``inspect_first``: inspect only the first N
    captures of each site (None: all).
    ``census``: count, time and weigh
    every capture per site, and torch.compile's skipped cudagraphs (docs/census.md);
    ``census_replays``: count each graph's replays too, which hooks CUDAGraph.replay.
    ``metrics``: "prometheus" registers cgguard's counters with prometheus_client's default
    registry (docs/integrations.md#prometheus-metrics). ``log_level``: the least severe
    event written to the log ("debug", "info", "warning", "error"); the report, the census,
    the metrics and the pytest plugin still see every event. ``manifest``: keep the capture
    manifest (each capture in order, with the collectives issued in it) where the process is one
    rank of a job; ``rank_check``: compare it across the ranks when a capture window closes
    (docs/ranks.md).
    """

    # The types are here for type checkers; values and defaults come from cgguard._config.settings.
    mode: Mode = dataclasses.field(default=SETTINGS["mode"].default)
    rules: Mapping[str, Action] = dataclasses.field(default_factory=dict)
    log_format: LogFormat | None = dataclasses.field(default=SETTINGS["log_format"].default)
    log_file: str | None = dataclasses.field(default=SETTINGS["log_file"].default)
    log_target: LogTarget | None = dataclasses.field(default=SETTINGS["log_target"].default)
    report: str | None = dataclasses.field(default=SETTINGS["report"].default)
    capture: Capture | None = dataclasses.field(default=SETTINGS["capture"].default)
    simulate_cuda: bool = dataclasses.field(default=SETTINGS["simulate_cuda"].default)
    vllm_bridge: bool = dataclasses.field(default=SETTINGS["vllm_bridge"].default)
    exempt: tuple[tuple[str, str], ...] = dataclasses.field(default=SETTINGS["exempt"].default)
    exempt_file: str | None = dataclasses.field(default=SETTINGS["exempt_file"].default)
    windows: tuple[str, ...] = dataclasses.field(default=SETTINGS["windows"].default)
    profiles: Profiles = dataclasses.field(default=SETTINGS["profiles"].default)
    inspect: bool = dataclasses.field(default=SETTINGS["inspect"].default)
    inspect_first: int | None = dataclasses.field(default=SETTINGS["inspect_first"].default)
    census: bool = dataclasses.field(default=SETTINGS["census"].default)
    census_replays: bool = dataclasses.field(default=SETTINGS["census_replays"].default)
    metrics: Metrics | None = dataclasses.field(default=SETTINGS["metrics"].default)
    log_level: LogLevel = dataclasses.field(default=SETTINGS["log_level"].default)
    manifest: bool = dataclasses.field(default=SETTINGS["manifest"].default)
    rank_check: bool = dataclasses.field(default=SETTINGS["rank_check"].default)

    if TYPE_CHECKING:
        # What type checkers see of the __init__ that dataclasses writes: it takes the paths
        # as os.PathLike too, which __post_init__ keeps as their str.
        def __init__(  # noqa: PLR0917 - dataclasses' own takes the fields by position too
            self,
            mode: Mode = ...,
            rules: Mapping[str, Action] = ...,
            log_format: LogFormat | None = ...,
            log_file: str | os.PathLike[str] | None = ...,
            log_target: LogTarget | None = ...,
            report: str | os.PathLike[str] | None = ...,
            capture: Capture | None = ...,
            simulate_cuda: bool = ...,
            vllm_bridge: bool = ...,
            exempt: Exempt = ...,
            exempt_file: str | os.PathLike[str] | None = ...,
            windows: Windows = ...,
            profiles: Profiles = ...,
            inspect: bool = ...,
            inspect_first: int | None = ...,
            census: bool = ...,
            census_replays: bool = ...,
            metrics: Metrics | None = ...,
            log_level: LogLevel = ...,
            manifest: bool = ...,
            rank_check: bool = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        # Each value is kept as a plain str, bool or None (a path given as os.PathLike becomes
        # its str), so that the frozen value compares, hashes and serialises as plain data.
        for setting in SETTINGS.values():
            object.__setattr__(self, setting.field, _checked(setting, getattr(self, setting.field)))
        if self.log_target == "file" and self.log_file is None:
            raise ConfigError("Config(log_target='file'): needs log_file, a path")
        # A read-only copy: a caller's dict changed later must not change this configuration.
        object.__setattr__(self, "rules", _checked_rules(self.rules))

    def action(self, rule: str) -> Action:
        """What happens when ``rule`` is broken: "raise", "log" or "off"."""
        chosen = self.rules.get(rule)
        if chosen is not None:
            return chosen
        return "log" if RULES[rule].diagnostic else self.mode

    def as_dict(self) -> dict[str, object]:
        """The configuration as plain JSON-ready values."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        exempt = [_exempt_syntax.text(pair) for pair in self.exempt]
        return fields | {"rules": dict(self.rules), "exempt": exempt, "windows": list(self.windows)}

    def target(self) -> LogTarget:
        """Where events go: the explicit target, else the file when one is set, else stderr."""
        if self.log_target is not None:
            return self.log_target
        return "file" if self.log_file is not None else "stderr"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ, *, warn: bool = True) -> Config:
        """Build the configuration from CGGUARD_* variables; defaults for the rest.

        A value that is not accepted is ignored with one line on stderr (when ``warn``), so a
        typo in a deployment never stops the program.
        """
        values, _, problems = _settings.read(environ)
        if warn:
            for line in problems:
                warn_once(line, line)
        return cls(**values)  # type: ignore[arg-type]  # _settings.read checked every value


_REFUSED = object()


def _checked(setting: Setting, value: object) -> object:
    """``value`` as a Config keeps it; ConfigError, one line, for anything not accepted.

    Never another exception: a value whose own methods fail (``__fspath__``, ``__eq__``,
    ``__repr__``) is refused like any other.
    """
    if setting.choices is EXEMPT:
        return _checked_exempt(value)
    if setting.choices is WINDOWS:
        return _checked_windows(value)
    try:
        kept = _plain(setting, value)
    except Exception as exc:
        raise _refused(setting, value) from exc
    if kept is _REFUSED:
        raise _refused(setting, value)
    return kept


def _plain(setting: Setting, value: object) -> object:
    """``value`` as a plain str, bool or None, or _REFUSED."""
    if setting.choices is BOOL:
        # ``is``: 1 == True, but Config(simulate_cuda=1) is a mistake.
        return value if value is True or value is False else _REFUSED
    if value is None:
        return None if setting.default is None else _REFUSED
    if setting.choices is COUNT:
        # ``type``: True is an int, but Config(inspect_first=True) is a mistake.
        return value if type(value) is int and value >= 1 else _REFUSED
    if setting.choices is PATH and hasattr(type(value), "__fspath__"):
        value = os.fspath(cast("os.PathLike[str]", value))  # str, or bytes that _text refuses
    text = plain(value)
    if text is None:
        return _REFUSED
    if setting.choices is PATH:
        return text if is_path(text) else _REFUSED
    return text if text in setting.choices else _REFUSED


def _refused(setting: Setting, value: object) -> ConfigError:
    if setting.choices is BOOL:
        accepted = "False, True"
    elif setting.choices is PATH:
        accepted = "None or a path, a str or os.PathLike (not blank, no NUL character)"
    elif setting.choices is COUNT:
        accepted = "None or a whole number (int), 1 or more"
    else:
        accepted = ", ".join(repr(c) for c in setting.choices)
        accepted = f"None, {accepted}" if setting.default is None else accepted
    return ConfigError(f"Config({setting.field}={shown(value)}): accepted values are {accepted}")


def _checked_exempt(value: object) -> tuple[tuple[str, str], ...]:
    """Exemptions as a Config keeps them: (rule, place) pairs; else ConfigError naming why."""
    try:
        return _exempt_syntax.normalize(value)
    except Exception as exc:  # EntryError for what is refused; anything from a value's methods
        if isinstance(exc, _exempt_syntax.EntryError):
            entry, reason = exc.entry, exc.reason
            reason = reason if entry is value else f"entry {shown(entry)}: {reason}"
        else:
            reason = f"{exc!r}"
        if "no rule " not in reason:  # that reason lists the rules accepted already
            reason += (
                "; accepted values are None, RULE=PLACE entries (';' between them in a str), "
                "(rule, place) pairs or a mapping of rule to places, PLACE "
                + _exempt_syntax.SYNTAX.partition("PLACE ")[2]
            )
        raise ConfigError(f"Config(exempt={shown(value)}): {reason}") from exc


def _checked_windows(value: object) -> tuple[str, ...]:
    """Capture windows as a Config keeps them: entries, each once; else ConfigError naming the
    entry refused and the accepted form."""
    accepted = (
        "accepted values are None, module:qualname entries (',' between them in a str) or an "
        f"iterable of them, each {WINDOW_SYNTAX}"
    )
    if value is None:
        return ()
    text = plain(value)
    if text is not None:
        entries, refused = window_entries(text)
        if refused:
            raise ConfigError(
                f"Config(windows={shown(value)}): entry {shown(refused[0])}; {accepted}"
            )
        return tuple(entries)
    try:
        items = [plain(item) for item in value] if isinstance(value, Iterable) else None
    except Exception as exc:  # an iterable whose own methods fail
        raise ConfigError(f"Config(windows={shown(value)}): {exc!r}; {accepted}") from exc
    if items is None:
        raise ConfigError(f"Config(windows={shown(value)}): {accepted}")
    for item in items:
        if item is None or not is_window(item.strip()):
            raise ConfigError(f"Config(windows={shown(value)}): entry {shown(item)}; {accepted}")
    return tuple(dict.fromkeys(item.strip() for item in items if item is not None))


def _checked_rules(rules: object) -> Rules:
    """``rules`` as a Config keeps them: read-only, plain str to plain str; else ConfigError."""
    try:
        items = [(r, a) for r, a in rules.items()] if isinstance(rules, Mapping) else None
    except Exception as exc:  # a mapping whose own methods fail
        raise _not_a_mapping(rules) from exc
    if items is None:
        raise _not_a_mapping(rules)
    kept: dict[str, Action] = {}
    for rule, action in items:
        name, chosen = plain(rule), plain(action)
        if name not in RULES or chosen not in ACTIONS:
            raise ConfigError(
                f"Config(rules={{{shown(rule)}: {shown(action)}}}): accepted rules are "
                f"{', '.join(NAMES)}; actions are {', '.join(ACTIONS)}"
            )
        kept[name] = chosen  # type: ignore[assignment]  # one of ACTIONS, checked just above
    return Rules(kept)


def _not_a_mapping(rules: object) -> ConfigError:
    return ConfigError(
        f"Config(rules={shown(rules)}): accepted values are a mapping of rule to action"
    )
