"""cgguard's configuration: one frozen value, built in code or from the environment."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Literal, NoReturn

from cgguard import _settings
from cgguard._errors import ConfigError
from cgguard._rules import ACTIONS, NAMES, RULES
from cgguard._settings import BOOL, PATH, SETTINGS
from cgguard._warn import warn_once

Mode = Literal["raise", "log"]
Action = Literal["raise", "log", "off"]
LogFormat = Literal["json", "console"]
LogTarget = Literal["stderr", "file", "logging"]
Capture = Literal["enabled", "disabled"]


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
    the JSON report, ``{pid}`` expanded. ``capture``: the capture flag's value at install (None
    leaves it as it is). ``simulate_cuda``: put the simulated CUDA runtime in place at
    activation. ``vllm_bridge``: follow vLLM's capture flag when vLLM is imported.
    """

    # The types are here for type checkers; values and defaults come from cgguard._settings.
    mode: Mode = dataclasses.field(default=SETTINGS["mode"].default)
    rules: Mapping[str, Action] = dataclasses.field(default_factory=dict)
    log_format: LogFormat | None = dataclasses.field(default=SETTINGS["log_format"].default)
    log_file: str | None = dataclasses.field(default=SETTINGS["log_file"].default)
    log_target: LogTarget | None = dataclasses.field(default=SETTINGS["log_target"].default)
    report: str | None = dataclasses.field(default=SETTINGS["report"].default)
    capture: Capture | None = dataclasses.field(default=SETTINGS["capture"].default)
    simulate_cuda: bool = dataclasses.field(default=SETTINGS["simulate_cuda"].default)
    vllm_bridge: bool = dataclasses.field(default=SETTINGS["vllm_bridge"].default)

    def __post_init__(self) -> None:
        for setting in SETTINGS.values():
            value = getattr(self, setting.field)
            if not _accepts(setting.choices, setting.default, value):
                raise ConfigError(
                    f"Config({setting.field}={value!r}): accepted values are "
                    f"{_shown(setting.choices, setting.default)}"
                )
        if self.log_target == "file" and self.log_file is None:
            raise ConfigError("Config(log_target='file'): needs log_file, a path")
        if not isinstance(self.rules, Mapping):
            raise ConfigError(
                f"Config(rules={self.rules!r}): accepted values are a mapping of rule to action"
            )
        for rule, action in self.rules.items():
            if rule not in RULES or action not in ACTIONS:
                raise ConfigError(
                    f"Config(rules={{{rule!r}: {action!r}}}): accepted rules are "
                    f"{', '.join(NAMES)}; actions are {', '.join(ACTIONS)}"
                )
        # A read-only copy: a caller's dict changed later must not change this configuration.
        object.__setattr__(self, "rules", Rules(self.rules))

    def action(self, rule: str) -> Action:
        """What happens when ``rule`` is broken: "raise", "log" or "off"."""
        chosen = self.rules.get(rule)
        if chosen is not None:
            return chosen
        return "log" if RULES[rule].diagnostic else self.mode

    def as_dict(self) -> dict[str, object]:
        """The configuration as plain JSON-ready values."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return fields | {"rules": dict(self.rules)}

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


def _accepts(choices: tuple[str, ...], default: object, value: object) -> bool:
    if choices is BOOL:
        # ``is``: 1 == True, but Config(simulate_cuda=1) is a mistake.
        return value is True or value is False
    if value is None and default is None:
        return True
    if choices is PATH:
        return isinstance(value, str) and bool(value)
    return isinstance(value, str) and value in choices


def _shown(choices: tuple[str, ...], default: object) -> str:
    if choices is BOOL:
        return "False, True"
    if choices is PATH:
        return "None or a path"
    shown = ", ".join(repr(c) for c in choices)
    return f"None, {shown}" if default is None else shown
