"""install(), uninstall() and status(): an installation built from a configuration, its hooks
on torch now or when torch is imported, and what it is doing."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

from cgguard import _boot, _process
from cgguard._config import settings as _settings
from cgguard._config.config import Config
from cgguard._core.installation import Installation
from cgguard._data.ledger import Run
from cgguard._errors import ConfigError
from cgguard._gate.profiles import exemptions as profile_exemptions
from cgguard._reporting.events import ranks as launcher_ranks
from cgguard._reporting.log import EventLog
from cgguard._reporting.report_file import ReportFile
from cgguard._reporting.reporter import Reporter
from cgguard._rules.exempt_match import Exemptions
from cgguard._rules.record import API, BEGAN_AT, MODE, THREAD
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from cgguard._core.probes import Device
    from cgguard._core.watcher import Watcher
    from cgguard._data.rank_compare import RankDifference
    from cgguard._data.schema import CensusReport
    from cgguard._gate.profiles import ProfileInfo
    from cgguard._gate.windows import WindowInfo
    from cgguard._inspect.bindings import StaleBinding
    from cgguard._rules.record import Record
    from cgguard._support.frames import FrameInfo


class CaptureInfo(NamedTuple):
    """A capture that has begun and not ended: who began it, through which API, in which mode."""

    thread_id: int
    api: str
    mode: str  # capture_error_mode: "global", "thread_local" or "relaxed"


@dataclasses.dataclass(frozen=True)
class Status:
    """What cgguard is doing in this process now (``cgguard.status()``)."""

    installed: bool
    # How activation switched it on: "pth", "sitecustomize", or None (install() or not at all).
    activated_by: str | None
    patched: tuple[str, ...]  # torch's entry points carrying cgguard's hooks
    waiting_for_torch: bool  # installed before torch's import: patched once torch is imported
    followed: tuple[str, ...]  # the flags followed, as module.attribute
    waiting_to_follow: tuple[str, ...]  # modules whose flag is followed once imported
    capture_enabled: bool  # cgguard's flag and every followed flag allow a capture now
    captures: tuple[CaptureInfo, ...]  # captures begun and not yet ended, on any thread
    violations: dict[str, int]  # violations seen per rule, since install
    config: Config | None
    # Captures an exemption let through, per rule, since install; not among the violations.
    exempted: dict[str, int] = dataclasses.field(default_factory=dict)
    # The exemptions in effect, as written: Config(exempt=...) and the exemptions file's.
    exemptions: tuple[str, ...] = ()
    # The capture windows declared, each with what it names and its state now.
    windows: tuple[WindowInfo, ...] = ()
    # The built-in profiles: each with its state, its windows and its exemptions.
    profiles: tuple[ProfileInfo, ...] = ()
    # Whether the census counts every capture; cgguard.census() says what it has counted.
    census: bool = False


def install(config: Config | None = None) -> None:
    """Guard every CUDA-graph capture in this process.

    Idempotent: patches torch once. Called again with a ``config``, it switches to that
    configuration. Works before torch is imported (the patches go on when it is; cgguard never
    imports torch itself) and after.
    """
    if config is not None and not isinstance(config, Config):
        raise ConfigError(
            f"install(config={config!r}): accepted values are None or a cgguard.Config"
        )
    # Switched on by the program itself: set CGGUARD_* variables are not left unheeded.
    _boot.switched_on = True
    process = _process.PROCESS
    with process.lock:
        installation = process.installation
        if installation is not None and config is None:
            return
        installation, replaced = _configure(
            process, installation, config if config is not None else Config()
        )
        process.excepthooks.install()  # an uncaught violation's traceback ends at the user's line
        # Patched already, or to be once torch is imported: nothing more to do now.
        done = bool(installation.patches)
        if not done and "torch" not in sys.modules:
            _boot.when_imported("torch", patch_on_import)
            done = True
    if replaced is not None:
        # Outside the lock: a violation in flight through the old reporter may be a listener's
        # that calls status() or install(), and the old one waits for it to leave.
        replaced.retire(installation.reporter)
    if done:
        return
    # torch is imported, or being imported: perhaps by another thread, whose import the hook
    # missed. Wait for it to finish (at once if this thread is the importer), outside the
    # lock, which that import's own hook may be waiting for, then patch.
    importlib.import_module("torch")
    _patch()


def uninstall() -> None:
    """Put torch's attributes back exactly as they were and stop reporting. Idempotent."""
    process = _process.PROCESS
    with process.lock:
        _boot.cancel("torch", patch_on_import)
        process.gate.stop()  # follow_flag() made before install() too
        process.skips.stop()
        process.prometheus.unwant()
        installation = process.installation
        if installation is None:
            return
        process.installation = None
        process.excepthooks.uninstall()
        _check_ranks_after_windows(process, None)
        tracker = installation.tracker
        if tracker is not None:
            # A hook someone still holds a reference to (a bound capture_begin, say) lets
            # everything through from now on, as torch's own would.
            tracker.retired = True
        installation.replay.restore()
        installation.watcher_hooks.restore()
        installation.wait_for_modules(set())
        for watcher in installation.watchers:
            watcher.retired()  # what a watcher put on besides its hooks comes off too
        installation.device_sync.restore()
        installation.patches.restore()
        if tracker is not None:
            # Each capture under way is over for cgguard: its watchers are told so, and those
            # on the capturing thread let go of what they hold there (a dispatch mode).
            tracker.book.forget()
            tracker.active.clear()
    # Outside the lock, as for a reconfiguration: it waits for violations in flight.
    installation.reporter.close()


