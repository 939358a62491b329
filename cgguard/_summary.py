"""What cgguard says about a whole run: the exit summary event, and the JSON report.

The report is rewritten atomically (a temporary file renamed over it) whenever a new distinct
violation appears, and once more at exit: a worker killed by SIGTERM runs no exit handler, so a
report written only at exit would lose its violations.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import secrets
import threading
import time
from typing import TYPE_CHECKING

from cgguard._guard import ranks, timestamp
from cgguard._version import __version__, distribution_version
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from cgguard._config import Config
    from cgguard._ledger import Ledger

_lock = threading.Lock()


def reset_lock() -> None:
    """A new lock, in a forked child: the parent's may have been held by a thread it lacks."""
    global _lock
    _lock = threading.Lock()


def expand(template: str) -> str:
    """The report path for this process: ``{pid}`` becomes its pid."""
    return template.replace("{pid}", str(os.getpid()))


def document(config: Config, ledger: Ledger) -> dict[str, object]:
    """The report as a JSON-ready value."""
    violations = [
        {"rule": site.rule, "count": site.count, "first": site.first}
        for site in ledger.sites()
        if site.first is not None
    ]
    return {
        "cgguard": __version__,
        "python": platform.python_version(),
        "torch": distribution_version("torch"),
        "pid": os.getpid(),
        **ranks(),
        "written_at": timestamp(time.time()),
        "config": {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        | {"rules": dict(config.rules)},
        "totals": ledger.totals(),
        "violations": violations,
    }


def summary_event(ledger: Ledger) -> dict[str, object]:
    """The ``cgguard.summary`` event: counts per rule and per site."""
    sites = []
    for site in ledger.sites():
        top: dict[str, object] = dict(ledger.where(site) or {})
        sites.append(
            {
                "rule": site.rule,
                "count": site.count,
                "file": top.get("file"),
                "line": top.get("line"),
                "function": top.get("function"),
            }
        )
    return {
        "event": "cgguard.summary",
        "level": "warning",
        "pid": os.getpid(),
        **ranks(),
        "timestamp": timestamp(time.time()),
        "totals": ledger.totals(),
        "sites": sites,
    }


def write(config: Config, ledger: Ledger) -> None:
    """Write the report where the configuration says; one warning if that fails."""
    if config.report is None:
        return
    path = expand(config.report)
    try:
        # Built under the lock too: a writer holding an older document must not rename it
        # over a newer one.
        with _lock:
            text = json.dumps(document(config, ledger), indent=2) + "\n"
            temporary = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
            # 0o666 less the umask, like any file the program creates: a collector running as
            # another user can read it (tempfile.mkstemp would make it 0o600).
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(text)
                os.replace(temporary, path)
            except BaseException:
                os.unlink(temporary)
                raise
    except Exception as exc:
        warn_once(f"report:{path}", f"cannot write the report {path!r}: {exc}")
