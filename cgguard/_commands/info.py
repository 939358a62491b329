"""``cgguard info``: versions, the configuration and where it comes from, and activation here."""

from __future__ import annotations

import os
import platform
import site
import subprocess
import sys
from typing import TYPE_CHECKING

from cgguard._boot import ENABLED
from cgguard._commands.run import BOOT_DIR, program_environ, run_parser
from cgguard._config import settings as _settings
from cgguard._config.config import Config
from cgguard._gate.profiles import PROFILES
from cgguard._rules import exempt_syntax as _exempt_syntax
from cgguard._rules.table import NAMES, RULES
from cgguard._version import __version__, distribution_version

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import TextIO

# Run in a fresh child started the way the runner starts programs: is torch patched there?
_MARK = "cgguard-child-check:"
_CHILD_CHECK = (
    "import torch, cgguard; s = cgguard.status(); "
    f"print({_MARK!r}, len(s.patched), s.activated_by or 'nothing')"
)


def _version(distribution: str) -> str:
    return distribution_version(distribution) or "not installed"


def _pth_files() -> list[str]:
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    return [os.path.join(f, "cgguard.pth") for f in dict.fromkeys(folders)]


def _configuration(environ: Mapping[str, str]) -> list[str]:
    _, sources, problems = _settings.read(environ)
    config = Config.from_environ(environ, warn=False)
    enabled = environ.get(ENABLED, "")
    lines = [f"  {'enabled':<14} {enabled or '(unset)':<12} ({ENABLED})"]
    for field, setting in _settings.SETTINGS.items():
        value = getattr(config, field)
        if field == "exempt" and value:
            # One line each, as the rules: the exemptions file's follow its own line.
            source = sources.get(field, "default")
            lines += [f"  {field:<14} {_exempt_syntax.text(pair)} ({source})" for pair in value]
            continue
        if field == "windows" and value:
            source = sources.get(field, "default")
            lines += [f"  {'window':<14} {entry} ({source})" for entry in value]
            continue
        shown = value
        if value is None or value == ():
            shown = config.target() if field == "log_target" else setting.unset
        lines.append(f"  {setting.name:<14} {shown!s:<12} ({_source(field, sources)})")
        if field == "profiles" and value != "off":
            lines += [
                f"  {'profile':<14} {p.name}: {p.title}, {len(p.windows)} windows, "
                f"{len(p.exempt)} exemptions"
                for p in PROFILES
            ]
        if field == "exempt_file" and value is not None:
            found = _settings.exemptions_file(value)[0]
            lines += [f"  {'exempt':<14} {_exempt_syntax.text(pair)} ({value})" for pair in found]
    for rule in NAMES:
        lines.append(f"  {'rule':<14} {rule}: {config.action(rule)} ({_source(rule, sources)})")
    lines += [f"  warning: {line}" for line in problems]
    return lines


def _source(name: str, sources: Mapping[str, str]) -> str:
    """Where a setting's or a rule's value comes from: its variable, the one it follows, default.

    A value that follows another setting names that one's variable when it was set: a rule
    without a variable of its own takes the mode, and the log target the log file.
    """
    key = f"rules.{name}" if name in RULES else name
    if key in sources:
        return sources[key]
    followed = _FOLLOWS.get(name, "")
    if name in RULES and not RULES[name].diagnostic:
        followed = "mode"
    if followed in sources:
        return f"from {sources[followed]}"
    return "default"


# Settings whose value, unset, follows another setting's (cgguard._config.config.Config.target).
_FOLLOWS = {"log_target": "log_file"}


def _child_check(environ: Mapping[str, str]) -> str:
    if _version("torch") == "not installed":
        return "torch is not installed in this environment: nothing to patch"
    env = program_environ(run_parser().parse_args([]), environ)
    # The check writes nothing of the program's: no report (an empty one would replace the
    # run's), no log file.
    for variable in ("CGGUARD_REPORT", "CGGUARD_LOG_FILE", "CGGUARD_LOG_TARGET"):
        env.pop(variable, None)
    try:
        done = subprocess.run(  # noqa: S603 - this interpreter, with a fixed program
            [sys.executable, "-c", _CHILD_CHECK],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not start a child to check: {exc}"
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"NOT patched: the child failed ({tail})"
    # The program's own start-up (a sitecustomize, say) may print too: read only our line.
    marked = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if not marked:
        return f"could not read the child's answer: {done.stdout.strip()!r}"
    _, count, origin = marked[-1].split()
    if count == "0":
        return f"NOT patched (activated by {origin}); see warnings the child printed: {done.stderr}"
    return f"torch's {count} entry points patched (activated by {origin})"


def report(environ: Mapping[str, str] = os.environ, out: TextIO | None = None) -> int:
    """Print the report; returns the exit status (0)."""
    lines = [f"cgguard {__version__}"]
    lines.append(f"  {'python':<14} {platform.python_version()} ({sys.executable})")
    for name in ("torch", "wrapt", "structlog"):
        lines.append(f"  {name:<14} {_version(name)}")
    lines += ["", "configuration (from the environment):", *_configuration(environ)]
    lines += ["", "activation:"]
    for pth in _pth_files():
        state = "present" if os.path.isfile(pth) else "absent"
        lines.append(f"  {'.pth':<14} {pth} ({state})")
    state = "present" if os.path.isfile(os.path.join(BOOT_DIR, "sitecustomize.py")) else "MISSING"
    lines.append(f"  {'bootstrap':<14} {BOOT_DIR} ({state})")
    lines.append(f"  {'child':<14} {_child_check(environ)}")
    (out or sys.stdout).write("\n".join(lines) + "\n")
    return 0
