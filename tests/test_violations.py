"""cgguard._violations: a reporter retired by a reconfiguration hands violations to its
successor, and closes its log only once no violation is in flight through it."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import pytest

import cgguard
from cgguard._flags import Disabler
from cgguard._ledger import Run
from cgguard._log import EventLog
from cgguard._violations import Reporter

if TYPE_CHECKING:
    from pathlib import Path

DISABLED = [("capture_disabled", Disabler(None, None))]


def stack() -> tuple[Any, ...]:
    """A one-frame stack: this file's function, not started."""
    return (stack.__code__, -1)


def open_files() -> list[str]:
    """What this process's descriptors lead to."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the descriptor listdir itself used, closed since
    return found


def reporter(run: Run, seen: list[Any], log: EventLog | None = None) -> Reporter:
    return Reporter(cgguard.Config(mode="log"), run, listeners=[seen.append], log=log)


def test_a_violation_reaching_a_retired_reporter_is_its_successors() -> None:
    """After the swap, the old reporter counts nothing itself: its successor does, once."""
    run, old_seen, new_seen = Run(), [], []
    old, new = reporter(run, old_seen), reporter(run, new_seen)
    old.retire(new)
    old.violated(DISABLED, "torch.cuda.graph", stack(), refuse=True)
    assert ([e["rule"] for e in new_seen], old_seen, run.ledger.totals()) == (
        ["capture_disabled"],
        [],
        {"capture_disabled": 1},
    )


def test_a_reporter_retired_without_a_successor_drops_what_reaches_it() -> None:
    """An uninstalled reporter reports and counts nothing more."""
    run, seen = Run(), []
    retired = reporter(run, seen)
    retired.close()
    assert retired.violated(DISABLED, "torch.cuda.graph", stack(), refuse=True) is None
    assert (seen, run.ledger.totals()) == ([], {})


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_the_log_closes_once_the_violation_in_flight_has_left(tmp_path: Path) -> None:
    """A reconfiguration while another thread reports leaves the log open until that report is
    written whole; then it is closed, and nothing is written to stderr instead."""
    path = tmp_path / "events.jsonl"
    log = EventLog("json", str(path))
    inside, release = threading.Event(), threading.Event()

    def slow_listener(event: object) -> None:
        inside.set()
        assert release.wait(timeout=20)

    run = Run()
    old = Reporter(cgguard.Config(mode="log"), run, listeners=[slow_listener], log=log)
    reporting = threading.Thread(
        target=old.violated, args=(DISABLED, "torch.cuda.graph", stack()), kwargs={"refuse": True}
    )
    reporting.start()
    assert inside.wait(timeout=20)
    retiring = threading.Thread(target=old.retire, args=(reporter(run, []),))
    retiring.start()
    retiring.join(timeout=0.2)
    still_waiting = retiring.is_alive()  # retire() waits for the report in flight
    release.set()
    reporting.join(timeout=20)
    retiring.join(timeout=20)
    assert (still_waiting, len(path.read_text().splitlines()), str(path) in open_files()) == (
        True,
        1,
        False,
    )
