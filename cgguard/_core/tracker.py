"""The capture path: what runs when a capture begins, when it ends, and when a synchronize runs.

A ``Tracker`` keeps the captures it has seen begin and not end, and carries the hooks that
cgguard._core.patches puts on torch's entry points. It asks torch only through the probes it is
built with, and hands every broken rule to the installation's reporter
(cgguard._reporting.reporter), read once per violation, so a reconfiguration is seen whole.
Each hook does the least work that keeps the record of active captures true; the rules
themselves are cgguard._rules.checks's.

Interrupts: Python may raise between any two bytecodes (a KeyboardInterrupt, a timeout's
SIGALRM), so the bookkeeping cannot be made atomic with torch's C calls. Instead no interrupt
may lead to a wrong later verdict: a capture is recorded before torch begins it and forgotten
again only if torch did not; a record whose capture ended without cgguard seeing it (an
interrupt right after torch's capture_end, or a subclass's capture_end that skips super()) is
found out by asking whether its stream still captures, on the slow path only: when the thread
that holds it begins another capture or synchronizes.
"""

from __future__ import annotations

import functools
import sys
from time import perf_counter
from typing import TYPE_CHECKING, Any

from cgguard._core.book import CaptureBook
from cgguard._core.fanout import close
from cgguard._core.watcher import forget_graph
from cgguard._errors import hidden_by_pytest
from cgguard._gate.flags import disabled_by
from cgguard._rules.checks import find_violations
from cgguard._rules.record import (
    API,
    API_CAPTURE_BEGIN,
    API_GRAPH,
    BEGAN_AT,
    ENDED,
    FAILED,
    MODE,
    THREAD,
    Disabler,
)
from cgguard._support.frames import ENTERS_WITH, SUSPENDS, snapshot, snapshot_from
from cgguard._support.threads import marks as _marks
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from cgguard._core.fanout import Tokens, Told
    from cgguard._core.probes import Probes
    from cgguard._core.watcher import GraphNotes, Watcher
    from cgguard._errors import CaptureViolation
    from cgguard._gate.flags import CaptureFlag, FlagSource, Windows
    from cgguard._reporting.reporter import Reporter
    from cgguard._rules.record import Found, Record
    from cgguard._support.frames import LiveStack, Snapshot


# The traceback of a violation ends at the user's line (cgguard._errors.hidden_by_pytest).
__tracebackhide__ = hidden_by_pytest


