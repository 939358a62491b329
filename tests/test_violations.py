"""cgguard._reporting.reporter: a reporter retired by a reconfiguration hands violations to its
successor, and closes its log only once no violation is in flight through it."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import pytest

import cgguard
from cgguard import _process
from cgguard._data.ledger import Run
from cgguard._reporting.log import EventLog
from cgguard._reporting.reporter import Reporter
from cgguard._rules.record import Disabler

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


def _report_totals(path: Path) -> dict[str, int]:
    import json

    totals: dict[str, int] = json.loads(path.read_text())["totals"]
    return totals


def test_an_older_configurations_final_report_never_replaces_a_newer_ones(
    tmp_path: Path,
) -> None:
    """A listener that switches to another report and back to the first, inside a violation:
    once the violation leaves, the file holds the latest configuration, not the first."""
    from helpers import tracker

    def config(n: int, report: str) -> cgguard.Config:
        log = str(tmp_path / f"log{n}")
        return cgguard.Config(mode="log", log_file=log, report=str(tmp_path / report))

    def listener(event: object) -> None:
        if not switched:
            switched.append(True)
            cgguard.install(config(2, "y.json"))
            cgguard.install(config(3, "x.json"))

    switched: list[bool] = []
    cgguard.install(config(1, "x.json"))
    _process.PROCESS.listeners.append(listener)
    cgguard.set_capture_enabled(False)
    tracker().check("torch.cuda.graph", 1, "global", stack(), None)
    import json

    written = json.loads((tmp_path / "x.json").read_text())["config"]["log_file"]
    assert (switched, written) == ([True], str(tmp_path / "log3"))


def test_counts_made_while_switching_to_the_same_report_reach_it(tmp_path: Path) -> None:
    """A violation breaking two rules, whose first event's listener switches configuration
    with the same report file: both counts reach the file, through the new configuration."""
    import time

    from helpers import tracker

    from cgguard._support.threads import this_thread

    report = tmp_path / "r.json"

    def config(n: int) -> cgguard.Config:
        return cgguard.Config(mode="log", log_file=str(tmp_path / f"log{n}"), report=str(report))

    def listener(event: object) -> None:
        if not switched:
            switched.append(True)
            cgguard.install(config(2))

    switched: list[bool] = []
    cgguard.install(config(1))
    tracker().active[7] = (7, this_thread(), "CUDAGraph.capture_begin", "global", stack(), None)
    _process.PROCESS.listeners.append(listener)
    cgguard.set_capture_enabled(False)
    tracker().check("torch.cuda.graph", 1, "global", stack(), None)  # disabled and nested
    expected = {"capture_disabled": 1, "nested_capture": 1}
    deadline = time.monotonic() + 10  # counts reach the disk within half a second
    while _report_totals(report) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (cgguard.status().violations, _report_totals(report)) == (expected, expected)
    tracker().active.clear()


def test_switching_configuration_does_not_wait_on_a_listener_that_asks_for_status(
    tmp_path: Path,
) -> None:
    """install() retires the old configuration without holding the lock a listener's status()
    needs: neither waits for the other to time out."""
    import time

    from helpers import tracker

    inside, waited = threading.Event(), []

    def listener(event: object) -> None:
        if threading.current_thread().name == "reporting":
            inside.set()
            time.sleep(0.3)  # the main thread switches configuration meanwhile
            start = time.monotonic()
            cgguard.status()
            waited.append(time.monotonic() - start)

    cgguard.install(cgguard.Config(mode="log", log_file=str(tmp_path / "a")))
    _process.PROCESS.listeners.append(listener)
    cgguard.set_capture_enabled(False)
    thread = threading.Thread(
        target=tracker().check,
        args=("torch.cuda.graph", 1, "global", stack(), None),
        name="reporting",
    )
    thread.start()
    assert inside.wait(timeout=20)
    start = time.monotonic()
    cgguard.install(cgguard.Config(mode="log", log_file=str(tmp_path / "b")))
    took = time.monotonic() - start
    thread.join(timeout=20)
    # The old configuration's close waits up to 5 s for a violation in flight; a deadlock
    # between the two would make both wait that long.
    assert (took < 3, len(waited), waited[0] < 3) == (True, 1, True)
