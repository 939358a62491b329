"""The rules: whether a capture may begin, or a synchronize run, now; and what happens if not.

Plain Python over plain values (the flag, the active captures, a thread id): no torch here, so
every rule is testable without it. cgguard._patches calls in at torch's entry points.
"""

from __future__ import annotations

import os
import threading
import time
from threading import get_ident
from typing import TYPE_CHECKING, NamedTuple

from cgguard import _state
from cgguard._errors import (
    CaptureDisabledError,
    CaptureViolation,
    ConcurrentCaptureError,
    NestedCaptureError,
    SyncDuringCaptureError,
)
from cgguard._flag import is_capture_enabled
from cgguard._frames import LiveStack, innermost_visible, render, resolve, snapshot, where
from cgguard._ledger import worth_logging
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Iterable

    from cgguard._frames import FrameInfo, Snapshot
    from cgguard._ledger import Site

API_GRAPH = "torch.cuda.graph"
API_CAPTURE_BEGIN = "CUDAGraph.capture_begin"
API_SYNCHRONIZE = "torch.cuda.synchronize"
API_STREAM_SYNCHRONIZE = "Stream.synchronize"
API_EVENT_SYNCHRONIZE = "Event.synchronize"

CAPTURE_DISABLED = "capture_disabled"
NESTED_CAPTURE = "nested_capture"
CONCURRENT_CAPTURE = "concurrent_capture"
SYNC_DURING_CAPTURE = "sync_during_capture"

# vLLM's own words for the same rule, so that searches for its error find this one too.
DISABLED_SENTENCE = (
    "CUDA graph capturing detected at an inappropriate time. This operation is currently disabled."
)

_ERRORS: dict[str, type[CaptureViolation]] = {
    CAPTURE_DISABLED: CaptureDisabledError,
    NESTED_CAPTURE: NestedCaptureError,
    CONCURRENT_CAPTURE: ConcurrentCaptureError,
    SYNC_DURING_CAPTURE: SyncDuringCaptureError,
}

# Where each rule's cause goes in the event.
_CAUSE_KEYS = {
    CAPTURE_DISABLED: "disabled_stack",
    NESTED_CAPTURE: "outer_stack",
    CONCURRENT_CAPTURE: "other_stack",
    SYNC_DURING_CAPTURE: "capture_stack",
}

_RANK_VARIABLES = (("RANK", "rank"), ("LOCAL_RANK", "local_rank"), ("WORLD_SIZE", "world_size"))


class CaptureRecord(NamedTuple):
    """A capture attempt that passed, or was let through: who began it, where, and how."""

    key: int  # id() of the CUDAGraph that holds the capture
    thread_id: int
    api: str
    mode: str  # capture_error_mode: "global", "thread_local" or "relaxed"
    stack: Snapshot | LiveStack


# A capture as the capture path keeps it: a plain tuple of CaptureRecord's fields, since a
# NamedTuple's constructor costs several times a tuple display and most records are never read.
Record = tuple[int, int, str, str, "Snapshot | LiveStack"]


def active_records() -> list[CaptureRecord]:
    """The active captures, each readable by name."""
    return [CaptureRecord._make(record) for record in list(_state.active.values())]


def find_violations(
    enabled: bool, thread_id: int, mode: str, active: Iterable[CaptureRecord]
) -> list[tuple[str, CaptureRecord | None]]:
    """The rules a capture attempt on ``thread_id`` in ``mode`` breaks, each with its cause."""
    found: list[tuple[str, CaptureRecord | None]] = []
    if not enabled:
        found.append((CAPTURE_DISABLED, None))
    nested = concurrent = None
    for record in active:
        if record.thread_id == thread_id:
            nested = nested or record
        elif "global" in (mode, record.mode):
            # CUDA's global mode: one thread's unsafe call invalidates another's capture.
            concurrent = concurrent or record
    if nested is not None:
        found.append((NESTED_CAPTURE, nested))
    if concurrent is not None:
        found.append((CONCURRENT_CAPTURE, concurrent))
    return found


def find_sync_violation(thread_id: int, active: Iterable[CaptureRecord]) -> CaptureRecord | None:
    """The capture a synchronize on ``thread_id`` would break, if any."""
    for record in active:
        if record.thread_id == thread_id:
            return record
    return None


