"""What happens when a capture begins, when it ends and when a synchronize runs.

A ``Guard`` is one installation: its configuration, its event log and ledger, the flags it
follows, and the captures it has seen begin and not end. cgguard._patches puts its methods on
torch's entry points; they take plain values (a graph, its arguments, the calling frame), so
every rule here is testable without torch. Which rules exist is cgguard._rules's table.

Whether a capture may begin is decided from cgguard's own state alone, before anything is
reported: no failure while building or writing a report can let a refused capture through.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from threading import current_thread, get_ident
from typing import TYPE_CHECKING, Any

from cgguard import _events
from cgguard._errors import CaptureViolation
from cgguard._frames import innermost_visible, resolve, snapshot, with_stack
from cgguard._ledger import Ledger, worth_logging
from cgguard._patchset import PatchSet
from cgguard._rules import RULES, Cause
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import ModuleType

    from cgguard._config import Action, Config
    from cgguard._exempt_match import Exemptions, Match
    from cgguard._frames import LiveStack, Snapshot
    from cgguard._log import EventLog
    from cgguard._report_file import ReportFile
    from cgguard._schema import ViolationEvent


def _hidden_by_pytest(excinfo: Any) -> bool:
    """Whether pytest leaves this module's frames out of a traceback: a violation's.

    They lie between the user's call and the raise, so the traceback ends at the user's line
    that broke the rule. Any other error keeps them, so that cgguard's own stays traceable.
    """
    return excinfo is not None and isinstance(excinfo.value, CaptureViolation)


# pytest reads __tracebackhide__ from a frame's locals, then from its module's globals: set once
# here, it costs the capture path nothing, where a local in each hook would cost every capture.
__tracebackhide__ = _hidden_by_pytest

API_GRAPH = "torch.cuda.graph"
API_CAPTURE_BEGIN = "CUDAGraph.capture_begin"
API_SYNCHRONIZE = "torch.cuda.synchronize"
API_STREAM_SYNCHRONIZE = "Stream.synchronize"
API_EVENT_SYNCHRONIZE = "Event.synchronize"
API_STREAM_QUERY = "Stream.query"
API_EVENT_QUERY = "Event.query"
API_EVENT_ELAPSED_TIME = "Event.elapsed_time"
API_ACCELERATOR_GRAPH = "torch.accelerator.Graph"
API_ACCELERATOR_CAPTURE_BEGIN = "Graph.capture_begin"
API_ACCELERATOR_SYNCHRONIZE = "torch.accelerator.synchronize"
# torch's CUDAEvent::elapsed_time queries both events (cudaEventQuery) before it measures.
_QUERIES = (API_STREAM_QUERY, API_EVENT_QUERY, API_EVENT_ELAPSED_TIME)
_EVENT_CALLS = (API_EVENT_SYNCHRONIZE, API_EVENT_QUERY, API_EVENT_ELAPSED_TIME)
_STREAM_CALLS = (API_STREAM_SYNCHRONIZE, API_STREAM_QUERY)
# Why a synchronize or query breaks a capture, where the message must say more than that the
# calling thread may not make it: the event it waits on was recorded into the capture, or the
# stream it waits on is the one capturing.
WHY_CAPTURED_EVENT = "captured_event"
WHY_CAPTURING_STREAM = "capturing_stream"


class _Mark:
    """An object that lives exactly as long as its thread."""

    __slots__ = ("__weakref__",)


class ThreadRef(weakref.ref[_Mark]):
    """A thread as captures remember it: its name and id, and whether it still runs (the
    reference is dead once the thread has ended)."""

    __slots__ = ("ident", "name")

    def __new__(cls, mark: _Mark, thread: threading.Thread) -> ThreadRef:
        # weakref.ref's own __new__ would take ``thread`` for a callback.
        return super().__new__(cls, mark)

    def __init__(self, mark: _Mark, thread: threading.Thread) -> None:
        # No super().__init__(): weakref.ref does all its work in __new__.
        self.name = thread.name
        self.ident = thread.ident


# One mark per running thread, held only by that thread's local storage, which Python clears
# when the thread ends, whoever started it (threading, _thread, C code). A weak reference to it
# dies with the thread: neither the thread's id, which the next thread may reuse at once, nor
# threading's _DummyThread, which never says it ended, nor the main thread, which threading
# counts as stopped while exit handlers still run on it, could tell that.
_marks = threading.local()


def this_thread() -> ThreadRef:
    """The calling thread, as captures remember it: the same object for every call on it."""
    try:
        ref: ThreadRef = _marks.ref
    except AttributeError:
        mark = _marks.mark = _Mark()
        ref = _marks.ref = ThreadRef(mark, current_thread())
    return ref


# A capture that has begun, as the capture path keeps it: a plain tuple, since anything with a
# constructor of its own costs several times a tuple display, and most records are never read.
# (id() of the CUDAGraph, the thread that began it, api, capture_error_mode, where it began).
Record = tuple[int, ThreadRef, str, str, "Snapshot | LiveStack"]

Found = list[tuple[str, "Record | None"]]  # (rule, the capture that caused it, if any)

# torch's CUDAGraph::capture_end refuses before cudaStreamEndCapture when called on another
# stream than the capture's (aten/src/ATen/cuda/CUDAGraph.cpp: TORCH_CHECK(stream ==
# capture_stream_, ...)); the capture then goes on. Every later failure comes after CUDA has
# ended the capture, successfully or not.
_STILL_CAPTURING = "Capture must end on the same stream it began on"


class CaptureFlag:
    """The process-wide capture flag, and where it was last changed (None: by configuration).

    It is the program's, not an installation's: a program disables capture whether or not, and
    before or after, cgguard is installed, so it outlives install() and uninstall().
    """

    __slots__ = ("changed_at", "enabled")

    def __init__(self) -> None:
        self.enabled = True
        self.changed_at: Snapshot | None = None

    def set(self, enabled: bool, changed_at: Snapshot | None) -> None:
        # Origin first: a reader that sees the new value must not see the old origin.
        self.changed_at = changed_at
        self.enabled = enabled


FLAG = CaptureFlag()

# The installation in effect, if any: set by install(), dropped by uninstall(). The capture
# path never reads it; the hooks on torch are bound to their own Guard.
current: Guard | None = None

# Called with every violation's full event, whatever the logging (cgguard.testing, the pytest
# plugin). Process-wide, like the flag: a test subscribes before it installs.
LISTENERS: list[Callable[[ViolationEvent], None]] = []


class FlagSource:
    """Another framework's capture flag: a module attribute, and where its setter last set it."""

    def __init__(self, module: ModuleType, attribute: str) -> None:
        self.module = module
        self.attribute = attribute
        self.label = f"{module.__name__}.{attribute}"
        self.changed_at: Snapshot | None = None

    def enabled(self) -> bool:
        """The flag's value; a flag that cannot be read allows, with one warning naming it."""
        try:
            return bool(getattr(self.module, self.attribute, True))
        except Exception as exc:
            warn_once(f"flag:{self.label}", f"cannot read {self.label}, not followed: {exc!r}")
            return True