def is_installed() -> bool:
    """Whether install() is in effect (the patches may still be waiting for torch's import)."""
    return _process.PROCESS.installation is not None


def status() -> Status:
    """What cgguard is doing in this process now: a snapshot, for people and tests."""
    process = _process.PROCESS
    gate = process.gate
    with process.lock:
        installation = process.installation
        if installation is None:
            return Status(
                installed=False,
                activated_by=_boot.activated_by,
                patched=(),
                waiting_for_torch=False,
                followed=gate.followed(),
                waiting_to_follow=tuple(gate.flags.waiting()),
                capture_enabled=gate.is_capture_enabled(),
                captures=(),
                violations={},
                config=None,
            )
        reporter, tracker = installation.reporter, installation.tracker
        active = list(tracker.active.values()) if tracker is not None else []
        return Status(
            installed=True,
            activated_by=_boot.activated_by,
            patched=tuple(
                installation.patches.targets()
                + installation.device_sync.targets()
                + installation.replay.targets()
                + installation.watcher_hooks.targets()
            ),
            waiting_for_torch=patch_on_import in _boot.pending("torch"),
            followed=gate.followed(),
            waiting_to_follow=tuple(gate.flags.waiting()),
            capture_enabled=gate.is_capture_enabled(),
            captures=tuple(
                CaptureInfo(record[THREAD].ident or 0, record[API], record[MODE])
                for record in active
            ),
            violations=reporter.run.ledger.totals(),
            config=reporter.config,
            exempted=reporter.run.tally.totals(),
            exemptions=tuple(_exempt_texts(reporter.exemptions)),
            windows=tuple(gate.windows.infos()),
            profiles=tuple(gate.profiles.infos()),
            census=reporter.config.census,
        )


def census() -> CensusReport:
    """What the census has counted in this process, as the JSON report holds it: a dict with
    ``captures`` (one entry per capture site) and ``cudagraph_skips`` (torch.compile's skipped
    cudagraphs, per reason and site). Plain values, for a test or a health endpoint; empty
    lists when cgguard is not installed or the census is off."""
    process = _process.PROCESS
    with process.lock:
        installation = process.installation
    if installation is None or not installation.reporter.config.census:
        return {"captures": [], "cudagraph_skips": []}
    counted = installation.run.census
    return {"captures": counted.captures(fresh=True), "cudagraph_skips": counted.skips()}


def check_bindings() -> list[StaleBinding]:
    """Check every live graph captured under inspection now: each name its capture read a
    tensor by (``runner.model.layers[3].self_attn.W_UV``) that holds another tensor now.

    Returns them (``name``, ``site``, ``change``, ``rebound_at``) and logs each as a
    ``stale_binding`` event, whatever the mode: its caller asked, so it never raises. A later
    replay of such a graph is still refused under the mode. Empty where inspection is off, or
    no graph was captured under it. For rebindings cgguard cannot see as they happen (an item
    of a dict, an attribute of an object that is not a module, an assignment from C++).
    """
    process = _process.PROCESS
    with process.lock:
        installation = process.installation
    if installation is None:
        return []
    for watcher in installation.watchers:
        # The inspector's, where inspection is on (its module is imported only then).
        check = getattr(watcher, "check_bindings", None)
        if check is not None:
            found: list[StaleBinding] = check(refuse=False)
            return found
    return []


class LeftOpen(NamedTuple):
    """A capture that forget_captures() let go of: begun, and never ended."""

    api: str
    mode: str
    thread: str  # the thread that began it: its name and id
    began_at: list[FrameInfo]  # the call that began it, outermost frame first


# The captures open at one moment, for forget_captures(): the records themselves, since a graph
# id may be reused by a capture begun later.
CaptureMark = tuple["Record", ...]


