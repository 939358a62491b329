"""One installation: how it answers violations, what it put on torch, and its capture path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cgguard import _boot
from cgguard._data.ledger import Run
from cgguard._reporting.report_file import ReportFile
from cgguard._reporting.reporter import Reporter
from cgguard._rules.exempt_match import Exemptions
from cgguard._support.patchset import PatchSet, describe

if TYPE_CHECKING:
    from cgguard._core.syncs import SyncChecks
    from cgguard._core.tracker import Tracker
    from cgguard._core.watcher import GraphNotes, Watcher
    from cgguard._gate.gate import Gate


class Installation:
    """One install(): how violations are answered, what torch carries, and the capture path.

    The reporter is built whole from a configuration and swapped in whole (``use``); the run it
    counts into is kept across every swap. The tracker and its synchronize checks exist once
    torch is patched.
    """

    def __init__(self, reporter: Reporter, gate: Gate, notes: GraphNotes) -> None:
        self.reporter = reporter
        # The process's gate, whose flag and follows the capture path reads, and whether its
        # graphs may hold watchers' notes.
        self.gate = gate
        self.notes = notes
        self.tracker: Tracker | None = None
        self.syncs: SyncChecks | None = None
        # What cgguard._core.patches put on torch: its entry points.
        self.patches = PatchSet()
        # torch._C._cuda_synchronize, which comes and goes with a runtime standing in for
        # CUDA's on CPU builds: that runtime may remove it first, and then there is nothing to
        # put back. Also the hooks on its stand-ins where they do not extend torch's classes.
        self.device_sync = PatchSet(keep_newer=True)
        # What follows each capture beyond the rules (cgguard._core.watcher), as the
        # configuration asks; and the hook on CUDAGraph.replay, in place only while one of them
        # wants it.
        self.watchers: tuple[Watcher, ...] = ()
        self.replay = PatchSet()
        # Where replay lands, as cgguard._core.patches found it: torch's CUDAGraph, and a
        # stand-in's that does not extend it.
        self.replay_targets: list[tuple[Any, str]] = []
        # The watchers' own hooks on torch (Watcher.hooks), in place while they are watching;
        # and the modules they name, waited for until imported (Watcher.hook_modules).
        self.watcher_hooks = PatchSet()
        self.hook_modules: set[str] = set()

    @property
    def run(self) -> Run:
        """What this installation has seen, whatever its configuration since."""
        return self.reporter.run

    def use(self, reporter: Reporter) -> Reporter:
        """Answer violations with ``reporter`` from now on; return the old one, for the caller
        to retire once it holds no lock a violation in flight may want."""
        old = self.reporter
        self.reporter = reporter
        if self.tracker is not None:
            self.tracker.reporter = reporter
        return old

    def set_watchers(self, watchers: tuple[Watcher, ...]) -> None:
        """Follow captures with ``watchers`` from now on (the tracker's, once torch is patched);
        the replay hook goes on or comes off with them."""
        for old in self.watchers:
            if old not in watchers:
                old.retired()
        for new in watchers:
            if new not in self.watchers:
                new.started()
        self.watchers = watchers
        self.wait_for_modules({name for watcher in watchers for name in watcher.hook_modules})
        if self.tracker is not None:
            self.tracker.set_watchers(watchers)
            self._hook_replays()
            self._hook_watchers()

    def wait_for_modules(self, names: set[str]) -> None:
        """Put the watchers' hooks on again as each module of ``names`` is imported; stop
        waiting for the others."""
        for name in self.hook_modules - names:
            _boot.cancel(name, self._module_ready)
        waiting, self.hook_modules = self.hook_modules, names
        for name in names - waiting:
            _boot.when_ready(name, self._module_ready)

    def _module_ready(self, _: object) -> None:
        if self.tracker is not None:
            self._hook_watchers()

    def _hook_replays(self) -> None:
        """Hook CUDAGraph.replay while a watcher wants replays; put torch's back otherwise."""
        tracker = self.tracker
        if tracker is None or not tracker.fanout.replay_watchers:
            self.replay.restore()
        elif [
            describe(owner, name) for owner, name in self.replay_targets
        ] != self.replay.targets():
            self.replay.restore()
            self.replay.apply(
                (owner, name, tracker.fanout.make_replay) for owner, name in self.replay_targets
            )

    def _hook_watchers(self) -> None:
        """Put on the hooks the watchers ask for, unless they are already there."""
        hooks = [hook for watcher in self.watchers for hook in watcher.hooks()]
        wanted = [describe(owner, name) for owner, name, _ in hooks]
        held = all(self.watcher_hooks.holds(owner, name) for owner, name, _ in hooks)
        if wanted == self.watcher_hooks.targets() and held:
            return
        self.watcher_hooks.restore()
        self.watcher_hooks.apply(hooks)

    def after_fork(self) -> None:
        """A forked child's fresh start: a run of its own, no captures, no lock held.

        {pid} reports summed across a job must not count the parent's violations twice, the
        parent's captures belong to threads the child lacks, and a lock another thread held at
        the fork would never be released here.
        """
        old = self.reporter
        census, manifest = old.run.census, old.run.manifest
        census.after_fork()
        manifest.after_fork()
        run = Run(census, manifest)
        report = ReportFile(old.config, run, write_now=False) if old.report is not None else None
        exemptions = Exemptions(old.exemptions.pairs) if old.exemptions is not None else None
        self.reporter = Reporter(
            old.config,
            run,
            log=old.log.anew() if old.log is not None else None,
            report=report,
            exemptions=exemptions,
            profiles={name: Exemptions(e.pairs) for name, e in old.profiles.items()},
            listeners=old.listeners,
            metrics=old.metrics,
        )
        if self.tracker is not None:
            self.tracker.book.after_fork()
            self.tracker.reporter = self.reporter
