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

from typing import TYPE_CHECKING, Any

from cgguard._core.book import CaptureBook
from cgguard._core.fanout import close
from cgguard._errors import hidden_by_pytest
from cgguard._gate.flags import disabled_by
from cgguard._rules.checks import find_violations
from cgguard._rules.record import (
    API,
    API_CAPTURE_BEGIN,
    BEGAN_AT,
    FAILED,
    MODE,
    THREAD,
    Disabler,
)
from cgguard._support.frames import snapshot
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

    # The hooks (cgguard._core.hooks) read the state above, and call these.

    def raw_record(self, api: str, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Record:
        """The record of a capture_begin no torch.cuda.graph checked, checked now; called by
        the hook on capture_begin, from the caller's caller of torch's.

        Walked now: a raw capture_begin is often made by a helper that returns at once, and
        its callers move on while the capture stays active. It captures on the current stream.
        Its mode is read here alone: a torch.cuda.graph's was read as __enter__ began.
        """
        graph = id(instance)
        mode = _error_mode(args, kwargs) if api is API_CAPTURE_BEGIN else accelerator_mode(instance)
        stack, stream = snapshot(3), self.probes.stream()  # beyond the hook and its work
        if self.active or self.follows or not self.flag.enabled:
            return self.check(api, graph, mode, stack, stream)[0]
        # check()'s first case, without the call, as __enter__'s hook does.
        return (graph, _marks.ref, api, mode, stack, stream)

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
        # Nothing capturing and nothing followed: cgguard's own flag is the one thing that may
        # refuse (a storm of refused captures), found without the sweep or the search. A
        # capture begun meanwhile is checked once more at capture_begin.
        quiet = not self.active and not self.follows
        if not quiet:
            self.sweep()
        try:
            if quiet:
                disabled = disabled_by(self.flag, ())
                found: Found = [] if disabled is None else [("capture_disabled", disabled)]
                seen: tuple[int, ...] = ()
            else:
                found, seen = self._search(record, mode, stack)
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

    def _search(
        self, record: Record, mode: str, stack: Snapshot | LiveStack
    ) -> tuple[Found, tuple[int, ...]]:
        """check()'s search for the rules an attempt breaks, with the keys of the captures
        active then."""
        # Keys first: a capture begun between the two reads is checked now and, not being
        # among the keys, once more at capture_begin; none is missed.
        seen = tuple(self.active)
        disabled = disabled_by(self.flag, self.follows, stack)
        found = find_violations(disabled, record[THREAD], mode, list(self.active.values()))
        captures = [c for _, c in found if c is not None and not isinstance(c, Disabler)]
        if captures and self.book.stale(captures, self.probes):
            found = find_violations(disabled, record[THREAD], mode, list(self.active.values()))
        return found, seen

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


def accelerator_mode(graph: Any) -> str:
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