# Other frameworks' capture flags followed (cgguard._follow): part of what the capture flag
# means, so process-wide like it; follow_flag() may come before install(), and uninstall()
# stops following them all.
FOLLOWED: list[FlagSource] = []


def is_capture_enabled(flag: CaptureFlag = FLAG, follows: Iterable[FlagSource] = FOLLOWED) -> bool:
    """cgguard's flag and every followed flag allow a capture now."""
    return flag.enabled and all(source.enabled() for source in list(follows))


class Guard:
    """One installation of cgguard, and the capture path that consults it."""

    def __init__(
        self,
        config: Config,
        *,
        flag: CaptureFlag = FLAG,
        follows: list[FlagSource] = FOLLOWED,
        listeners: list[Callable[[ViolationEvent], None]] = LISTENERS,
        log: EventLog | None = None,
        report: ReportFile | None = None,
    ) -> None:
        self.config = config
        self.flag = flag
        self.listeners = listeners
        self.log = log  # None: say nothing
        self.report = report  # told of every violation counted; it writes in its own thread
        self.ledger = Ledger()
        # What cgguard._patches put on torch: its entry points, and torch._C._cuda_synchronize,
        # which comes and goes with the simulated runtime on CPU builds.
        self.patches = PatchSet()
        # The simulation may remove its synchronize first: then there is nothing to put back.
        # Also the hooks on its stand-ins where they do not extend torch's classes (CUDA builds).
        self.device_sync = PatchSet(keep_newer=True)
        self.follows = follows
        # Set by uninstall(): hooks a caller still holds a reference to let everything through.
        self.retired = False
        # Whether the current stream is capturing, whether a stream is the current one, and
        # whether a given stream is capturing; cgguard._patches gives torch's answers.
        self.is_capturing: Callable[[], bool] = _not_known
        self.is_current_stream: Callable[[Any], bool] = _not_current
        self.stream_captures: Callable[[Any], bool] = _not_current
        # Captures begun and not yet ended, by id() of the CUDAGraph that holds them. Mutated
        # in place only: the capture_end function binds this very dict.
        self.active: dict[int, Record] = {}
        # Captures torch.cuda.graph.__enter__ is preparing, by (thread id, id() of the graph):
        # the record for the capture_begin it makes, and the captures active when it checked.
        self.entering: dict[tuple[int, int], tuple[Record, tuple[int, ...]]] = {}
        # Events last recorded into a capture, with that capture's record: CUDA fails their
        # synchronize and query in every mode while it is active (cudaErrorCapturedEvent).
        # Weak, so an entry goes with its event. An entry counts only while its record is the
        # active one, and goes when its capture ends, found through ``events_of``: the record
        # may hold the capturing frame, with its tensors, and the dictionary is never iterated,
        # which fails while another thread adds to it.
        self.captured_events: weakref.WeakKeyDictionary[Any, Record] = weakref.WeakKeyDictionary()
        # The events recorded into each capture under way, by id() of its graph.
        self.events_of: dict[int, list[weakref.ref[Any]]] = {}

    def forget_run(self) -> None:
        """A forked child's fresh start: no parent's counts, captures or locks.

        The patches bind this object, so the child keeps it and starts its run state anew:
        {pid} reports summed across a job must not count the parent's violations twice, and
        the parent's captures belong to threads the child lacks.
        """
        self.ledger = Ledger()
        self.active.clear()
        self.entering.clear()
        # Replaced, not cleared: the fork may have caught another thread inside it.
        self.captured_events = weakref.WeakKeyDictionary()
        self.events_of = {}
        if self.report is not None:
            self.report.after_fork(self.ledger)

    def is_capture_enabled(self) -> bool:
        """cgguard's flag and every followed flag allow a capture now."""
        return is_capture_enabled(self.flag, self.follows)

    # The capture path. Each entry point does the least work that keeps the record of active
    # captures true, and leaves everything else to the slow path below.

    def graph_enter(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        """torch.cuda.graph.__enter__ (a wrapt wrapper)."""
        mode = instance.capture_error_mode
        return self._enter(API_GRAPH, id(instance.cuda_graph), mode, wrapped, args, kwargs)

    def accelerator_enter(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        """torch.accelerator.Graph.__enter__ (a wrapt wrapper): the graph is the instance."""
        mode = _accelerator_mode(instance)
        return self._enter(API_ACCELERATOR_GRAPH, id(instance), mode, wrapped, args, kwargs)

    def _enter(  # noqa: PLR0917 (the capture path: positional arguments cost least)
        self, api: str, graph: int, mode: str, wrapped: Any, args: Any, kwargs: Any
    ) -> Any:
        # Checked before torch's __enter__ runs: it synchronizes, empties the cache and switches
        # the current stream before capture_begin, and a refusal raised after that would leave
        # the thread on the capture stream for good, since __exit__ never runs.
        thread = get_ident()
        stack = with_stack(sys._getframe(2))  # the caller of __enter__
        checked = self._check(api, graph, mode, stack)
        # For the capture_begin that __enter__ makes: passed aside, not through the active
        # captures, since torch's own synchronize before capture_begin is no synchronize during
        # a capture; with it, the captures this one was checked against.
        key = (thread, graph)
        self.entering[key] = checked
        try:
            return wrapped(*args, **kwargs)
        finally:
            self.entering.pop(key, None)

    def capture_begin(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        """CUDAGraph.capture_begin (a wrapt wrapper)."""
        mode = _error_mode(args, kwargs)
        return self._begin(API_CAPTURE_BEGIN, mode, wrapped, instance, args, kwargs)

    def accelerator_begin(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        """torch.accelerator.Graph.capture_begin (a wrapt wrapper): its mode is the graph's."""
        mode = _accelerator_mode(instance)
        return self._begin(API_ACCELERATOR_CAPTURE_BEGIN, mode, wrapped, instance, args, kwargs)

    def _begin(  # noqa: PLR0917 (the capture path: positional arguments cost least)
        self, api: str, mode: str, wrapped: Any, instance: Any, args: Any, kwargs: Any
    ) -> Any:
        graph = id(instance)
        entry = self.entering.pop((get_ident(), graph), None)
        if entry is None:
            # Walked now: a raw capture_begin is often made by a helper that returns at once,
            # and its callers move on while the capture stays active.
            record = self._check(api, graph, mode, snapshot(2))[0]
        else:
            # The capture_begin of a torch.cuda.graph, checked when __enter__ began; a capture
            # another thread began while torch prepared this one was not.
            record, seen = entry
            if self.active:
                self._recheck_concurrent(record, seen)
        result = wrapped(*args, **kwargs)
        self.active[graph] = record
        return result

    def make_capture_end(self, original: Any) -> Any:
        """CUDAGraph.capture_end, forgetting the capture once CUDA has ended it.

        A plain function, not a wrapt wrapper: it runs on every capture and does one dict pop,
        and wrapt's binding and call protocol would cost several times that (about 1 us of the
        capture path, benchmarks/capture_overhead.py). Put on the class, a function binds as
        the method it replaces, so it covers subclasses as a wrapt wrapper would.
        """
        active, guard = self.active, self

        @functools.wraps(original)
        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = original(self, *args, **kwargs)
            except BaseException as exc:
                if not guard._still_capturing(exc):
                    guard._forget_events(id(self), active.pop(id(self), None))
                raise
            ended = active.pop(id(self), None)
            if guard.events_of:  # no event was recorded into any capture: nothing to forget
                guard._forget_events(id(self), ended)
            return result

        return capture_end

    def make_event_record(self, original: Any) -> Any:
        """Event.record, noting an event recorded into a capture of the recording thread.

        A plain function, as for capture_end: Event.record runs often outside any capture, and
        then costs one truth test here.
        """
        active = self.active

        @functools.wraps(original)
        def record(event: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(event, *args, **kwargs)
            if active:  # nothing capturing, nothing to note
                self.note_record(event, args, kwargs)
            return result

        return record

    def note_record(self, event: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Remember whether ``event`` was just recorded into one of this thread's captures.

        Known only for the current stream (torch's default for record()): whether another
        stream captures is not known without asking CUDA, so such a record is forgotten.
        """
        try:
            stream = args[0] if args else kwargs.get("stream")
            thread = this_thread()
            into = None
            if (stream is None or self.is_current_stream(stream)) and self.is_capturing():
                into = next(
                    (r for r in reversed(list(self.active.values())) if r[1] is thread), None
                )
            if into is None:
                self.captured_events.pop(event, None)
            else:
                self.captured_events[event] = into
                self.events_of.setdefault(into[0], []).append(weakref.ref(event))
        except Exception as exc:
            warn_once("guard:record", f"internal error while noting an event's record: {exc!r}")

    def _forget_events(self, key: int, ended: Record | None) -> None:
        """Drop the entries of the events recorded into a capture that has ended."""
        refs = self.events_of.pop(key, None)
        if not refs or ended is None:
            return
        try:
            for ref in refs:
                event = ref()
                # Unless recorded since into another capture.
                if event is not None and self.captured_events.get(event) is ended:
                    self.captured_events.pop(event, None)
        except Exception as exc:
            warn_once("guard:events", f"internal error while forgetting events: {exc!r}")

    def checks_sync(self, api: str) -> Callable[[Any, Any, Any, Any], Any]:
        """A wrapt wrapper for a synchronize or query method: checked while anything captures."""

        def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            if self.active:  # nothing capturing, nothing to check
                self.check_sync(api, instance, args, kwargs)
            return wrapped(*args, **kwargs)

        return wrapper

    def make_device_sync(self, original: Any, api: str = API_SYNCHRONIZE) -> Any:
        """torch._C._cuda_synchronize (or another device-wide synchronize), checked.

        A plain function, not a wrapt wrapper: torch.cuda.graph.__enter__ calls this on every
        capture, a C function has no binding or signature for wrapt to preserve, and wrapt's
        call protocol costs more here than the rest of the capture path together.
        """
        active = self.active

        @functools.wraps(original)
        def synchronize(*args: Any, **kwargs: Any) -> Any:
            if active:  # nothing capturing, nothing to check
                self.check_sync(api)
            return original(*args, **kwargs)

        return synchronize

    # The slow path: something is capturing, capture is disabled, or a flag is followed.

    def check_begin(self, api: str, key: int, mode: str, stack: Snapshot | LiveStack) -> Record:
        """Check a capture attempt; report, and raise if an action says raise; else its record.

        The caller adds the record to ``active`` once the capture has begun.
        """
        return self._check(api, key, mode, stack)[0]

    def _check(
        self, api: str, key: int, mode: str, stack: Snapshot | LiveStack
    ) -> tuple[Record, tuple[int, ...]]:
        """check_begin(), with the keys of the active captures the attempt was checked against."""
        record = (key, this_thread(), api, mode, stack)
        # The common case costs three reads: nothing capturing, capture enabled, no followed flag.
        if not self.active and self.flag.enabled and not self.follows:
            return record, ()
        if self.retired:
            return record, ()
        self.drop_abandoned()
        try:
            # Keys first: a capture begun between the two reads is checked now and, not being
            # among the keys, once more at capture_begin; none is missed.
            seen = tuple(self.active)
            enabled = self.flag.enabled and (not self.follows or self.is_capture_enabled())
            found = find_violations(enabled, record[1], mode, list(self.active.values()))
        except Exception as exc:
            warn_once(
                "guard:begin", f"internal error while checking a capture, not checked: {exc!r}"
            )
            return record, ()
        if found:
            error = self._violated(found, api, stack, refuse=True)
            if error is not None:
                raise error
        return record, seen

    def _recheck_concurrent(self, begun: Record, seen: tuple[int, ...]) -> None:
        """Report a capture another thread began while torch.cuda.graph prepared ``begun``.

        torch has switched the thread's stream by then, so this reports and never refuses.
        """
        _, thread, api, mode, stack = begun
        if self.retired:
            return
        self.drop_abandoned()
        try:
            since = [r for k, r in list(self.active.items()) if k not in seen]
            found = [
                (rule, cause)
                for rule, cause in find_violations(True, thread, mode, since)
                if rule == "concurrent_capture"
            ]
        except Exception as exc:
            warn_once(
                "guard:recheck", f"internal error while checking a capture, not checked: {exc!r}"
            )
            return
        if found:
            self._violated(found, api, stack, refuse=False)

    def check_sync(
        self,
        api: str,
        instance: Any = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Check a synchronize or query made by the caller's caller (a method of ``instance``,
        a stream or an event, called with ``args``); report, maybe raise, before CUDA."""
        if self.retired:
            return
        self.drop_abandoned()
        ident, thread = get_ident(), this_thread()
        try:
            captured_in = None
            capturing_stream = False
            if api in _EVENT_CALLS:
                events = [instance]
                if api == API_EVENT_ELAPSED_TIME:
                    events.append(args[0] if args else (kwargs or {}).get("end_event"))
                if not all(getattr(event, "cuda_event", 1) for event in events):
                    # torch creates an event at its first record(); before that, its synchronize
                    # and query make no CUDA call (CUDAEvent::synchronize, ::query), and
                    # elapsed_time refuses in torch before CUDA.
                    return
                captured_in = self._captured_into(events)
            elif api in _STREAM_CALLS:
                capturing_stream = self.stream_captures(instance)
            cause = find_sync_violation(
                thread,
                list(self.active.values()),
                query=api in _QUERIES,
                on_capturing_stream=capturing_stream,
                captured_in=captured_in,
            )
            if cause is None:
                return
            why = _why(cause, thread, captured_in, capturing_stream)
            if any(entering_thread == ident for entering_thread, _ in list(self.entering)):
                # torch.cuda.graph.__enter__'s own synchronize: part of the capture attempt,
                # reported already under the rule it breaks, unless that rule is off.
                covered = "nested_capture" if cause[1] == thread else "concurrent_capture"
                if self.config.action(covered) != "off":
                    return
            stack = snapshot(2)  # from the caller of the hook that called this
        except Exception as exc:
            warn_once(
                "guard:sync", f"internal error while checking a synchronize, not checked: {exc!r}"
            )
            return
        found: Found = [("sync_during_capture", cause)]
        error = self._violated(found, api, stack, refuse=True, why=why)
        if error is not None:
            raise error

    def _captured_into(self, events: list[Any]) -> Record | None:
        """The active capture the first of ``events`` was last recorded into, if any."""
        if not self.captured_events:
            return None
        for event in events:
            record = self.captured_events.get(event)
            # An entry outlives its capture: it counts only while its record is the active one.
            if record is not None and self.active.get(record[0]) is record:
                return record
        return None

    def drop_abandoned(self) -> None:
        """Forget, and report once, the captures of threads that have ended."""
        try:
            # Relaxed captures are left alone: CUDA lets another thread end them.
            dead = [
                (k, r) for k, r in list(self.active.items()) if r[1]() is None and r[3] != "relaxed"
            ]
        except Exception as exc:
            warn_once("guard:threads", f"internal error while checking threads: {exc!r}")
            return
        for key, record in dead:
            # Popped first: of two threads that find it, one reports it.
            if self.active.get(key) is record and self.active.pop(key, None) is record:
                self._forget_events(key, record)
                _, _, api, _, stack = record
                self._violated([("abandoned_capture", record)], api, stack, refuse=False)

    # The exemptions in effect (cgguard._exempt_match), set by install(); None: none, and then no
    # stack is ever matched. Consulted only here, once a rule is found broken: an exemption
    # costs the capture path nothing.
    exempt: Exemptions | None = None

    def _violated(
        self,
        found: Found,
        api: str,
        stack: Snapshot | LiveStack,
        *,
        refuse: bool,
        why: str = "",
    ) -> CaptureViolation | None:
        """Count and report each violation; return the error to raise, if an action says raise.

        Refusal is decided first, from the configuration and the exemptions alone. With
        ``refuse`` false (too late to refuse), a raise action is reported as logged. An
        exempted violation is counted as exempted, and neither raised nor reported.
        """
        acting: list[tuple[str, Record | None, Action]] = []
        for rule, cause in found:
            action = self.config.action(rule)
            if action != "off":
                acting.append((rule, cause, action))
        if self.exempt is not None and acting:
            acting, stack = self._exempted(acting, api, stack, self.exempt)
        if not acting:
            return None
        refusing = next((r for r, _, a in acting if refuse and a == "raise"), None)
        try:
            return self._report_each(acting, api, stack, refuse=refuse, why=why)
        except Exception as exc:
            warn_once("guard:report", f"internal error while reporting a violation: {exc!r}")
            if refusing is None:
                return None
            # Refused all the same, with what is known without the report.
            message = f"{refusing}: {api} refused (cgguard could not build the report: {exc!r})"
            return RULES[refusing].error(message, {"rule": refusing, "api": api})

    def _exempted(
        self,
        acting: list[tuple[str, Record | None, Action]],
        api: str,
        stack: Snapshot | LiveStack,
        exempt: Exemptions,
    ) -> tuple[list[tuple[str, Record | None, Action]], Snapshot | LiveStack]:
        """The violations no exemption lets through, and the stack, walked if it was matched.

        Each one exempted is counted, logged at debug level the first time at its site, and
        told to the report. A failure to match is one warning, and the violation stands.
        """
        try:
            if not any(exempt.covers(rule) for rule, _, _ in acting):
                return acting, stack
            stack = resolve(stack)
            matched = [(item, exempt.match(item[0], stack)) for item in acting]
        except Exception as exc:
            warn_once("guard:exempt", f"internal error while matching exemptions: {exc!r}")
            return acting, stack
        for (rule, _, _), match in matched:
            if match is not None:
                try:
                    self._count_exempted(rule, api, stack, match, exempt)
                except Exception as exc:
                    warn_once("guard:exempted", f"could not count an exempted capture: {exc!r}")
        return [item for item, match in matched if match is None], stack

    def _count_exempted(
        self, rule: str, api: str, stack: Snapshot, match: Match, exempt: Exemptions
    ) -> None:
        code, lasti = innermost_visible(stack)
        site, count = exempt.tally.count(rule, code, lasti, api, match.exemption)
        if count == 1:
            site.first = _events.exempted(rule, api, stack, match.exemption, match.frame())
            if self.log is not None:
                self.log.emit(site.first)
        if self.report is not None:
            # As a count, never as a new site: a violation's new site is on disk before the
            # program goes on, which costs a write per site; what an exemption let through
            # follows within half a second, and never costs the capture a write.
            self.report.changed(new_site=False)

    def _report_each(
        self,
        acting: list[tuple[str, Record | None, Action]],
        api: str,
        stack: Snapshot | LiveStack,
        *,
        refuse: bool,
        why: str = "",
    ) -> CaptureViolation | None:
        stack = resolve(stack)
        code, lasti = innermost_visible(stack)
        error: CaptureViolation | None = None
        for rule, cause, action in acting:
            raising = action == "raise" and refuse
            taken = "raised" if raising else "logged"
            site, count = self.ledger.count(rule, code, lasti, api, taken)
            event: ViolationEvent | None = None  # built only where needed
            # Rendering is the expensive part: only for the first at a site, a raise, or
            # listeners that must see every violation in full.
            if count == 1 or raising or self.listeners:
                event = self._event(rule, api, stack, cause, action=taken, count=count, why=why)
                if count == 1:
                    site.first = event
                self._publish(event)
            if self.report is not None:
                self.report.changed(new_site=count == 1)
            if self.log is not None:
                if count == 1 and event is not None:
                    self.log.emit(event)
                elif worth_logging(count):
                    self.log.emit(_events.repeat(site, count, self.ledger.where(site)))
            if raising and error is None and event is not None:
                error = RULES[rule].error(event["message"], event)
        return error

    def _event(
        self,
        rule: str,
        api: str,
        stack: Snapshot,
        cause: Record | None,
        *,
        action: str,
        count: int,
        why: str = "",
    ) -> ViolationEvent:
        if rule == "abandoned_capture" and cause is not None:
            name, ident = _names_of(cause[1])
            told = Cause(f"thread {name!r} ({ident})", ident, cause[3])
            return _events.violation(
                rule, api, stack, None, told, action=action, count=count, thread=(name, ident)
            )
        if cause is not None:
            _, thread, began_by, mode, began_at = cause
            told = Cause(
                f"begun at {{where}} via {began_by}",
                _names_of(thread)[1],
                mode,
                query=api in _QUERIES,
                elsewhere=thread is not this_thread(),
                why=why,
            )
            return _events.violation(
                rule, api, stack, resolve(began_at), told, action=action, count=count
            )
        label, origin = self._disabled_by()
        if origin is not None:
            told = Cause("capture was disabled at {where}")
        elif label is None:
            told = Cause("capture was disabled by cgguard's configuration at start")
        else:
            told = Cause(f"capture was disabled by {label}")
        return _events.violation(rule, api, stack, origin, told, action=action, count=count)

    def _still_capturing(self, exc: BaseException) -> bool:
        """Whether the capture a failed capture_end was ending goes on."""
        if _STILL_CAPTURING in str(exc):
            return True  # refused on another stream: the capture's own stream still captures
        try:
            # On the capture's stream: anything that failed before CUDA ended the capture (a
            # bad argument, an interrupt) leaves that stream capturing.
            return self.is_capturing()
        except Exception:
            return False

    def _disabled_by(self) -> tuple[str | None, Snapshot | None]:
        """Which flag disables capture: (a label, or None for cgguard's own; where it was set)."""
        if not self.flag.enabled:
            return None, self.flag.changed_at
        for source in list(self.follows):
            if not source.enabled():
                return source.label, source.changed_at
        return None, None

    def _publish(self, event: ViolationEvent) -> None:
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception as exc:
                warn_once("listener", f"a violation listener failed: {exc!r}")


def find_violations(enabled: bool, thread: object, mode: str, active: Iterable[Record]) -> Found:
    """The rules a capture attempt on ``thread`` in ``mode`` breaks, each with its cause."""
    found: Found = []
    if not enabled:
        found.append(("capture_disabled", None))
    nested = concurrent = None
    for record in active:
        _, other, _, other_mode, _ = record
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
    own = next((r for r in records if r[1] == thread), None)
    if own is not None and own[3] != "relaxed":
        return own
    if captured_in is not None:
        return captured_in
    if own is not None and (not query or on_capturing_stream):
        return own
    wide = next((r for r in records if r[1] != thread and r[3] == "global"), None)
    if wide is None and on_capturing_stream:
        # The stream captures for another thread: which of its captures is not known, and
        # with one capture per thread at a time, the first is right but for nesting.
        return next((r for r in records if r[1] != thread), None)
    return wide


def _why(cause: Record, thread: object, captured_in: Record | None, capturing_stream: bool) -> str:
    """What the message must name, beyond a call the thread was prohibited from making."""
    _, holder, _, mode, _ = cause
    if (holder == thread and mode != "relaxed") or (holder != thread and mode == "global"):
        return ""  # prohibited on this thread: CUDA refuses before it looks further
    if cause is captured_in:
        return WHY_CAPTURED_EVENT
    if capturing_stream:
        return WHY_CAPTURING_STREAM
    return ""


def _names_of(thread: ThreadRef) -> tuple[str, int | None]:
    """The name and id of a capture's thread, running or ended."""
    return thread.name, thread.ident


def _not_known() -> bool:
    return False


def _not_current(stream: Any) -> bool:
    return False


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
