"""cgguard's configuration: one frozen value, built in code or from the environment."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Literal

from cgguard import _environ
from cgguard._errors import ConfigError
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Mapping

Mode = Literal["raise", "log"]
LogFormat = Literal["json", "console"]
Capture = Literal["enabled", "disabled"]

_CHOICES: dict[str, tuple[object, ...]] = {
    "mode": ("raise", "log"),
    "log_format": (None, "json", "console"),
    "capture": (None, "enabled", "disabled"),
    "simulate_cuda": (False, True),
}


@dataclasses.dataclass(frozen=True)
class Config:
    """How cgguard acts on violations and where it reports them.

    ``mode``: "raise" refuses a violating capture with a CaptureViolation; "log" reports it and
    lets the capture go on. ``log_format``: "json" lines or structlog's "console" rendering;
    None picks console when stderr is a terminal, JSON otherwise. ``log_file``: append events
    to this path instead of stderr. ``capture``: the capture flag's value at install (None
    leaves it as it is). ``simulate_cuda``: put cgguard.testing's simulated CUDA runtime in
    place at activation, for demos and CPU-only CI.
    """

    mode: Mode = "raise"
    log_format: LogFormat | None = None
    log_file: str | None = None
    capture: Capture | None = None
    simulate_cuda: bool = False

    def __post_init__(self) -> None:
        for field, choices in _CHOICES.items():
            value = getattr(self, field)
            # ``is`` for booleans: 1 == True, but Config(simulate_cuda=1) is a mistake.
            if not any(value is c if isinstance(c, bool) else value == c for c in choices):
                shown = ", ".join(repr(c) for c in choices)
                raise ConfigError(f"Config({field}={value!r}): accepted values are {shown}")
        if self.log_file is not None and (not isinstance(self.log_file, str) or not self.log_file):
            raise ConfigError(
                f"Config(log_file={self.log_file!r}): accepted values are None or a path"
            )

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