def check_begin(api: str, key: int, mode: str, stack: Snapshot | LiveStack) -> Record:
    """Check a capture attempt; report and possibly raise; else return its record.

    The caller adds the record to ``_state.active`` once the capture has begun. Raises a
    CaptureViolation when a rule is broken and its action is raise. Any other failure in here
    is cgguard's own: it is reported once and the capture goes on.
    """
    thread_id = get_ident()
    # The common case costs three reads: nothing capturing, capture enabled, no other flag.
    if not _state.active and _state.capture_enabled and not _state.flag_sources:
        return (key, thread_id, api, mode, stack)
    try:
        found = find_violations(is_capture_enabled(), thread_id, mode, active_records())
        if found:
            # Walked now, while the caller is where it tried: a report needs this stack exactly.
            stack = resolve(stack)
        error = _handle(found, api, stack) if found else None
    except Exception as exc:
        warn_once("guard", f"internal error while checking a capture, not checked: {exc!r}")
        return (key, thread_id, api, mode, stack)
    if error is not None:
        raise error
    return (key, thread_id, api, mode, stack)


def recheck_concurrent(begun: Record) -> None:
    """Report a capture another thread began while torch.cuda.graph prepared ``begun``.

    torch has switched the thread's stream by then, so this reports and never refuses.
    """
    try:
        record = CaptureRecord._make(begun)
        found = [
            (rule, cause)
            for rule, cause in find_violations(
                True, record.thread_id, record.mode, active_records()
            )
            if rule == CONCURRENT_CAPTURE
        ]
        if found:
            _handle(found, record.api, record.stack, refuse=False)
    except Exception as exc:
        warn_once("guard", f"internal error while checking a capture, not checked: {exc!r}")


def check_sync(api: str) -> None:
    """Check a synchronize call made by the caller's caller; report, maybe raise, before CUDA.

    The stack is taken only once a violation is found.
    """
    if not _state.active:
        return
    thread = get_ident()
    config = _state.config
    if (
        config is not None
        and config.action(NESTED_CAPTURE) != "off"
        and any(entering_thread == thread for entering_thread, _ in list(_state.entering))
    ):
        # torch.cuda.graph.__enter__'s own synchronize, inside this thread's capture: reported
        # already, as the nested capture it is part of.
        return
    try:
        cause = find_sync_violation(thread, active_records())
        if cause is None:
            return
        stack = snapshot(2)  # from the caller of the wrapper that called us
        error = _handle([(SYNC_DURING_CAPTURE, cause)], api, stack)
    except Exception as exc:
        warn_once("guard", f"internal error while checking a synchronize, not checked: {exc!r}")
        return
    if error is not None:
        raise error


def _handle(
    found: list[tuple[str, CaptureRecord | None]],
    api: str,
    stack: Snapshot | LiveStack,
    *,
    refuse: bool = True,
) -> CaptureViolation | None:
    """Count and report each violation; return the error to raise, if an action says raise.

    With ``refuse`` false, a raise action is reported as logged: it is too late to refuse.
    """
    config, ledger, reporter = _state.config, _state.ledger, _state.reporter
    if config is None or ledger is None:
        return None
    stack = resolve(stack)
    code, lasti = innermost_visible(stack)
    error: CaptureViolation | None = None
    for rule, cause in found:
        action = config.action(rule)
        if action == "off":
            continue
        raising = action == "raise" and refuse
        site, count = ledger.count(rule, code, lasti, api, "raised" if raising else "logged")
        event: dict[str, object] | None = None
        # Rendering is the expensive part: only for the first at a site, a raise, or listeners
        # that must see every violation in full.
        if count == 1 or raising or _state.listeners:
            action_taken = "raised" if raising else "logged"
            event = _event(rule, api, stack, cause, action=action_taken, count=count)
            if count == 1:
                site.first = event
                if _state.on_new_site is not None:
                    _state.on_new_site()
            _publish(event)
        if reporter is not None:
            if count == 1 and event is not None:
                reporter.emit(event)
            elif worth_logging(count):
                reporter.emit(_repeat_event(site, count, ledger.where(site)))
        if raising and error is None and event is not None:
            error = _ERRORS[rule](str(event["message"]), event)
    return error


