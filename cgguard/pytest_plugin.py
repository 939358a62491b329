"""pytest plugin: guard every capture in a test session with ``pytest --cgguard``.

pytest imports this module in every run of every environment where cgguard is installed, so at
import time it loads pytest and the standard library only; cgguard (and through it wrapt,
structlog and torch) is imported in the hooks, once the session asks for it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

    from pluggy import Result

    from cgguard._schema import ViolationEvent
    from cgguard.testing import SimulatedCuda

Event = dict[str, object]

_PLUGIN_NAME = "cgguard-guard"
_HINT = (
    'Declare expected violations with @pytest.mark.cgguard_expect("<rule>", ...), '
    "or take the cgguard_violations fixture and assert on them in the test."
)
_PHASES = {"setup": "setup", "call": "the test", "teardown": "teardown"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cgguard", "cgguard: guard CUDA-graph captures")
    group.addoption(
        "--cgguard",
        action="store_true",
        help="guard every CUDA-graph capture; a test during which a violation occurs fails",
    )
    group.addoption(
        "--cgguard-simulate-cuda",
        action="store_true",
        help="run the session on cgguard's simulated CUDA runtime (where no CUDA device is usable)",
    )
    parser.addini("cgguard", "like --cgguard", type="bool", default=False)
    parser.addini(
        "cgguard_simulate_cuda", "like --cgguard-simulate-cuda", type="bool", default=False
    )


def pytest_configure(config: pytest.Config) -> None:
    # Registered whether or not the guard is on, so that --strict-markers accepts the marker
    # in a run without --cgguard too.
    config.addinivalue_line(
        "markers",
        "cgguard_expect(*rules): the test expects cgguard violations of these rules; it fails "
        "if one of them does not occur (--cgguard only)",
    )
    guard = _flag(config, "cgguard")
    simulate = _flag(config, "cgguard_simulate_cuda")
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


@pytest.fixture
def cgguard_violations(request: pytest.FixtureRequest) -> list[Event]:
    """This test's violations, as full events; the test asserts on them, cgguard does not fail it.

    The list grows as violations occur. Skips the test when the session runs without --cgguard.
    """
    plugin = request.config.pluginmanager.get_plugin(_PLUGIN_NAME)
    test: _Test | None = request.node.stash.get(_TEST, None)
    if not isinstance(plugin, _Guard) or test is None:
        pytest.skip("cgguard is not active: run pytest with --cgguard")
    test.handled = True
    return test.events


@pytest.fixture
def simulated_cuda_runtime() -> Generator[SimulatedCuda, None, None]:
    """torch.cuda on cgguard's simulated CUDA runtime for one test; torch restored after it."""
    # torch and the simulated runtime are imported here, when a test asks, never at plugin load.
    from cgguard.testing import simulated_cuda

    with simulated_cuda() as runtime:
        yield runtime


class _Test:
    """What the guard knows about the test running now."""

    def __init__(self, expected: frozenset[str]) -> None:
        self.events: list[Event] = []  # every violation since its setup began, in order
        self.reported = 0  # how many of them a phase's report has already looked at
        self.expected = expected
        self.handled = False  # the test took cgguard_violations and judges them itself


_TEST = pytest.StashKey[_Test]()


class _Guard:
    """The hooks that run while --cgguard is on: violations, attributed to the running test."""

    def __init__(self) -> None:
        self._current: _Test | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def listening(self) -> Generator[None, None, None]:
        # A listener of its own rather than the log stream: logging drops stacks on repeats,
        # and a test must see every violation in full (PITFALLS, "Reporting and integrations").
        from cgguard._state import LISTENERS

        LISTENERS.append(self._listen)
        try:
            yield
        finally:
            with contextlib.suppress(ValueError):  # gone already if someone removed it
                LISTENERS.remove(self._listen)

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
        item.stash[_TEST] = test
        with self._lock:
            self._current = test
        try:
            yield
        finally:
            with self._lock:
                self._current = None

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
        # A capture left by a thread the test started and ended is this test's violation; found
        # later, it would fail whichever test came next.
        from cgguard import _state

        installation = _state.current
        if installation is not None and installation.tracker is not None:
            installation.tracker.drop_abandoned()
        report = (yield).get_result()
        test = item.stash.get(_TEST, None)
        if test is None or test.handled:
            return
        with self._lock:
            new = test.events[test.reported :]
            test.reported = len(test.events)
        if report.skipped:  # skipped or xfailed: the outcome says the test was not judged
            return
        problems = _describe_unexpected(
            [e for e in new if e.get("rule") not in test.expected], call.when
        )
        if call.when == "call":
            occurred = {e.get("rule") for e in test.events}
            missing = sorted(test.expected - occurred)
            if missing:
                noun = "violation" if len(missing) == 1 else "violations"
                problems.append(
                    f"cgguard: expected {', '.join(missing)} {noun} did not occur "
                    "(@pytest.mark.cgguard_expect)"
                )
        if problems:
            text = "\n\n".join(problems)
            if report.passed:
                report.outcome = "failed"
                report.longrepr = text
            else:
                # Already failing for its own reason: keep that, and say what cgguard saw too.
                report.sections.append(("cgguard", text))


def _describe_unexpected(events: list[Event], when: str) -> list[str]:
    """The report of violations nobody expected, one block per distinct violation."""
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
    for event, count in distinct.values():
        repeated = f", {count} times" if count > 1 else ""
        blocks.append(
            f"{event.get('rule')} ({event.get('action')}{repeated}): {event.get('message')}\n"
            + _stacks(event)
        )
    blocks.append(_HINT)
    return ["\n\n".join(blocks)]


def _stacks(event: Event) -> str:
    """The event's stacks as the console log shows them."""
    from cgguard._log import format_stacks

    return format_stacks(event)


def _stacks_start_at_the_test() -> contextlib.AbstractContextManager[None]:
    """Every event's stacks start at the test function or fixture pytest called.

    In the events themselves, not only in this plugin's report: the log, the JSON report and
    the cgguard_violations fixture then show the test's frames without pytest's and pluggy's
    thirty or so above them.
    """
    import _pytest
    import pluggy

    from cgguard._frames import started_by

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
    from cgguard._rules import NAMES

    return NAMES


def _unknown_rules(expected: frozenset[str]) -> list[str]:
    return sorted(expected - set(_rules()))


def _flag(config: pytest.Config, name: str) -> bool:
    """An option given on the command line, or set in the ini file."""
    return bool(config.getoption(name) or config.getini(name))


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

    if active_simulation() is not None:  # CGGUARD_SIMULATE_CUDA activation put one in place
        return
    try:
        cleanup.enter_context(simulated_cuda())
    except SimulationError as exc:
        raise pytest.UsageError(f"--cgguard-simulate-cuda: {exc}") from None
