"""The process's own state, in one owner: what outlives an installation, and the installation in
effect.

A program disables capture, follows a framework's flag or subscribes to violations whether or
not, and before or after, cgguard is installed; so these belong to the process, not to an
installation. ``PROCESS`` holds all of it, each part built whole by ``Process()``: a test's
``reset()`` makes a new one, and a forked child's fresh start is ``Process.after_fork``, the one
fork handler. Read it as ``_process.PROCESS`` at each use, never bound by name: a reset
replaces it.

Left out, each for its reason: the post-import hooks (cgguard._boot) and the
warnings already said (cgguard._support.warn), which start-up uses before this module exists;
how start-up activated the process (cgguard._boot), a fact that never changes; and
cgguard's counters in prometheus_client's registry (cgguard._reporting.metrics), registered
once per process as that registry requires.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import TYPE_CHECKING

from cgguard._census.compile_skips import CompileSkips
from cgguard._core.watcher import GraphNotes
from cgguard._gate.gate import Gate
from cgguard._inspect.inspections import Inspections
from cgguard._reporting import events
from cgguard._reporting.metrics import Prometheus
from cgguard._reporting.tracebacks import ExceptHooks
from cgguard._support import warn
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._core.installation import Installation
    from cgguard._core.probes import Device
    from cgguard._data.schema import ViolationEvent


class Process:
    """Everything cgguard keeps for this process, made whole here and nowhere else."""

    def __init__(self) -> None:
        # Held by install(), uninstall() and status(), and by whoever patches torch.
        self.lock = threading.RLock()
        # cgguard's capture flag and what it follows: whether a capture may begin.
        self.gate = Gate()
        # Called with every violation's full event, whatever the logging (cgguard.testing, the
        # pytest plugin): a test subscribes before it installs.
        self.listeners: list[Callable[[ViolationEvent], None]] = []
        # The installation in effect: set by install(), dropped by uninstall(). The capture
        # path never reads it: the hooks on torch are bound to their own installation's.
        self.installation: Installation | None = None
        self.notes = GraphNotes()  # whether graphs may hold watchers' notes
        self.inspections = Inspections(self.listeners)  # the inspected captures under way
        self.skips = CompileSkips()  # torch.compile's skipped cudagraphs, while counted
        self.prometheus = Prometheus()  # the metrics, where asked for
        self.excepthooks = ExceptHooks()  # uncaught violations shown trimmed, while installed
        # A runtime standing in for CUDA's, in place over torch: what the probes ask it.
        self.device: Device | None = None

    def after_fork(self) -> None:
        """A forked child's fresh start, in one place: a lock another thread held at the fork
        would never be released here, the parent's captures belong to threads the child lacks,
        and the child reports its own violations."""
        self.lock = threading.RLock()
        self.gate.after_fork()
        self.inspections.after_fork()
        if self.installation is not None:
            self.installation.after_fork()


PROCESS = Process()


def reset() -> None:
    """The process's state as it starts, for a test: a new owner, and no warning said yet.

    The installation, if any, is cgguard.uninstall()'s to end first: its hooks on torch and on
    the frameworks' modules belong to the owner that made them.
    """
    global PROCESS
    if PROCESS.installation is not None:
        raise RuntimeError("reset() while cgguard is installed: uninstall() first")
    PROCESS.gate.stop()
    PROCESS = Process()
    warn.forget()


def _after_fork() -> None:
    PROCESS.after_fork()


def _at_exit() -> None:
    """The run's summary, if anything was seen, and the final report."""
    installation = PROCESS.installation
    if installation is None:
        return
    try:
        reporter = installation.reporter
        run = reporter.run
        if run.seen() and reporter.log is not None:
            reporter.log.emit(events.summary(run.ledger, run.tally))
        if run.census.seen() and reporter.log is not None:
            reporter.log.emit(events.census(run.census))
        if reporter.report is not None:
            reporter.report.close()
    except Exception as exc:
        warn_once("exit", f"could not write the exit summary: {exc!r}")


# Once per process, when cgguard is first used: start-up alone never loads this module.
atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork)