def open_captures() -> CaptureMark:
    """The captures open now, for forget_captures() to leave alone."""
    process = _process.PROCESS
    with process.lock:
        installation = process.installation
        tracker = installation.tracker if installation is not None else None
        return tuple(tracker.active.values()) if tracker is not None else ()


def forget_captures(kept: CaptureMark = ()) -> list[LeftOpen]:
    """Forget every open capture but ``kept``, and say what each was: a test runner's clean
    start for the next test. CUDA is not told: a capture it holds stays open there."""
    from cgguard._support.frames import Stack

    process = _process.PROCESS
    with process.lock:
        installation = process.installation
        tracker = installation.tracker if installation is not None else None
        left = tracker.book.forget(kept) if tracker is not None else []
    return [
        LeftOpen(
            record[API],
            record[MODE],
            f"{record[THREAD].name!r} ({record[THREAD].ident})",
            Stack(record[BEGAN_AT]).frames,
        )
        for record in left
    ]


def _exempt_texts(exemptions: Exemptions | None) -> list[str]:
    from cgguard._rules.exempt_syntax import text

    return [text(pair) for pair in exemptions.pairs] if exemptions is not None else []


def _configure(
    process: _process.Process, installation: Installation | None, config: Config
) -> tuple[Installation, Reporter | None]:
    """The installation, built from ``config``, or switched to it whole; with the reporter it
    replaced, if any, for the caller to retire."""
    run = installation.run if installation is not None else Run()
    reporter = _reporter(process, config, run)
    replaced = None
    if installation is None:
        installation = Installation(reporter, process.gate, process.notes)
        process.installation = installation
    else:
        replaced = installation.use(reporter)
    process.gate.configure(config)
    if config.metrics is not None:
        process.prometheus.want()
    else:
        process.prometheus.unwant()
    installation.set_watchers(_watchers(process, config, installation))
    _check_ranks_after_windows(process, installation if config.rank_check else None)
    if config.census:
        process.skips.start(installation)
    else:
        process.skips.stop()
    return installation, replaced


def _watchers(
    process: _process.Process, config: Config, installation: Installation
) -> tuple[Watcher, ...]:
    """What ``config`` has follow each capture beyond the rules (cgguard._core.watcher), in the
    order they are told: each feature that watches captures adds its own here."""
    watchers: list[Watcher] = []
    if config.census:
        watchers.append(_census_watcher(process, config, installation))
    if config.inspect:
        from cgguard._inspect.inspector import Inspector

        watchers.append(Inspector(installation, process.inspections, config.inspect_first))
    if config.manifest and (launcher_ranks() or _distributed()):
        # Last: a capture's inputs, which key it in the manifest, are noted by then.
        from cgguard._ranks.watcher import RankManifest

        keyed: Callable[[Any], str | None] | None = None
        if config.inspect:
            from cgguard._inspect.inspector import inputs_key as keyed
        # The one serving the installation already, if any: what it knows of the groups used
        # and the hooks that tell it stay one through a reconfiguration.
        ranked = next((w for w in installation.watchers if isinstance(w, RankManifest)), None)
        if ranked is None:
            ranked = RankManifest(installation, installation.run.manifest, keyed)
        ranked.inputs_key = keyed
        watchers.append(ranked)
    return tuple(watchers)


# How long the check made as a capture window closes (CGGUARD_RANK_CHECK) waits for the other
# ranks: long enough for a rank still capturing its last graphs, short of a job's own timeouts
# (torch.distributed's default is 10 minutes).
RANK_CHECK_TIMEOUT = 120.0


def _check_ranks_after_windows(
    process: _process.Process, installation: Installation | None
) -> None:
    """Compare the ranks each time a capture window closes, for ``installation`` (None: not);
    the rank check is the one listener to window closes."""
    closing = process.gate.windows.closing
    closing.clear()
    if installation is not None:
        from cgguard._ranks.check import after_window

        closing.append(functools.partial(after_window, installation, RANK_CHECK_TIMEOUT))


def check_ranks(timeout: float = 60.0) -> list[RankDifference]:
    """Compare this rank's capture manifest with every other rank's of the job, now: each rank
    puts its manifest in torch.distributed's store (no collective) and waits up to ``timeout``
    seconds for the others'. Call it on every rank.

    Returns what differs, the same list on every rank that arrived: each a ``RankDifference``
    (``kind``, ``ranks``: the differing side or those that did not arrive, ``others``,
    ``detail``, ``capture``); empty when the ranks agree. What differs is reported as one
    ``rank_divergence`` event, raised where that rule's action is raise. Without
    torch.distributed's default group, or without a manifest, one warning line and an empty
    list (docs/ranks.md).
    """
    from cgguard._ranks.check import check_ranks as check
    from cgguard._ranks.check import checked_timeout

    checked_timeout(timeout)
    process = _process.PROCESS
    with process.lock:
        installation = process.installation
    if installation is None:
        warn_once("ranks:installed", "check_ranks: cgguard is not installed: nothing to compare")
        return []
    return check(installation, timeout)


