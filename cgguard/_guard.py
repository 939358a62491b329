"""The rules: whether a capture may begin, and what happens when one may not.

Plain Python over plain values (the flag, the active captures, a thread id): no torch here, so
every rule is testable without it. cgguard._patches calls in at torch's entry points.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from cgguard import _state
from cgguard._errors import CaptureDisabledError, CaptureViolation, NestedCaptureError
from cgguard._frames import render, where
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Iterable

    from cgguard._frames import FrameInfo, Snapshot

API_GRAPH = "torch.cuda.graph"
API_CAPTURE_BEGIN = "CUDAGraph.capture_begin"

CAPTURE_DISABLED = "capture_disabled"
NESTED_CAPTURE = "nested_capture"

# vLLM's own words for the same rule, so that searches for its error find this one too.
DISABLED_SENTENCE = (
    "CUDA graph capturing detected at an inappropriate time. This operation is currently disabled."
)

_ERRORS: dict[str, type[CaptureViolation]] = {
    CAPTURE_DISABLED: CaptureDisabledError,
    NESTED_CAPTURE: NestedCaptureError,
}


class CaptureRecord:
    """A capture attempt that passed, or was let through: who began it, where, and how."""

    __slots__ = ("api", "key", "mode", "opening", "stack", "thread_id")

    def __init__(
        self,
        key: int,
        thread_id: int,
        api: str,
        mode: str,
        stack: Snapshot,
        *,
        opening: bool = False,
    ) -> None:
        self.key = key  # id() of the CUDAGraph that holds the capture
        self.thread_id = thread_id
        self.api = api
        self.mode = mode  # capture_error_mode: "global", "thread_local" or "relaxed"
        self.stack = stack
        # True from torch.cuda.graph.__enter__'s check until the capture_begin it makes, so
        # that one capture is not counted twice.
        self.opening = opening


def find_violations(
    enabled: bool, thread_id: int, active: Iterable[CaptureRecord]
) -> list[tuple[str, CaptureRecord | None]]:
    """The rules a capture attempt on ``thread_id`` breaks, each with the record behind it."""
    found: list[tuple[str, CaptureRecord | None]] = []
    if not enabled:
        found.append((CAPTURE_DISABLED, None))
    for record in active:
        if record.thread_id == thread_id:
            found.append((NESTED_CAPTURE, record))
            break
    return found


def check_begin(
    api: str, key: int, mode: str, stack: Snapshot, *, opening: bool = False
) -> CaptureRecord:
    """Check a capture attempt; report and possibly raise; else return its record.

    The caller adds the record to ``_state.active`` once the capture has begun.

    Raises a CaptureViolation when a rule is broken and the configuration says raise. Any
    other failure in here is cgguard's own: it is reported once and the capture goes on.
    """
    thread_id = threading.get_ident()
    record = CaptureRecord(key, thread_id, api, mode, stack, opening=opening)
    # The common case costs two reads: capture enabled and nothing else capturing.
    if _state.capture_enabled and not _state.active:
        return record
    try:
        found = find_violations(_state.capture_enabled, thread_id, list(_state.active.values()))
        error = _handle(found, record) if found else None
    except Exception as exc:
        warn_once("guard", f"internal error while checking a capture, not checked: {exc!r}")
        return record
    if error is not None:
        raise error
    return record


def _handle(
    found: list[tuple[str, CaptureRecord | None]], attempt: CaptureRecord
) -> CaptureViolation | None:
    """Report every violation; return the error to raise, if the configuration wants one."""
    config = _state.config
    raising = config is None or config.mode == "raise"
    stack = render(attempt.stack)
    error: CaptureViolation | None = None
    for rule, cause in found:
        event = _event(rule, attempt.api, stack, cause, "raised" if raising else "logged")
        _publish(event)
        if raising and error is None:
            error = _ERRORS[rule](str(event["message"]), event)
    return error


def _event(
    rule: str, api: str, stack: list[FrameInfo], cause: CaptureRecord | None, action: str
) -> dict[str, object]:
    """The violation as the event the README documents, keys in schema order."""
    now = time.time()
    thread = threading.current_thread()
    head = f"{api} at {where(stack)}"
    event: dict[str, object] = {
        "event": "cgguard.capture_violation",
        "level": "error" if action == "raised" else "warning",
        "rule": rule,
        "action": action,
        "api": api,
        "message": "",
        "thread": thread.name,
        "thread_id": thread.ident,
        "pid": os.getpid(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        + f".{int(now % 1 * 1_000_000):06d}Z",
        "stack": stack,
    }
    if rule == CAPTURE_DISABLED:
        origin = _state.capture_changed_at
        disabled = render(origin) if origin is not None else None
        event["disabled_stack"] = disabled
        reason = (
            f"capture was disabled at {where(disabled)}"
            if disabled is not None
            else "capture was disabled by cgguard's configuration at start"
        )
        event["message"] = f"{DISABLED_SENTENCE} {head} began a capture; {reason}."
    else:
        assert cause is not None  # noqa: S101 - nested_capture always comes with its outer record
        outer = render(cause.stack)
        event["outer_stack"] = outer
        event["message"] = (
            f"Nested CUDA graph capture is not supported: {head} began a capture while this "
            f"thread's capture begun at {where(outer)} via {cause.api} is still active."
        )
    return event


def _publish(event: dict[str, object]) -> None:
    for listener in list(_state.listeners):
        try:
            listener(event)
        except Exception as exc:
            warn_once("listener", f"a violation listener failed: {exc!r}")
    reporter = _state.reporter
    if reporter is not None:
        reporter.emit(event)
