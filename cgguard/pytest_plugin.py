"""pytest plugin: guard every capture in a test session with ``pytest --cgguard``.

pytest imports this module in every run of every environment where cgguard is installed, so at
import time it loads pytest and the standard library only; cgguard (and through it wrapt,
structlog and torch) is imported in the hooks, once the session asks for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
from typing import TYPE_CHECKING

import pytest

from cgguard import _boot
from cgguard._errors import CaptureViolation

# Registered by being in the plugin's namespace, as fixtures defined here are.
from cgguard.testing.fixtures import simulated_cuda_runtime  # noqa: F401

if TYPE_CHECKING:
    from collections.abc import Generator

    from pluggy import Result

    from cgguard._config.config import Config
    from cgguard._data.schema import ViolationEvent
    from cgguard._install import CaptureMark, LeftOpen
    from cgguard.testing import SimulatedCuda
    from cgguard.testing._simcuda import ActiveCapture

Event = dict[str, object]

_PLUGIN_NAME = "cgguard-guard"
_HINT = (
    'Declare expected violations with @pytest.mark.cgguard_expect("<rule>", ...), '
    "or take the cgguard_violations fixture and assert on them in the test."
)
_PHASES = {"setup": "setup", "call": "the test", "teardown": "teardown"}

# The session decides whether cgguard is on once it has read its options (pytest_configure),
# after conftest files may have imported torch, whose import is captured output: set CGGUARD_*
# variables that went unheeded are said in the terminal summary instead (_unheeded).
_boot.switched_on = True
_unheeded: list[str] = []


class InstallationChangedWarning(pytest.PytestWarning):
    """A test uninstalled or reconfigured the session's cgguard; the plugin put it back."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cgguard", "cgguard: guard CUDA-graph captures")
    group.addoption(
        "--cgguard",
        action="store_true",
        help="guard every CUDA-graph capture; a test during which a violation occurs fails",
    )
    group.addoption(
        "--no-cgguard",
        action="store_true",
        help="switch the guard off, whatever --cgguard or the ini file say, and inspection "
        "with it; the simulated CUDA runtime stays where asked for",
    )
    group.addoption(
        "--cgguard-simulate-cuda",
        action="store_true",
        help="with --cgguard, run the session on cgguard's simulated CUDA runtime (where no CUDA "
        "device is usable); with --no-cgguard, the simulation alone",
    )
    group.addoption(
        "--cgguard-inspect",
        action="store_true",
        help="with --cgguard, inspect every capture op by op and every replay (implicit_sync, "
        "dead_input, rng_during_capture)",
    )
    parser.addini("cgguard", "like --cgguard", type="bool", default=False)
    parser.addini(
        "cgguard_simulate_cuda", "like --cgguard-simulate-cuda", type="bool", default=False
    )
    parser.addini("cgguard_inspect", "like --cgguard-inspect", type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    # Registered whether or not the guard is on, so that --strict-markers accepts the marker
    # in a run without --cgguard too.
    config.addinivalue_line(
        "markers",
        "cgguard_expect(*rules): the test expects cgguard violations of these rules; it fails "
        "if one of them does not occur (--cgguard only)",
    )
    # Each one read whatever wins, so that a bad ini value is said whichever options are given.
    off = bool(config.getoption("no_cgguard"))
    guard = _flag(config, "cgguard") and not off
    simulate = _flag(config, "cgguard_simulate_cuda")
    inspect = _flag(config, "cgguard_inspect") and not off
    # --no-cgguard says that the guard is off by choice, as CGGUARD_ENABLED=0 does.
    if not guard and not off and any(name.startswith("CGGUARD_") for name in os.environ):
        from cgguard._config.settings import unheeded

        line = unheeded("(pytest ran without --cgguard)", switch="--cgguard")
        _unheeded[:] = [] if line is None else [line]
    if not (guard or off):
        _refuse_without_the_switch(simulate=simulate, inspect=inspect)
    if not (guard or simulate):
        return
    cleanup = contextlib.ExitStack()
    # Cleanups run after every pytest_unconfigure hook, in reverse order of set-up.
    config.add_cleanup(cleanup.close)
    if not guard:
        _simulate(cleanup)
        return
    import cgguard

    cgguard_config = None if _already_active() else cgguard.Config.from_environ()
    if inspect:
        # On top of the environment's configuration, or of the activation's already in effect.
        active = cgguard.status().config if cgguard_config is None else cgguard_config
        if active is not None and not active.inspect:
            cgguard_config = dataclasses.replace(active, inspect=True)
    # The runtime comes first, as with CGGUARD_SIMULATE_CUDA activation: install() then patches
    # torch at once, and the patches come off before the runtime goes away.
    if simulate or (cgguard_config is not None and cgguard_config.simulate_cuda):
        _simulate(cleanup)
    if cgguard_config is not None:
        cgguard.install(cgguard_config)
        cleanup.callback(cgguard.uninstall)
    plugin = _Guard()
    config.pluginmanager.register(plugin, _PLUGIN_NAME)
    cleanup.callback(config.pluginmanager.unregister, plugin)
    cleanup.enter_context(plugin.listening())
    cleanup.enter_context(_stacks_start_at_the_test())


def _refuse_without_the_switch(*, simulate: bool, inspect: bool) -> None:
    """The options that only say how to guard, given without saying whether: a usage error.

    --cgguard (or ``cgguard = true``) is the one switch that turns the guard on, as --cov is
    pytest-cov's and CGGUARD_ENABLED the environment's; the others never turn it on by
    themselves, and are not ignored either: a session believed guarded that is not passes
    whatever its captures do.
    """
    given = [
        option
        for option, asked in (
            ("--cgguard-simulate-cuda (or cgguard_simulate_cuda)", simulate),
            ("--cgguard-inspect (or cgguard_inspect)", inspect),
        )
        if asked
    ]
    if given:
        verb = "needs" if len(given) == 1 else "need"
        raise pytest.UsageError(
            f"{' and '.join(given)} {verb} --cgguard (or cgguard = true) to guard the session, "
            "or --no-cgguard to run it unguarded"
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    # Said where the session runs, since --no-cgguard overrides what the ini file asks for.
    if not config.getoption("no_cgguard"):
        return []
    simulated = _flag(config, "cgguard_simulate_cuda")
    return [
        "cgguard: the guard is off (--no-cgguard)"
        + ("; the session runs on the simulated CUDA runtime" if simulated else "")
    ]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _unheeded:
        terminalreporter.write_line(f"cgguard: {line}", yellow=True)


# In every session, --cgguard or not: a test may install cgguard itself. An old-style wrapper,
# as _Guard's below; its part before the yield runs before pytest builds the report.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, None, None]:
    """A failure by a violation shows its traceback ending at the test's line.

    cgguard's modules hide their own frames from pytest (``__tracebackhide__``), but not the
    torch frames around them (a dispatch mode's wrappers): the frames after the user's last
    one are left out of the report, as sys.excepthook leaves them out of an uncaught one.
    ``--full-trace`` shows every frame; ``--pdb`` gets the whole traceback either way.
    """
    excinfo = call.excinfo
    if excinfo is None or item.config.getoption("fulltrace", False):
        yield
        return
    from cgguard._reporting.tracebacks import shown_trimmed, trimmed

    value = excinfo.value
    if isinstance(value, CaptureViolation):
        short = trimmed(excinfo.tb)
        if short is not None and short is not excinfo.tb:
            # A Traceback of its own entries: the native style (--tb=native) follows the raw
            # chain from the first of them, so that must end at the user's line too.
            excinfo.traceback = type(excinfo.traceback)(short)
    with shown_trimmed(value):  # violations chained to the failure
        yield


@pytest.fixture
def cgguard_violations(request: pytest.FixtureRequest) -> list[Event]:
    """This test's violations, as full events; the test asserts on them, cgguard does not fail it.

    The list grows as violations occur. Skips the test when the session runs without --cgguard.
    """
    plugin = request.config.pluginmanager.get_plugin(_PLUGIN_NAME)
    test: _Test | None = request.node.stash.get(_TEST, None)
    if not isinstance(plugin, _Guard) or test is None:
        if request.config.getoption("no_cgguard"):
            pytest.skip("cgguard is switched off by --no-cgguard")
        pytest.skip("cgguard is not active: run pytest with --cgguard")
    test.handled = True
    return test.events


class _Test:
    """What the guard knows about the test running now."""

    def __init__(self, expected: frozenset[str]) -> None:
        self.events: list[Event] = []  # every violation since its setup began, in order
        self.reported = 0  # how many of them a phase's report has already looked at
        self.expected = expected
        self.handled = False  # the test took cgguard_violations and judges them itself
        self.skipped = False  # a phase was skipped or xfailed: what it left open is not judged
        # The captures open when it began, cgguard's and the simulated runtime's: not its own.
        self.kept: CaptureMark = ()
        self.simulation: SimulatedCuda | None = None
        self.simulated: frozenset[int] = frozenset()
        self.settled = False  # its captures and the installation checked once its teardown ran
        self.left_open: str | None = None  # the captures it left open, described
        # The violations its reports show, each with its stacks or as the exception that failed
        # it: the console log's copy of them comes out of its captured stderr.
        self.shown: list[Event] = []
        self.changed: str | None = None  # how it changed the session's installation


_TEST = pytest.StashKey[_Test]()


class _Guard:
    """The hooks that run while --cgguard is on: violations, attributed to the running test."""

    def __init__(self) -> None:
        self._current: _Test | None = None
        self._lock = threading.Lock()
        # The session's configuration, restored after a test that changed it: the one in effect
        # when the first test begins, or later, once an activation waiting for torch installs.
        self._session: Config | None = None

    @contextlib.contextmanager
    def listening(self) -> Generator[None, None, None]:
        # A listener of its own rather than the log stream: logging drops stacks on repeats,
        # and a test must see every violation in full (PITFALLS, "Reporting and integrations").
        from cgguard import _process

        _process.PROCESS.listeners.append(self._listen)
        try:
            yield
        finally:
            with contextlib.suppress(ValueError):  # gone already if someone removed it
                _process.PROCESS.listeners.remove(self._listen)

    def _listen(self, event: ViolationEvent) -> None:
        # Called by whichever thread broke a rule; outside a test there is no one to fail.
        with self._lock:
            if self._current is not None:
                self._current.events.append(dict(event))

    # Old-style wrappers (hookwrapper=True): pluggy takes new-style ones only from 1.2 on, and
    # this module is imported by every pytest run, whatever its pluggy.
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        test = _Test(_expected_rules(item))
        self._begin(test)
        item.stash[_TEST] = test
        with self._lock:
            self._current = test
        try:
            yield
        finally:
            with self._lock:
                self._current = None

    def _begin(self, test: _Test) -> None:
        """Note what is already open and installed as a test begins: none of its doing."""
        import cgguard
        from cgguard import _install
        from cgguard.testing import active_simulation

        if self._session is None and cgguard.is_installed():
            self._session = cgguard.status().config
        test.kept = _install.open_captures()
        test.simulation = active_simulation()
        if test.simulation is not None:
            test.simulated = frozenset(c.graph_id for c in test.simulation.active_captures())

    # Last, after the fixtures' own teardown: what is still open now, the test left open.
    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        # A warning made an error by a filter is raised here: this frame says nothing to the user.
        __tracebackhide__ = True
        test = item.stash.get(_TEST, None)
        if test is None:
            return
        self._settle(test)
        if test.changed is not None:
            # A warning, at the test's own line: a filter can ignore it, for one test or all,
            # or make it an error of this test's teardown.
            item.warn(InstallationChangedWarning(test.changed))

    def _settle(self, test: _Test) -> None:
        """Once a test's teardown ran: let go of the captures it left open, and put the
        session's installation back if it changed. The next test then starts clean."""
        if test.settled:
            return
        test.settled = True
        _drop_abandoned()  # reported as such, not as left open
        test.left_open = _forget_left_open(test)
        test.changed = self._restore_installation()

    def _restore_installation(self) -> str | None:
        """Install the session's configuration again if the test changed it; say how it did."""
        import cgguard

        status = cgguard.status()
        if self._session is None:
            if status.installed:  # an activation waiting for torch, which this test imported
                self._session = status.config
            return None
        if not status.installed:
            cgguard.install(self._session)
            return (
                "cgguard: this test uninstalled cgguard; the plugin installed it again, with "
                "the session's configuration, for the tests after it"
            )
        if status.config is None or status.config == self._session:
            return None
        changes = _changes(self._session, status.config)
        cgguard.install(self._session)
        return (
            f"cgguard: this test changed cgguard's configuration ({changes}); the plugin put "
            "the session's configuration back for the tests after it"
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        test = item.stash.get(_TEST, None)
        unknown = _unknown_rules(test.expected) if test is not None else []
        if unknown:
            pytest.fail(
                f"cgguard_expect: unknown rule(s) {', '.join(map(repr, unknown))}; the rules are "
                f"{', '.join(_rules())}",
                pytrace=False,
            )

    # tryfirst makes this the outermost wrapper: it sees the report after xfail handling.
    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Result[pytest.TestReport], None]:
        _drop_abandoned()
        test = item.stash.get(_TEST, None)
        # Where the teardown failed, pytest_runtest_teardown above never ran: settle here.
        settled = test is None or test.settled
        if test is not None and call.when == "teardown":
            self._settle(test)
        report = (yield).get_result()
        if test is None:
            return
        if report.skipped:
            test.skipped = True
        problems: list[str] = []
        if call.when == "teardown":
            if test.left_open is not None and not test.skipped:
                problems.append(test.left_open)
            if test.changed is not None and not settled:
                problems.append(test.changed)  # never warned of: its teardown failed first
        raised = _raised(call)
        test.shown += raised  # by the failure's own E lines
        if test.handled:
            _judge(report, problems)
            _drop_logged(report, test.shown)
            return
        with self._lock:
            new = test.events[test.reported :]
            test.reported = len(test.events)
        if report.skipped:  # skipped or xfailed: the outcome says the test was not judged
            return
        unexpected = [e for e in new if e.get("rule") not in test.expected]
        test.shown += unexpected
        problems += _describe_unexpected(unexpected, call.when, raised)
        if call.when == "call":
            occurred = {e.get("rule") for e in test.events}
            missing = sorted(test.expected - occurred)
            if missing:
                noun = "violation" if len(missing) == 1 else "violations"
                problems.append(
                    f"cgguard: expected {', '.join(missing)} {noun} did not occur "
                    "(@pytest.mark.cgguard_expect)"
                )
        _judge(report, problems)
        _drop_logged(report, test.shown)


def _judge(report: pytest.TestReport, problems: list[str]) -> None:
    """Fail a passing report with ``problems``; add them to a failing one as a section."""
    if not problems:
        return
    text = "\n\n".join(problems)
    if report.passed:
        report.outcome = "failed"
        report.longrepr = text
    else:
        # Already failing for its own reason: keep that, and say what cgguard saw too.
        report.sections.append(("cgguard", text))


def _drop_abandoned() -> None:
    # A capture left by a thread the test started and ended is this test's violation; found
    # later, it would fail whichever test came next.
    from cgguard import _process

    installation = _process.PROCESS.installation
    if installation is not None and installation.tracker is not None:
        installation.tracker.sweep()


def _forget_left_open(test: _Test) -> str | None:
    """Let go of the captures begun during ``test`` and still open; describe them, or None.

    cgguard forgets them, and the simulated runtime drops them, so that the next test does not
    begin inside them. CUDA cannot be told: no call undoes a capture, and one begun on another
    thread cannot be ended from this one.
    """
    from cgguard import _install
    from cgguard.testing import active_simulation

    left = _install.forget_captures(test.kept)
    simulation = active_simulation()
    dropped: list[ActiveCapture] = []
    if simulation is not None:
        before = test.simulated if simulation is test.simulation else frozenset()
        begun = {c.graph_id for c in simulation.active_captures()} - before
        dropped = simulation.discard_captures(begun) if begun else []
    if not (left or dropped):
        return None
    return _describe_left_open(left, dropped, on_cuda=simulation is None and _cuda_is_usable())


def _describe_left_open(left: list[LeftOpen], dropped: list[ActiveCapture], on_cuda: bool) -> str:
    from cgguard._support.frames import format_frames

    count = len(left) or len(dropped)
    if count == 1:
        blocks = ["cgguard: a capture begun during this test was still open after its teardown"]
    else:
        blocks = [
            f"cgguard: {count} captures begun during this test were still open after its teardown"
        ]
    for capture in left:
        frames = format_frames(capture.began_at)
        began = ", begun at (most recent call last):\n" + frames if frames else ""
        blocks.append(f"{capture.api} ({capture.mode} mode) on thread {capture.thread}{began}")
    if not left:  # cgguard was uninstalled for part of the test: only the simulation knew
        blocks += [
            f"a capture on simulated stream {c.stream_id} ({c.mode} mode), which cgguard did not "
            "track: it was not installed throughout the test"
            for c in dropped
        ]
    it = "it" if count == 1 else "them"
    fate = (
        f"cgguard no longer counts {it} as open, so the tests after this one do not run inside {it}"
    )
    if dropped:
        fate += f"; the simulated CUDA runtime has dropped {it} too"
    elif on_cuda:
        fate += (
            f"; CUDA still holds {it} open, and may fail later CUDA calls of this process "
            "because of it"
        )
    blocks.append(
        f"{fate}. End every capture in the test that begins it: leave its torch.cuda.graph "
        "block, or call capture_end()."
    )
    return "\n\n".join(blocks)


def _cuda_is_usable() -> bool:
    """Whether torch drives a real CUDA device here (without importing torch)."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_available())
    except Exception:
        return False


def _changes(session: Config, now: Config) -> str:
    """What differs between two configurations, field by field: ``mode: 'raise' -> 'log'``."""
    before, after = session.as_dict(), now.as_dict()
    return ", ".join(
        f"{name}: {before[name]!r} -> {after[name]!r}"
        for name in before
        if before[name] != after[name]
    )


def _raised(call: pytest.CallInfo[None]) -> list[Event]:
    """The events of the violations a phase failed with: the exception, raised and not caught,
    and those chained to it, which pytest shows too."""
    if call.excinfo is None:
        return []
    from cgguard._reporting.tracebacks import violations

    return [dict(violation.event) for violation in violations(call.excinfo.value)]


def _describe_unexpected(events: list[Event], when: str, raised: list[Event]) -> list[str]:
    """The report of violations nobody expected, one block per distinct violation.

    Those ``raised`` (the exception the phase failed with, and those chained to it) have their
    message on pytest's own E lines already: their blocks show their stacks alone, so that
    each violation is shown once.
    """
    from cgguard._support.text import shown

    if not events:
        return []
    # A capture retried in a loop repeats one violation: show it once, with its count.
    distinct: dict[tuple[object, object], tuple[Event, int]] = {}
    for event in events:
        key = (event.get("rule"), event.get("message"))
        first, count = distinct.get(key, (event, 0))
        distinct[key] = (first, count + 1)
    # The first line is what pytest's short summary shows: the rules, up front.
    rules = ", ".join(dict.fromkeys(str(event.get("rule")) for event in events))
    phase = _PHASES.get(when, when)
    if len(events) == 1:
        blocks = [f"cgguard: {rules} violation during {phase}"]
    else:
        blocks = [f"cgguard: {len(events)} violations ({rules}) during {phase}"]
    said = {(event.get("rule"), event.get("message")) for event in raised}
    for key, (event, count) in distinct.items():
        repeated = f", {count} times" if count > 1 else ""
        # File and function names in the message come from the program: shown safe, as the
        # stacks below are.
        message = "the exception above" if key in said else shown(event.get("message"))
        blocks.append(
            f"{event.get('rule')} ({event.get('action')}{repeated}): {message}\n" + _stacks(event)
        )
    blocks.append(_HINT)
    return ["\n\n".join(blocks)]


def _drop_logged(report: pytest.TestReport, events: list[Event]) -> None:
    """Take the console log's line of each of ``events`` out of the report's captured stderr.

    The log writes each violation as one JSON line to stderr, which pytest captures: shown
    beside the report that already shows the violation, it would be the same thing a third
    time. A log in the console format, or to a file or to logging, is left as it is.
    """
    if not events:
        return
    keys = {_logged_as(event) for event in events}
    sections = []
    for title, written in report.sections:
        content = written
        if title.startswith("Captured stderr") and _VIOLATION in written:
            kept = [line for line in written.splitlines(True) if _line_key(line) not in keys]
            content = "".join(kept)
            if not content.strip():
                continue  # nothing else was written: no empty section
        sections.append((title, content))
    report.sections[:] = sections


_VIOLATION = '"cgguard.capture_violation"'


def _logged_as(event: Event) -> tuple[object, ...]:
    """What tells the log line of a violation from another's: its first at a site, or a repeat
    said briefly (at 2, 4, 8, ... times), which has the rule, the count and the thread too."""
    keys = ("rule", "action", "api", "count", "thread_id", "pid")
    return tuple(event.get(key) for key in keys)


def _line_key(line: str) -> tuple[object, ...] | None:
    """_logged_as() of the violation a line of stderr logs; None for any other line."""
    if _VIOLATION not in line or not line.startswith("{"):
        return None
    import json

    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("event") != "cgguard.capture_violation":
        return None
    return _logged_as(event)


def _stacks(event: Event) -> str:
    """The event's stacks as the console log shows them."""
    from cgguard._reporting.log import format_stacks

    return format_stacks(event)


def _stacks_start_at_the_test() -> contextlib.AbstractContextManager[None]:
    """Every event's stacks start at the test function or fixture pytest called.

    In the events themselves, not only in this plugin's report: the log, the JSON report and
    the cgguard_violations fixture then show the test's frames without pytest's and pluggy's
    thirty or so above them.
    """
    import _pytest
    import pluggy

    from cgguard._support.frames import started_by

    def folder(module: object) -> str:
        return os.path.dirname(str(getattr(module, "__file__", "")))

    return started_by(
        runner=(folder(_pytest), folder(pytest), folder(pluggy)), dispatcher=(folder(pluggy),)
    )


def _expected_rules(item: pytest.Item) -> frozenset[str]:
    rules: set[str] = set()
    for mark in item.iter_markers("cgguard_expect"):
        rules.update(str(rule) for rule in mark.args)
    return frozenset(rules)


def _rules() -> tuple[str, ...]:
    from cgguard._rules.table import NAMES

    return NAMES


def _unknown_rules(expected: frozenset[str]) -> list[str]:
    return sorted(expected - set(_rules()))


def _flag(config: pytest.Config, name: str) -> bool:
    """An option given on the command line, or set in the ini file.

    A bad value in the ini file is one line naming the option: pytest's own says only
    "invalid truth value".
    """
    try:
        in_ini = config.getini(name)
    except (ValueError, TypeError, pytest.UsageError) as exc:
        raise pytest.UsageError(
            f"ini option {name}: {exc}; accepted values are true or false (as text also "
            "yes/no, on/off, 1/0)"
        ) from None
    return bool(config.getoption(name) or in_ini)


def _already_active() -> bool:
    """Whether cgguard is on before the session: install() in a conftest, or CGGUARD_ENABLED."""
    import cgguard

    # Environment activation installs only once torch is imported, so is_installed() alone would
    # miss it; its configuration is the user's, kept as it is.
    status = cgguard.status()
    return status.installed or status.activated_by is not None


def _simulate(cleanup: contextlib.ExitStack) -> None:
    """Put the simulated CUDA runtime in place until the session ends."""
    try:
        import torch  # noqa: F401 - an environment activation starts its own runtime on this import
    except ImportError as exc:
        raise pytest.UsageError(f"--cgguard-simulate-cuda needs torch: {exc}") from None
    from cgguard.testing import SimulationError, active_simulation, simulated_cuda
    from cgguard.testing._simcuda import SESSION_MAX_CALLS

    if active_simulation() is not None:  # CGGUARD_SIMULATE_CUDA activation put one in place
        return
    try:
        cleanup.enter_context(simulated_cuda(max_calls=SESSION_MAX_CALLS))
    except SimulationError as exc:
        raise pytest.UsageError(f"--cgguard-simulate-cuda: {exc}") from None
