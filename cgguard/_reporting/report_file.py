"""The JSON report: a file that says what a whole run saw, kept current on disk.

A worker killed by SIGTERM, or ended with os._exit as multiprocessing ends its workers, runs no
exit handler, so a report written only at exit would lose its violations. The report is
rewritten when a new distinct violation appears: by the capturing thread itself while the
report is small enough, so that it is on disk before the program goes on, and beyond that by a
thread of cgguard's own, since a rewrite costs time in proportion to the sites it holds. Each
site's entry is encoded once and kept while it holds, so that a rewrite copies the sites before
it rather than encoding them again, and the thread rests after each write in proportion to what
it cost. Counts reach the disk within half a second. The file is replaced atomically (a
temporary file renamed over it), and written a last time at exit, at uninstall, and when a
multiprocessing worker ends.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import sys
import threading
import time
from typing import TYPE_CHECKING, cast

from cgguard._config.settings import REPORT_OWNER, shown
from cgguard._reporting.events import document
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from cgguard._config.config import Config
    from cgguard._data.ledger import Run

# How long counts may lag behind on disk, at most.
INTERVAL = 0.5
# After each write, the writing thread rests this many times as long as the write took (at most
# INTERVAL) before it writes new sites: a rewrite costs time in proportion to the sites the
# report holds, and written back to back while new sites keep coming, a report of thousands
# would take the process's time from the program in proportion to its size. Resting, the thread
# takes at most a fifth of it while a write takes under INTERVAL / REST.
REST = 4
# Up to this many sites, the capturing thread writes a new site's report itself. Each such
# write encodes the new site alone and replaces a file of this many sites at most: a few
# milliseconds each, under a second in all, once per run. A report of more sites has its new
# sites written by the writing thread, after its rest.
WRITTEN_AT_ONCE = 256

# CGGUARD_REPORT_OWNER, set by the first process that writes a report path without {pid} and
# inherited by the processes it starts: "PID:JOB:PATH". JOB names the run, so that a process of
# the same run without violations leaves the file alone, while a later run replaces it.
OWNER = REPORT_OWNER


# The document's lists of sites, whose entries are kept encoded between writes.
_SITE_LISTS = ("violations", "exempted", "captures")


def _indented(value: object, level: int) -> str:
    """``value`` as ``json.dumps(..., indent=2)`` writes it ``level`` levels deep."""
    return json.dumps(value, indent=2).replace("\n", "\n" + "  " * level)


def expand(template: str) -> str:
    """The report path for this process: ``{pid}`` becomes its pid."""
    return template.replace("{pid}", str(os.getpid()))


class ReportFile:
    """Where one installation writes its report, and the thread that keeps it current."""

    def __init__(self, config: Config, run: Run, *, write_now: bool = True) -> None:
        """The report of ``run``, written at once unless ``write_now`` is false (a forked
        child's, which has nothing to say yet)."""
        assert config.report is not None  # noqa: S101 - made only for a configured report
        self.config = config
        self.ledger = run.ledger
        self.exempt = run.tally  # captures let through by exemptions, counted beside the ledger
        self.census = run.census  # every capture, per site (cgguard._data.census)
        self.manifest = run.manifest  # the captures in order, where ranks are compared
        # Resolved once: a program that changes directory must not scatter its reports.
        self.template = os.path.abspath(config.report)
        self.job: str | None = None  # the run sharing this path, where the path has no {pid}
        self._lock = threading.Lock()
        self._wake = threading.Event()  # a new site, counts while idle, or close()
        self._stop = threading.Event()  # close() alone: it ends a rest
        self._dirty = False
        self._idle = False
        self._closed = False
        self._in_place = False  # no writing thread could be started
        self._thread: threading.Thread | None = None
        self._finalized_in = 0  # the process whose multiprocessing finalizers close this
        # Each site's entry as last written, by id() of its first event: (its values, its text).
        self._entries: dict[int, tuple[tuple[object, ...], str]] = {}
        self._claim()
        # Written at once, violations or not: a process ended without its exit handlers (a Ray
        # worker, a worker killed by SIGTERM) still shows that it was guarded.
        if write_now:
            self.write()

    def changed(self, *, new_site: bool) -> None:
        """Note that the ledger changed: a new site is written at once, a count soon."""
        try:
            if self._finalized_in != os.getpid():
                self._finalize_with_multiprocessing()
            if new_site and len(self.ledger) <= WRITTEN_AT_ONCE:
                self.write()
                return
            self._dirty = True
            if self._thread is None and not self._in_place:
                self._start()
            if self._in_place:
                if new_site:
                    self.write()
                return
            if new_site or self._idle:
                self._idle = False
                self._wake.set()
        except Exception as exc:
            warn_once("report:changed", f"cannot keep the report current: {exc!r}")

    def close(self, *, final: bool = True) -> None:
        """Stop the writing thread and write the final report (unless not ``final``); once."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if final:
            self.write()

    def write(self) -> None:
        """Write the report now; one warning if that fails."""
        path = expand(self.template)
        try:
            # Built under the lock: a writer holding an older document must not rename it over
            # a newer one.
            with self._lock:
                if not self._may_replace(path):
                    return
                body = document(self.config, self.ledger, self.exempt, self.census, self.manifest)
                if self.job is not None:
                    body["job"] = self.job
                text = self._encode(cast("dict[str, object]", body)) + "\n"
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

    def _encode(self, body: dict[str, object]) -> str:
        """``json.dumps(body, indent=2)``, each site's entry encoded once for as long as it holds.

        Encoding the whole document at every write made each new site cost in proportion to the
        sites before it. A site's first event never changes once it is in the report, and its
        count rarely does: an entry whose values are the very ones last encoded (its first event
        the same object) is taken as it was. JSON strings hold no raw newline, so a value
        encoded alone is placed deeper by indenting after each of its newlines, as json does.
        """
        previous, kept = self._entries, {}
        items = []
        for key, value in body.items():
            if key in _SITE_LISTS and isinstance(value, list) and value:
                entries = []
                for entry in value:
                    first = entry.get("first") if isinstance(entry, dict) else None
                    if first is None and key == "captures":
                        # A census site's entry is the same object while its values hold.
                        first = entry
                    if first is None:
                        entries.append(_indented(entry, 2))
                        continue
                    values = tuple(entry.values())
                    cached = previous.get(id(first))
                    if cached is None or cached[0] != values:
                        # Holding the values holds the first event, so its id() stays its own.
                        cached = (values, _indented(entry, 2))
                    kept[id(first)] = cached
                    entries.append(cached[1])
                text = "[\n    " + ",\n    ".join(entries) + "\n  ]"
            else:
                text = _indented(value, 1)
            items.append(f"{json.dumps(key)}: {text}")
        # Only the entries of this document: those of sites a fork left behind go.
        self._entries = kept
        return "{\n  " + ",\n  ".join(items) + "\n}" if items else "{}"

    def _may_replace(self, path: str) -> bool:
        """Whether ``path`` may be replaced: missing, or a regular file that does not hold the
        violations of another process of this run when this one has none."""
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
        if len(self.ledger) or self.job is None:
            return True
        # Nothing to say: never replace the violations of another process of this run (a
        # launcher that outlives its worker, a program that re-executes itself) with an empty
        # report. A report of another run is replaced.
        try:
            with open(path, encoding="utf-8") as existing:
                held = json.load(existing)
        except (OSError, ValueError):
            return True
        same_run = isinstance(held, dict) and held.get("job") == self.job
        return not (same_run and held.get("violations"))

    def _claim(self) -> None:
        """For a path without {pid}: join the run that writes it, or start one; warn a process
        that shares it with the process it came from."""
        if "{pid}" in self.template:
            self.job = None
            return
        pid, job, path = [*os.environ.get(OWNER, "").split(":", 2), "", ""][:3]
        if path == self.template and job:
            self.job = job
            if pid != str(os.getpid()):
                warn_once(
                    f"report-shared:{self.template}",
                    f"the report path {shown(self.template)} has no {{pid}}: this process "
                    f"({os.getpid()}) and process {pid}, which started it, write the same file; "
                    "put {pid} in the path to keep one report per process",
                )
            return
        self.job = secrets.token_hex(8)
        os.environ[OWNER] = f"{os.getpid()}:{self.job}:{self.template}"

    def _finalize_with_multiprocessing(self) -> None:
        # A multiprocessing worker ends with os._exit, past every exit handler, but runs the
        # finalizers multiprocessing keeps first. Registered at this process's first violation:
        # a forked worker clears the registry it inherits before its target runs, and a worker
        # always has multiprocessing loaded by then.
        self._finalized_in = os.getpid()
        util = sys.modules.get("multiprocessing.util")
        finalize = getattr(util, "Finalize", None)
        if finalize is not None:
            try:
                finalize(None, self.close, exitpriority=10)
            except Exception as exc:
                warn_once("report:finalize", f"no final report for this worker: {exc!r}")

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            thread = threading.Thread(target=self._run, name="cgguard-report", daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # no new thread to be had: write in place instead
                warn_once("report:thread", f"the report is written in place: {exc}")
                self._in_place = True
                return
            self._thread = thread

    def _run(self) -> None:
        while not self._closed:
            # Idle until something changes: a process with a settled report costs nothing.
            self._idle = True
            if not self._dirty:
                self._wake.wait()
            self._idle = False
            self._wake.clear()
            if self._closed:
                return
            rest = 0.0
            if self._dirty:
                self._dirty = False
                began = time.monotonic()
                self.write()
                rest = min(REST * (time.monotonic() - began), INTERVAL)
                self._stop.wait(rest)
            # At most two writes a second for counts; a new site cuts the wait short.
            self._wake.wait(INTERVAL - rest)
