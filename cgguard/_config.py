"""cgguard's configuration: one frozen value, built in code or from the environment."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Literal, NoReturn

from cgguard import _environ
from cgguard._errors import ConfigError
from cgguard._warn import warn_once

Mode = Literal["raise", "log"]
Action = Literal["raise", "log", "off"]
LogFormat = Literal["json", "console"]
LogTarget = Literal["stderr", "file", "logging"]
Capture = Literal["enabled", "disabled"]

RULES = _environ.RULES
# The diagnostics: they log whatever the global mode, unless a per-rule setting says otherwise.
_DIAGNOSTICS = ("concurrent_capture", "sync_during_capture")

_CHOICES: dict[str, tuple[object, ...]] = {
    "mode": ("raise", "log"),
    "log_format": (None, "json", "console"),
    "log_target": (None, "stderr", "file", "logging"),
    "capture": (None, "enabled", "disabled"),
    "simulate_cuda": (False, True),
    "vllm_bridge": (False, True),
}


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

    mode: Mode = "raise"
    rules: Mapping[str, Action] = dataclasses.field(default_factory=dict)
    log_format: LogFormat | None = None
    log_file: str | None = None
    log_target: LogTarget | None = None
    report: str | None = None
    capture: Capture | None = None
    simulate_cuda: bool = False
    vllm_bridge: bool = True

    def __post_init__(self) -> None:
        for field, choices in _CHOICES.items():
            value = getattr(self, field)
            # ``is`` for booleans: 1 == True, but Config(simulate_cuda=1) is a mistake.
            if not any(value is c if isinstance(c, bool) else value == c for c in choices):
                shown = ", ".join(repr(c) for c in choices)
                raise ConfigError(f"Config({field}={value!r}): accepted values are {shown}")
        for field in ("log_file", "report"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"Config({field}={value!r}): accepted values are None or a path")
        if self.log_target == "file" and self.log_file is None:
            raise ConfigError("Config(log_target='file'): needs log_file, a path")
        if not isinstance(self.rules, Mapping):
            raise ConfigError(
                f"Config(rules={self.rules!r}): accepted values are a mapping of rule to action"
            )
        for rule, action in self.rules.items():
            if rule not in RULES or action not in _environ.ACTIONS:
                raise ConfigError(
                    f"Config(rules={{{rule!r}: {action!r}}}): accepted rules are "
                    f"{', '.join(RULES)}; actions are {', '.join(_environ.ACTIONS)}"
                )
        # A read-only copy: a caller's dict changed later must not change this configuration.
        object.__setattr__(self, "rules", Rules(self.rules))

    def action(self, rule: str) -> Action:
        """What happens when ``rule`` is broken: "raise", "log" or "off"."""
        chosen = self.rules.get(rule)
        if chosen is not None:
            return chosen
        return "log" if rule in _DIAGNOSTICS else self.mode

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
        values, _, problems = _environ.read(environ)
        if warn:
            for line in problems:
                warn_once(line, line)
        return cls(**values)  # type: ignore[arg-type]  # _environ.read checked every value
