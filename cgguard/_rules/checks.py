"""Which rules a capture attempt or a synchronize breaks: plain functions over plain values.

They decide from the records of the captures under way and what disables capture, and know
nothing of torch, so that every rule is testable without it. Which rules exist, and what their
reports say, is cgguard._rules.table's table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cgguard._rules.record import MODE, THREAD
from cgguard._rules.table import WHY_CAPTURED_EVENT, WHY_CAPTURING_STREAM

if TYPE_CHECKING:
    from collections.abc import Iterable

    from cgguard._rules.record import Disabler, Found, Record


def find_violations(
    disabled: Disabler | None, thread: object, mode: str, active: Iterable[Record]
) -> Found:
    """The rules a capture attempt on ``thread`` in ``mode`` breaks, each with its cause."""
    found: Found = []
    if disabled is not None:
        found.append(("capture_disabled", disabled))
    nested = concurrent = None
    for record in active:
        other, other_mode = record[THREAD], record[MODE]
        if other == thread:
            nested = nested or record
        elif "global" in (mode, other_mode):
            # CUDA's global mode: one thread's unsafe call invalidates another's capture.
            concurrent = concurrent or record
    if nested is not None:
        found.append(("nested_capture", nested))
    if concurrent is not None:
        found.append(("concurrent_capture", concurrent))
    return found


def find_sync_violation(
    thread: object,
    active: Iterable[Record],
    *,
    query: bool = False,
    on_capturing_stream: bool = False,
    captured_in: Record | None = None,
) -> Record | None:
    """The capture a synchronize (or a query) on ``thread`` would break, if any.

    CUDA's capture modes (cudaStreamCaptureMode): a thread's own capture prohibits its unsafe
    calls unless relaxed, and a global capture prohibits every thread's. An event last recorded
    into a capture (``captured_in``) fails its synchronize and query in every mode, on any
    thread. Every synchronize on the capturing thread is reported, relaxed included, since it
    cannot wait for the captured work; a query there only where CUDA fails it: unless relaxed,
    or of the capturing stream (``on_capturing_stream``). docs/cuda-behaviour.md says what is
    settled. The cause named first is the one CUDA's answer comes from.
    """
    records = list(active)
    own = next((r for r in records if r[THREAD] == thread), None)
    if own is not None and own[MODE] != "relaxed":
        return own
    if captured_in is not None:
        return captured_in
    if own is not None and (not query or on_capturing_stream):
        return own
    wide = next((r for r in records if r[THREAD] != thread and r[MODE] == "global"), None)
    if wide is None and on_capturing_stream:
        # The stream captures for another thread: which of its captures is not known, and
        # with one capture per thread at a time, the first is right but for nesting.
        return next((r for r in records if r[THREAD] != thread), None)
    return wide


def why_sync(
    cause: Record, thread: object, captured_in: Record | None, capturing_stream: bool
) -> str:
    """What a synchronize's message must name, beyond a call the thread may not make."""
    holder, mode = cause[THREAD], cause[MODE]
    if (holder == thread and mode != "relaxed") or (holder != thread and mode == "global"):
        return ""  # prohibited on this thread: CUDA refuses before it looks further
    if cause is captured_in:
        return WHY_CAPTURED_EVENT
    if capturing_stream:
        return WHY_CAPTURING_STREAM
    return ""
