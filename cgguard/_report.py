"""The JSON report: a file that says what a whole run saw, kept current on disk.

The report is rewritten atomically (a temporary file renamed over it) whenever a new distinct
violation appears, and once more at exit: a worker killed by SIGTERM runs no exit handler, so a
report written only at exit would lose its violations.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from typing import TYPE_CHECKING

from cgguard._events import document
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from cgguard._config import Config
    from cgguard._ledger import Ledger


def expand(template: str) -> str:
    """The report path for this process: ``{pid}`` becomes its pid."""
    return template.replace("{pid}", str(os.getpid()))


class ReportFile:
    """Where one installation writes its report, and the lock that orders its writers."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._lock = threading.Lock()

    def forget_lock(self) -> None:
        """A new lock, in a forked child: the parent's may have been held by a thread it lacks."""
        self._lock = threading.Lock()

    def write(self, ledger: Ledger) -> None:
        """Write the report; one warning if that fails."""
        if self.config.report is None:
            return
        path = expand(self.config.report)
        try:
            # Built under the lock too: a writer holding an older document must not rename it
            # over a newer one.
            with self._lock:
                text = json.dumps(document(self.config, ledger), indent=2) + "\n"
                temporary = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
                # 0o666 less the umask, like any file the program creates: a collector running
                # as another user can read it (tempfile.mkstemp would make it 0o600).
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
