"""cgguard._rules.checks: the rules a capture attempt or a synchronize breaks, from plain values."""

from __future__ import annotations

import pytest
from helpers import thread

from cgguard._rules.checks import find_sync_violation, find_violations
from cgguard._rules.record import Disabler, Record

CAPTURE_DISABLED, NESTED_CAPTURE, CONCURRENT_CAPTURE = (
    "capture_disabled",
    "nested_capture",
    "concurrent_capture",
)

# What capture_disabled is blamed on when cgguard's own flag was set by configuration.
DISABLED = Disabler(None, None)


def record(thread_id: int, key: int = 1, mode: str = "global") -> Record:
    """A capture under way on ``thread_id``, as the capture path keeps it."""
    return (key, thread(thread_id), "torch.cuda.graph", mode, (), None)


def test_nothing_broken_when_enabled_and_idle() -> None:
    """Capture enabled and nothing active: no rule is broken."""
    assert find_violations(None, thread(7), "global", []) == []


def test_disabled_breaks_capture_disabled() -> None:
    """Capture disabled: the capture_disabled rule, with no record behind it."""
    assert find_violations(DISABLED, thread(7), "global", []) == [(CAPTURE_DISABLED, DISABLED)]


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_active_capture_on_same_thread_is_nested(mode: str) -> None:
    """A capture active on the same thread: nested_capture naming it, whatever either's mode."""
    mine = record(7, 2, mode=mode)
    others = record(8, 1, mode="thread_local")
    assert find_violations(None, thread(7), mode, [mine]) == [(NESTED_CAPTURE, mine)]
    found = find_violations(None, thread(7), "thread_local", [others, mine])
    assert found == [(NESTED_CAPTURE, mine)]


@pytest.mark.parametrize(
    ("mode", "other_modes"),
    [
        ("thread_local", ("thread_local", "thread_local")),
        ("thread_local", ("relaxed", "thread_local")),
        ("relaxed", ("relaxed", "relaxed")),
    ],
)
def test_active_capture_on_other_thread_is_legal(mode: str, other_modes: tuple[str, str]) -> None:
    """Captures active only on other threads, none of them or this one global: no rule broken."""
    active = [record(8, mode=other_modes[0]), record(9, 2, mode=other_modes[1])]
    assert find_violations(None, thread(7), mode, active) == []


@pytest.mark.parametrize(
    ("mode", "other_mode"),
    [
        ("global", "global"),
        ("global", "thread_local"),
        ("global", "relaxed"),
        ("thread_local", "global"),
        ("relaxed", "global"),
    ],
)
def test_other_threads_capture_with_global_is_concurrent(mode: str, other_mode: str) -> None:
    """Another thread capturing, either of the two in global mode: concurrent_capture, naming it."""
    other = record(8, mode=other_mode)
    assert find_violations(None, thread(7), mode, [other]) == [(CONCURRENT_CAPTURE, other)]


def test_concurrent_names_the_first_conflicting_capture() -> None:
    """Several other threads capturing: the first capture that conflicts is the one named."""
    quiet = record(8, 1, mode="thread_local")
    first, second = record(9, 2, mode="global"), record(10, 3, mode="global")
    assert find_violations(None, thread(7), "thread_local", [quiet, first, second]) == [
        (CONCURRENT_CAPTURE, first)
    ]


def test_both_rules_reported_in_order() -> None:
    """Disabled and nested at once: both, the process-wide rule first."""
    mine = record(7)
    assert find_violations(DISABLED, thread(7), "global", [mine]) == [
        (CAPTURE_DISABLED, DISABLED),
        (NESTED_CAPTURE, mine),
    ]


def test_all_three_rules_reported_in_order() -> None:
    """Disabled, nested and concurrent at once: in that order, each with its own cause."""
    mine, other = record(7, 1), record(8, 2)
    assert find_violations(DISABLED, thread(7), "global", [other, mine]) == [
        (CAPTURE_DISABLED, DISABLED),
        (NESTED_CAPTURE, mine),
        (CONCURRENT_CAPTURE, other),
    ]


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_sync_on_a_capturing_thread_names_its_capture(mode: str) -> None:
    """A synchronize on a thread with an active capture breaks the rule, naming that capture."""
    mine = record(7, 2, mode=mode)
    assert find_sync_violation(thread(7), [record(8, 1), mine]) is mine


@pytest.mark.parametrize("query", [False, True])
def test_sync_on_a_thread_not_capturing_is_legal_unless_another_captures_globally(
    query: bool,
) -> None:
    """Another thread's thread_local or relaxed capture leaves this thread's calls alone; a
    global one prohibits them (cudaStreamCaptureModeGlobal)."""
    local, relaxed = record(8, 1, mode="thread_local"), record(9, 2, mode="relaxed")
    assert find_sync_violation(thread(7), [local, relaxed], query=query) is None
    wide = record(10, 3, mode="global")
    assert find_sync_violation(thread(7), [local, wide, relaxed], query=query) is wide


def test_own_capture_comes_before_another_threads_global_one() -> None:
    """The cause named is this thread's capture where it has one."""
    wide, mine = record(8, 1, mode="global"), record(7, 2, mode="thread_local")
    assert find_sync_violation(thread(7), [wide, mine]) is mine


@pytest.mark.parametrize("query", [False, True])
def test_an_event_recorded_in_a_capture_is_its_cause_on_any_thread(query: bool) -> None:
    """cudaErrorCapturedEvent holds in every mode; a prohibited thread's own capture comes
    first, since CUDA refuses its unsafe call before looking at the event."""
    local = record(8, 1, mode="thread_local")
    assert find_sync_violation(thread(7), [local], query=query, captured_in=local) is local
    relaxed = record(7, 2, mode="relaxed")
    assert find_sync_violation(thread(7), [relaxed, local], query=query, captured_in=local) is local
    mine = record(7, 3, mode="global")
    assert find_sync_violation(thread(7), [local, mine], query=query, captured_in=local) is mine


def test_a_query_during_a_relaxed_capture_is_legal_unless_of_its_stream() -> None:
    """Relaxed mode lets a query through, but not one of the capturing stream itself."""
    mine = record(7, 1, mode="relaxed")
    assert find_sync_violation(thread(7), [mine], query=True) is None
    assert find_sync_violation(thread(7), [mine], query=True, on_capturing_stream=True) is mine
    assert find_sync_violation(thread(7), [mine]) is mine  # a synchronize is reported
