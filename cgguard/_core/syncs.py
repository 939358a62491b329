"""Synchronizes and queries while something captures: the hooks that check them, before CUDA
sees them, against the captures a Tracker keeps, and the events recorded into those captures."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from cgguard._errors import hidden_by_pytest
from cgguard._rules.checks import find_sync_violation, why_sync
from cgguard._rules.record import (
    API_EVENT_ELAPSED_TIME,
    API_SYNCHRONIZE,
    EVENT_CALLS,
    QUERIES,
    STREAM_CALLS,
    THREAD,
)
from cgguard._support.frames import snapshot
from cgguard._support.threads import this_thread
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._core.tracker import Tracker
    from cgguard._rules.record import Found, Record


# The traceback of a violation ends at the user's line (cgguard._errors.hidden_by_pytest).
__tracebackhide__ = hidden_by_pytest


class SyncChecks:
    """The hooks on torch's synchronizes, queries and Event.record, for ``tracker``'s captures.

    Each costs one truth test while nothing captures.
    """

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker

    def make_event_record(self, original: Any) -> Any:
        """Event.record, noting an event recorded into a capture of the recording thread.

        A plain function, as capture_end is (cgguard._core.tracker): Event.record runs often
        outside any capture, and then costs one truth test here.
        """
        active = self.tracker.active

        @functools.wraps(original)
        def record(event: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(event, *args, **kwargs)
            if active:  # nothing capturing, nothing to note
                self.note_record(event, args, kwargs)
            return result

        return record

    def checks(self, api: str) -> Callable[[Any, Any, Any, Any], Any]:
        """A wrapt wrapper for a synchronize or query method: checked while anything captures."""
        active = self.tracker.active

        def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            if active:  # nothing capturing, nothing to check
                self.check(api, instance, args, kwargs)
            return wrapped(*args, **kwargs)

        return wrapper

    def make_device_sync(self, original: Any, api: str = API_SYNCHRONIZE) -> Any:
        """torch._C._cuda_synchronize (or another device-wide synchronize), checked.

        A plain function, not a wrapt wrapper: torch.cuda.graph.__enter__ calls this on every
        capture, a C function has no binding or signature for wrapt to preserve, and wrapt's
        call protocol costs more here than the rest of the capture path together.
        """
        active = self.tracker.active
        if api is API_SYNCHRONIZE:
            # torch._C._cuda_synchronize takes no argument (torch.cuda.synchronize calls it with
            # none, every release): neither does its hook, which spares a packing of arguments
            # at every capture.
            @functools.wraps(original)
            def synchronize() -> Any:
                if active:  # nothing capturing, nothing to check
                    self.check(api)
                return original()

            return synchronize

        @functools.wraps(original)
        def synchronize_with(*args: Any, **kwargs: Any) -> Any:
            if active:
                self.check(api)
            return original(*args, **kwargs)

        return synchronize_with

    def note_record(self, event: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Remember whether ``event`` was just recorded into one of this thread's captures.

        Known only for the current stream (torch's default for record()): whether another
        stream captures is not known without asking CUDA, so such a record is forgotten.
        """
        tracker = self.tracker
        probes = tracker.probes
        try:
            stream = args[0] if args else kwargs.get("stream")
            thread = this_thread()
            into = None
            if (stream is None or probes.is_current_stream(stream)) and probes.is_capturing():
                into = next(
                    (r for r in reversed(list(tracker.active.values())) if r[THREAD] is thread),
                    None,
                )
            tracker.events.note(event, into)
        except Exception as exc:
            warn_once("guard:record", f"internal error while noting an event's record: {exc!r}")

    def check(
        self,
        api: str,
        instance: Any = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Check a synchronize or query made by the caller's caller (a method of ``instance``,
        a stream or an event, called with ``args``); report, maybe raise, before CUDA."""
        tracker = self.tracker
        if tracker.retired:
            return
        tracker.sweep()
        thread = this_thread()
        try:
            captured_in = None
            capturing_stream = False
            if api in EVENT_CALLS:
                events = [instance]
                if api == API_EVENT_ELAPSED_TIME:
                    events.append(args[0] if args else (kwargs or {}).get("end_event"))
                if not all(getattr(event, "cuda_event", 1) for event in events):
                    # torch creates an event at its first record(); before that, its synchronize
                    # and query make no CUDA call (CUDAEvent::synchronize, ::query), and
                    # elapsed_time refuses in torch before CUDA.
                    return
                captured_in = tracker.events.captured_into(events, tracker.active)
            elif api in STREAM_CALLS:
                capturing_stream = tracker.probes.stream_captures(instance)
            cause, captured_in = self._cause(thread, api in QUERIES, capturing_stream, captured_in)
            if cause is None:
                return
            why = why_sync(cause, thread, captured_in, capturing_stream)
            if tracker.entering.capture is not None:
                # torch.cuda.graph.__enter__'s own synchronize: part of the capture attempt,
                # reported already under the rule it breaks, unless that rule is off.
                covered = "nested_capture" if cause[THREAD] == thread else "concurrent_capture"
                if tracker.reporter.config.action(covered) != "off":
                    return
            stack = snapshot(2)  # from the caller of the hook that called this
        except Exception as exc:
            warn_once(
                "guard:sync", f"internal error while checking a synchronize, not checked: {exc!r}"
            )
            return
        found: Found = [("sync_during_capture", cause)]
        error = tracker.violated(found, api, stack, refuse=True, why=why)
        if error is not None:
            raise error

    def _cause(
        self, thread: object, query: bool, capturing_stream: bool, captured_in: Record | None
    ) -> tuple[Record | None, Record | None]:
        """The capture a synchronize breaks, live, and the capture its event was recorded into
        if that is still live: a stale cause is dropped and the next one looked for."""
        tracker = self.tracker
        cause = None
        for _ in range(len(tracker.active) + 1):  # each stale cause found drops one record
            cause = find_sync_violation(
                thread,
                list(tracker.active.values()),
                query=query,
                on_capturing_stream=capturing_stream,
                captured_in=captured_in,
            )
            if cause is None or not tracker.book.stale([cause], tracker.probes):
                break
            if cause is captured_in:
                captured_in = None
        return cause, captured_in