def _common(rule: str, api: str, action: str, count: int) -> dict[str, object]:
    """The keys every violation event starts with, in schema order."""
    now = time.time()
    thread = threading.current_thread()
    event: dict[str, object] = {
        "event": "cgguard.capture_violation",
        "level": "error" if action == "raised" else "warning",
        "rule": rule,
        "action": action,
        "api": api,
        "message": "",
        "count": count,
        "thread": thread.name,
        "thread_id": thread.ident,
        "pid": os.getpid(),
    }
    event.update(ranks())
    event["timestamp"] = timestamp(now)
    return event


def ranks() -> dict[str, object]:
    """RANK, LOCAL_RANK and WORLD_SIZE where set: a distributed job's reports, told apart."""
    found: dict[str, object] = {}
    for variable, key in _RANK_VARIABLES:
        value = os.environ.get(variable)
        if value is not None:
            found[key] = int(value) if value.isdigit() else value
    return found


def timestamp(now: float) -> str:
    """ISO 8601 in UTC with microseconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def _event(
    rule: str,
    api: str,
    stack: Snapshot,
    cause: CaptureRecord | None,
    *,
    action: str,
    count: int,
) -> dict[str, object]:
    """The violation as the full event the README documents."""
    event = _common(rule, api, action, count)
    frames = render(stack)
    event["stack"] = frames
    head = f"{api} at {where(frames)}"
    if rule == CAPTURE_DISABLED:
        label, origin = _disabled_by()
        disabled = render(origin) if origin is not None else None
        event["disabled_stack"] = disabled
        if disabled is not None:
            reason = f"capture was disabled at {where(disabled)}"
        elif label is None:
            reason = "capture was disabled by cgguard's configuration at start"
        else:
            reason = f"capture was disabled by {label}"
        event["message"] = f"{DISABLED_SENTENCE} {head} began a capture; {reason}."
        return event
    assert cause is not None  # noqa: S101 - every other rule comes with its cause
    cause_frames = render(resolve(cause.stack))
    event[_CAUSE_KEYS[rule]] = cause_frames
    began = f"begun at {where(cause_frames)} via {cause.api}"
    if rule == NESTED_CAPTURE:
        event["message"] = (
            f"Nested CUDA graph capture is not supported: {head} began a capture while this "
            f"thread's capture {began} is still active."
        )
    elif rule == CONCURRENT_CAPTURE:
        event["other_thread_id"] = cause.thread_id
        event["message"] = (
            f"Concurrent CUDA graph capture: {head} began a capture while thread "
            f"{cause.thread_id} has a capture {began}, and one of them uses capture_error_mode "
            f"'global', in which one thread's unsafe call invalidates the other's capture."
        )
    elif cause.mode == "relaxed":
        event["message"] = (
            f"Synchronize during CUDA graph capture: {head} synchronizes while this thread's "
            f"capture {began} is active; in capture_error_mode 'relaxed' CUDA lets it through "
            f"unless it waits on the capturing stream itself, but it does not wait for the "
            f"captured work, which has not run."
        )
    else:
        event["message"] = (
            f"Synchronize during CUDA graph capture: {head} synchronizes while this thread's "
            f"capture {began} is active; CUDA fails it ('operation not permitted when stream is "
            f"capturing') and invalidates the capture."
        )
    return event


def _disabled_by() -> tuple[str | None, Snapshot | None]:
    """Which flag disables capture: (a label, or None for cgguard's own; where it was set)."""
    if not _state.capture_enabled:
        return None, _state.capture_changed_at
    for source in _state.flag_sources:
        if not source.enabled():
            return source.label, source.changed_at
    return None, None


def _repeat_event(site: Site, count: int, top: FrameInfo | None) -> dict[str, object]:
    """A brief report of a repeat: the count and the site, no stacks."""
    event = _common(site.rule, site.api, site.action, count)
    event["message"] = f"repeated {count} times at {where([top] if top else [])}"
    event["site"] = top
    return event


def _publish(event: dict[str, object]) -> None:
    for listener in list(_state.listeners):
        try:
            listener(event)
        except Exception as exc:
            warn_once("listener", f"a violation listener failed: {exc!r}")
