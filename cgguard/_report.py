"""The JSON report: a file that says what a whole run saw, kept current on disk.

A worker killed by SIGTERM, or ended with os._exit as multiprocessing ends its workers, runs no
exit handler, so a report written only at exit would lose its violations. The report is
rewritten when a new distinct violation appears: by the capturing thread itself while the
report is small, so that it is on disk before the program goes on, and beyond that by a thread
of cgguard's own, since a rewrite costs time in proportion to the sites it holds. Counts reach
the disk within half a second. The file is replaced atomically (a temporary file renamed over
it), and written a last time at exit or uninstall.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import threading
from typing import TYPE_CHECKING

from cgguard._events import document
from cgguard._settings import REPORT_OWNER, shown
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from cgguard._config import Config
    from cgguard._ledger import Ledger

# How long counts may lag behind on disk.
INTERVAL = 0.5
# Up to this many sites, the capturing thread writes a new site's report itself: a bounded cost
# (a few kilobytes of JSON), and the report is complete before the program can be killed.
WRITTEN_AT_ONCE = 16

# Set in the environment by a process whose report path has no {pid}, so that the processes
# it starts, which inherit both, can say that they would write the same file.
OWNER = REPORT_OWNER


def expand(template: str) -> str:
    """The report path for this process: ``{pid}`` becomes its pid."""
    return template.replace("{pid}", str(os.getpid()))


class ReportFile:
    """Where one installation writes its report, and the thread that keeps it current."""

    def __init__(self, config: Config, ledger: Ledger) -> None:
        assert config.report is not None  # noqa: S101 - made only for a configured report
        self.config = config
        self.ledger = ledger
        # Resolved once: a program that changes directory must not scatter its reports.
        self.template = os.path.abspath(config.report)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._dirty = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._claim()

    def changed(self, *, new_site: bool) -> None:
        """Note that the ledger changed: a new site is written at once, a count soon."""
        if new_site and len(self.ledger) <= WRITTEN_AT_ONCE:
            self.write()
            return
        self._dirty = True
        if self._thread is None:
            self._start()
        if new_site:
            self._wake.set()

    def close(self) -> None:
        """Stop the writing thread and write the final report."""
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.write()

    def after_fork(self, ledger: Ledger) -> None:
        """A forked child's own report: its ledger, new locks, and no writer yet."""
        self.ledger = ledger
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._dirty = False
        self._thread = None

    def write(self) -> None:
        """Write the report now; one warning if that fails."""
        path = expand(self.template)
        try:
            # Built under the lock: a writer holding an older document must not rename it over
            # a newer one.
            with self._lock:
                if not self._may_replace(path):
                    return
                text = json.dumps(document(self.config, self.ledger), indent=2) + "\n"
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
            reason = getattr(exc, "strerror", None) or exc  # an OSError's text repeats the path
            warn_once(f"report:{path}", f"cannot write the report {shown(path)}: {reason}")

    def _may_replace(self, path: str) -> bool:
        """Whether ``path`` may be replaced: missing, or a regular file not holding another
        process's violations when this one has none."""
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return True
        if not stat.S_ISREG(mode):
            # os.replace would swap a device, a FIFO or a symlink for a regular file: as root,
            # a report path of /dev/null would replace the machine's /dev/null.
            warn_once(
                f"report:{path}",
                f"not writing the report {shown(path)}: it is not a regular file",
            )
            return False
        if self.ledger.sites():
            return True
        # Nothing to say: never replace another process's violations with an empty report
        # (a launcher that outlives its worker, sharing a path without {pid}).
        try:
            with open(path, encoding="utf-8") as existing:
                held = json.load(existing)
        except (OSError, ValueError):
            return True
        return not (
            isinstance(held, dict) and held.get("pid") != os.getpid() and held.get("violations")
        )

    def _claim(self) -> None:
        """Warn when this process shares a report path without {pid} with the one it came from."""
        if "{pid}" in self.template:
            return
        owner = os.environ.get(OWNER, "")
        if owner and owner != str(os.getpid()):
            warn_once(
                f"report-shared:{self.template}",
                f"the report path {shown(self.template)} has no {{pid}}: this process "
                f"({os.getpid()}) and process {owner}, which started it, write the same file; "
                "put {pid} in the path to keep one report per process",
            )
        else:
            os.environ[OWNER] = str(os.getpid())

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="cgguard-report", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(timeout=INTERVAL)
            self._wake.clear()
            if self._closed:
                return
            if self._dirty:
                self._dirty = False
                self.write()