def _distributed() -> bool:
    """Whether torch.distributed has a default group in this process (never imports it)."""
    from cgguard._ranks.first_use import distributed

    return distributed() is not None


def _census_watcher(
    process: _process.Process, config: Config, installation: Installation
) -> Watcher:
    """The census's watcher, counting into the run's census (kept across reconfiguration)."""
    from cgguard._census.watcher import CensusWatcher

    def memory() -> Callable[[], tuple[int, int, int] | None] | None:
        tracker = installation.tracker
        return tracker.probes.memory if tracker is not None else None

    def changed() -> None:
        # Read once per capture: a reconfiguration or a fork swaps the reporter, and its
        # report, whole.
        report = installation.reporter.report
        if report is not None:
            report.changed(new_site=False)

    prepare: Callable[[], None] | None = None
    if config.inspect:
        from cgguard._inspect import mode

        prepare = mode.prepare
    metrics = config.metrics is not None
    return CensusWatcher(
        installation.run.census,
        replays=config.census_replays,
        memory=memory,
        # Without a report, nothing to tell: a call less per capture.
        changed=changed if config.report is not None else None,
        counted=process.prometheus.captured if metrics else None,
        replayed=process.prometheus.replayed if metrics and config.census_replays else None,
        # Inspection's one-time set-up, done before the first capture's clock starts.
        prepare=prepare,
    )


def _reporter(process: _process.Process, config: Config, run: Run) -> Reporter:
    """How ``config`` answers violations, counting into ``run``."""
    log = EventLog(
        config.log_format, config.log_file, target=config.target(), level=config.log_level
    )
    pairs = _exemptions_of(config)
    return Reporter(
        config,
        run,
        listeners=process.listeners,
        log=log,
        report=ReportFile(config, run) if config.report is not None else None,
        exemptions=Exemptions(pairs) if pairs else None,
        profiles=(
            {name: Exemptions(p) for name, p in profile_exemptions().items() if p}
            if config.profiles != "off"
            else None
        ),
        metrics=process.prometheus if config.metrics is not None else None,
    )


def _exemptions_of(config: Config) -> list[tuple[str, str]]:
    """The configuration's exemptions and its exemptions file's; each line of the file that is
    ignored, or the whole file, is one warning, as is each exemption that matches every file."""
    # A dict for its keys' order: a file of thousands of entries is joined in one pass.
    pairs = dict.fromkeys(config.exempt)
    if config.exempt_file is not None:
        found, problems = _settings.exemptions_file(config.exempt_file)
        for line in problems:
            warn_once(line, line)
        pairs.update(dict.fromkeys(found))
    for line in _settings.catch_alls(pairs):
        warn_once(line, line)
    return list(pairs)


def _patch() -> None:
    """Patch torch now; a failure is reported once and the program goes on, unguarded."""
    process = _process.PROCESS
    with process.lock:
        installation = process.installation
        if installation is None or installation.patches:
            return
        try:
            from cgguard._core.patches import patch_torch

            patch_torch(installation, process.device)
        except Exception as exc:
            warn_once("patch", f"could not patch torch, captures are not guarded: {exc!r}")


def patch_on_import(_: ModuleType) -> None:
    """The post-import hook on torch: the same path as an install() made after the import."""
    # Runs inside torch's import, right after torch/__init__.py finished: asking sys.modules
    # here would mislead, since torch is already listed there while its import still finishes.
    _patch()


def torch_changing() -> None:
    """torch's device entry points are about to be replaced, by a runtime standing in for
    CUDA's or by torch's own again: cgguard's hooks on what goes come off first."""
    process = _process.PROCESS
    with process.lock:
        installation = process.installation
        if installation is not None:
            installation.device_sync.restore()


def torch_changed(device: Device | None) -> None:
    """torch's device entry points were replaced: cgguard's hooks go on what is there now
    (a synchronize, stand-in classes that do not extend torch's), and ``device`` answers what
    torch cannot (None: torch's own device is back)."""
    process = _process.PROCESS
    with process.lock:
        process.device = device
        installation = process.installation
        if installation is not None and installation.patches:
            from cgguard._core.patches import patch_device_sync

            patch_device_sync(installation, device)