class Tracker:
    """The hooks on torch that keep one installation's book of captures under way
    (cgguard._core.book), and the checks of each capture attempt."""

    def __init__(
        self,
        probes: Probes,
        reporter: Reporter,
        *,
        flag: CaptureFlag,
        follows: list[FlagSource | Windows],
        notes: GraphNotes | None = None,
    ) -> None:
        self.probes = probes
        # Replaced whole by install(), read once per violation.
        self.reporter = reporter
        # The process's gate's (cgguard._gate.gate): capture is disabled whether or not
        # cgguard is installed.
        self.flag = flag
        self.follows = follows
        # Set by uninstall(): hooks a caller still holds a reference to let everything through.
        self.retired = False
        self.book = book = CaptureBook(notes)
        # The book's parts, one attribute away: the hooks read them at every capture.
        self.active, self.entering = book.active, book.entering
        self.events, self.fanout = book.events, book.fanout

    def set_watchers(self, watchers: tuple[Watcher, ...]) -> None:
        """Follow each capture begun from now on with ``watchers``, told in that order."""
        self.fanout.set(watchers)

    # The hooks: plain functions, not wrapt wrappers, as every hook on the capture path is:
    # wrapt's binding and call protocol cost about four Python calls each, twice per capture.
    # Put on the class, a function binds as the method it replaces, so it covers subclasses as
    # a wrapt wrapper would; torch.accelerator's are the same, made with their own ``api``
    # (cgguard._core.patches). Each holds the tracker's parts it reads, the very objects.

    def make_graph_enter(self, original: Any, api: str = API_GRAPH) -> Any:
        """torch.cuda.graph.__enter__, or torch.accelerator.Graph's: its capture checked before
        torch's own __enter__ runs, which synchronizes, empties the cache and switches the
        current stream before capture_begin: a refusal raised after that would leave the thread
        on the capture stream for good, since __exit__ never runs."""
        tracker, entering, flag, follows = self, self.entering, self.flag, self.follows
        accelerator = api is not API_GRAPH

        # __enter__ takes no argument (the context manager protocol): none to pass through.
        @functools.wraps(original)
        def enter(instance: Any) -> Any:
            if accelerator:
                # The graph is the instance, and it captures on the current stream.
                mode = _accelerator_mode(instance)
                graph = id(instance)
                stream = tracker.probes.stream()
            else:
                mode = instance.capture_error_mode
                graph = id(instance.cuda_graph)
                # torch.cuda.graph captures on its own stream, set when it was made.
                stream = getattr(instance, "capture_stream", None)
            # Where the capture began (cgguard._support.frames.with_stack, inline: this runs at
            # every capture): a frame entering a ``with`` runs for the whole block, and is kept.
            caller = sys._getframe(1)  # the caller of __enter__
            code, lasti = caller.f_code, caller.f_lasti
            if code.co_code[lasti] in ENTERS_WITH and not code.co_flags & SUSPENDS:
                stack: Snapshot | LiveStack = (caller, lasti)
            else:
                stack = snapshot_from(caller)
            if tracker.active or follows or not flag.enabled:
                checked = tracker.check(api, graph, mode, stack, stream)
            else:
                # check()'s first case, without the call: nothing capturing, nothing followed,
                # and capture enabled, as at nearly every capture.
                checked = ((graph, _marks.ref, api, mode, stack, stream), ())
            # For the capture_begin that __enter__ makes (cgguard._core.book.Entering); one of
            # the thread's already entering, if any, comes back once this one is done.
            outer = entering.capture
            entering.capture = (graph, checked)
            try:
                return original(instance)
            finally:
                entering.capture = outer

        return enter

    def make_capture_begin(self, original: Any, api: str = API_CAPTURE_BEGIN) -> Any:
        """CUDAGraph.capture_begin, or torch.accelerator.Graph's (whose mode is the graph's):
        the capture recorded and its watchers told, then torch's own run."""
        tracker, active, entering, fanout = self, self.active, self.entering, self.fanout
        flag, follows = self.flag, self.follows
        raw_mode = _error_mode if api is API_CAPTURE_BEGIN else None

        @functools.wraps(original)
        def begin(instance: Any, *args: Any, **kwargs: Any) -> Any:
            graph = id(instance)
            held = entering.capture
            if held is None or held[0] != graph:
                # Walked now: a raw capture_begin is often made by a helper that returns at
                # once, and its callers move on while the capture stays active. It captures on
                # the current stream. Its mode is read here alone: a torch.cuda.graph's was
                # read as __enter__ began.
                mode = raw_mode(args, kwargs) if raw_mode else _accelerator_mode(instance)
                stack, stream = snapshot(1), tracker.probes.stream()
                if active or follows or not flag.enabled:
                    record = tracker.check(api, graph, mode, stack, stream)[0]
                else:  # check()'s first case, without the call, as __enter__'s hook does
                    record = (graph, _marks.ref, api, mode, stack, stream)
            else:
                # The capture_begin of a torch.cuda.graph, checked when __enter__ began; a
                # capture another thread began while torch prepared this one was not.
                entering.capture = None
                record, seen = held[1]
                if active:
                    tracker.recheck_concurrent(record, seen)
            # A capture into this graph already under way, if any: put back if this one fails.
            previous = active.get(graph) if active else None
            if fanout.forgets:
                forget_graph(instance)  # what a watcher kept for this graph's earlier capture
            # The first watcher told inline, not through the fanout: this runs at every capture
            # the census counts.
            led: Told | None = None
            lead = fanout.lead
            if lead is not None:
                try:
                    led = (lead, lead.opening(instance, record, args, kwargs))
                except Exception as exc:
                    warn_once("watch:open", f"internal error while watching a capture: {exc!r}")
            tokens = fanout.open_rest(instance, record, args, kwargs) if fanout.rest else None
            try:
                # Recorded first: an interrupt right after torch began the capture must not
                # leave it unknown, and a later nested capture unrefused.
                active[graph] = record
                result = original(instance, *args, **kwargs)
            except BaseException as exc:
                tracker.begin_failed(graph, record, previous, led=led, tokens=tokens, exc=exc)
                raise
            if led is not None:
                fanout.led[graph] = led
            if tokens:
                fanout.tokens[graph] = tokens
            return result

        return begin

    def begin_failed(
        self,
        graph: int,
        record: Record,
        previous: Record | None,
        *,
        led: Told | None,
        tokens: Tokens | None,
        exc: BaseException,
    ) -> None:
        """torch's capture_begin raised ``exc``: forget ``record`` unless the capture began
        all the same, putting back the capture into the same graph it replaced, if any."""
        active = self.active
        if active.get(graph) is record and not self.book.began_here(record, previous, self.probes):
            if previous is None:
                active.pop(graph, None)
            else:
                active[graph] = previous
            if led is not None:
                close((led,), FAILED, exc)
            if tokens:
                close(tokens, FAILED, exc)
            return
        # It began: torch raised only afterwards.
        self.fanout.keep(graph, led, tokens)

    def make_capture_end(self, original: Any) -> Any:
        """CUDAGraph.capture_end, forgetting the capture once CUDA has ended it, and telling its
        watchers."""
        active, tracker, events, fanout = self.active, self, self.events, self.fanout

        @functools.wraps(original)
        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = original(self, *args, **kwargs)
            except BaseException as exc:
                if not tracker.probes.still_capturing(exc):
                    events.forget(id(self), active.pop(id(self), None))
                    if fanout.led or fanout.tokens:
                        fanout.closed(id(self), FAILED, exc)
                raise
            key = id(self)
            # An interrupt here leaves a record whose capture has ended: found stale later.
            ended = active.pop(key, None)
            if events.of:  # no event was recorded into any capture: nothing to forget
                events.forget(key, ended)
            # The first watcher's token, told as fanout.close would, inline: this runs at the
            # end of every capture the census counts.
            led = fanout.led
            if led:  # nothing watched: nothing to tell
                told = led.pop(key, None)
                if told is not None:
                    try:
                        token = told[1]
                        if type(token) is list:
                            token[0] += perf_counter()
                        else:
                            told[0].closed(token, ENDED, None)
                    except Exception as exc:
                        warn_once(
                            "watch:closed", f"internal error while watching a capture: {exc!r}"
                        )
            if fanout.tokens:
                tokens = fanout.tokens.pop(key, None)
                if tokens:
                    close(tokens, ENDED, None)
            return result

        return capture_end

    # The slow path: something is capturing, capture is disabled, or a flag is followed.

    def check(
        self, api: str, key: int, mode: str, stack: Snapshot | LiveStack, stream: Any
    ) -> tuple[Record, tuple[int, ...]]:
        """Check a capture attempt; report, and raise if an action says raise. Returns its
        record, for the caller to make active once the capture has begun, and the keys of the
        active captures it was checked against."""
        record = (key, _marks.ref, api, mode, stack, stream)  # _marks.ref: this_thread()
        # The common case costs three reads: nothing capturing, capture enabled, no followed flag.
        if not self.active and self.flag.enabled:
            follows = self.follows
            if not follows:
                return record, ()
            # With no capture under way there is nothing to sweep: a followed flag or an open
            # window that allows costs its own read alone.
            for source in follows:
                if not source.enabled(stack):
                    break
            else:
                return record, ()
        if self.retired:
            return record, ()
        self.sweep()
        try:
            # Keys first: a capture begun between the two reads is checked now and, not being
            # among the keys, once more at capture_begin; none is missed.
            seen = tuple(self.active)
            disabled = disabled_by(self.flag, self.follows, stack)
            found = find_violations(disabled, record[THREAD], mode, list(self.active.values()))
            captures = [c for _, c in found if c is not None and not isinstance(c, Disabler)]
            if captures and self.book.stale(captures, self.probes):
                found = find_violations(disabled, record[THREAD], mode, list(self.active.values()))
        except Exception as exc:
            warn_once(
                "guard:begin", f"internal error while checking a capture, not checked: {exc!r}"
            )
            return record, ()
        if found:
            # Read once: a reconfiguration swaps the reporter whole.
            error = self.reporter.violated(found, api, stack, refuse=True)
            if error is not None:
                self.fanout.refused(record)
                raise error
        return record, seen

    def recheck_concurrent(self, begun: Record, seen: tuple[int, ...]) -> None:
        """Report a capture another thread began while torch.cuda.graph prepared ``begun``.

        torch has switched the thread's stream by then, so this reports and never refuses.
        """
        if self.retired:
            return
        self.sweep()
        try:
            since = [r for k, r in list(self.active.items()) if k not in seen]
            found = [
                (rule, cause)
                for rule, cause in find_violations(None, begun[THREAD], begun[MODE], since)
                if rule == "concurrent_capture"
            ]
        except Exception as exc:
            warn_once(
                "guard:recheck", f"internal error while checking a capture, not checked: {exc!r}"
            )
            return
        if found:
            self.violated(found, begun[API], begun[BEGAN_AT], refuse=False)

    def violated(
        self, found: Found, api: str, stack: Snapshot | LiveStack, *, refuse: bool, why: str = ""
    ) -> CaptureViolation | None:
        """Hand ``found`` to the reporter in effect now: the error to raise, if any."""
        # Read once: a reconfiguration swaps the reporter whole.
        reporter = self.reporter
        return reporter.violated(found, api, stack, refuse=refuse, why=why)

    def sweep(self) -> None:
        """Forget, and report once, the captures of threads that have ended."""
        if self.active:  # a storm of refusals with nothing capturing: nothing to sweep
            for record in self.book.abandoned():
                self.violated(
                    [("abandoned_capture", record)], record[API], record[BEGAN_AT], refuse=False
                )


def _accelerator_mode(graph: Any) -> str:
    """The capture_error_mode a torch.accelerator.Graph captures in.

    Its "default" is the backend's default; on CUDA that is cudaStreamCaptureModeGlobal, what
    torch.cuda.CUDAGraph.capture_begin defaults to (docs/cuda-behaviour.md).
    """
    mode = str(getattr(graph, "capture_error_mode", "default"))
    return "global" if mode == "default" else mode


def _error_mode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    # capture_begin(pool=None, capture_error_mode="global", ...) in every supported release.
    if "capture_error_mode" in kwargs:
        return str(kwargs["capture_error_mode"])
    return str(args[1]) if len(args) > 1 else "global"
