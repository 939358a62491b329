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
import weakref
from threading import get_ident
from time import perf_counter
from typing import TYPE_CHECKING, Any, NamedTuple

from cgguard._core.watch import GraphNotes, forget_graph
from cgguard._errors import CaptureViolation, hidden_by_pytest
from cgguard._gate.flags import disabled_by
from cgguard._reporting.reporter import QUERIES
from cgguard._rules.checks import find_sync_violation, find_violations, why_sync
from cgguard._rules.record import (
    ABANDONED,
    API,
    BEGAN_AT,
    ENDED,
    FAILED,
    KEY,
    MODE,
    STREAM,
    THREAD,
    Disabler,
)
from cgguard._support.frames import snapshot, with_stack
from cgguard._support.threads import marks as _marks
from cgguard._support.threads import this_thread
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from cgguard._core.watch import Watcher
    from cgguard._gate.flags import CaptureFlag, FlagSource, Windows
    from cgguard._reporting.reporter import Reporter
    from cgguard._rules.record import Found, Record
    from cgguard._support.frames import LiveStack, Snapshot

# What a watcher of a capture under way keeps for it, as its opening() returned, with the
# watcher that will be told how the capture ended; and what the watchers after the first keep.
Told = tuple["Watcher", Any]
Tokens = list[Told]


# The traceback of a violation ends at the user's line (cgguard._errors.hidden_by_pytest).
__tracebackhide__ = hidden_by_pytest

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
_EVENT_CALLS = (API_EVENT_SYNCHRONIZE, API_EVENT_QUERY, API_EVENT_ELAPSED_TIME)
_STREAM_CALLS = (API_STREAM_SYNCHRONIZE, API_STREAM_QUERY)

# torch's CUDAGraph::capture_end refuses before cudaStreamEndCapture when called on another
# stream than the capture's (aten/src/ATen/cuda/CUDAGraph.cpp: TORCH_CHECK(stream ==
# capture_stream_, ...)); the capture then goes on. Every later failure comes after CUDA has
# ended the capture, successfully or not.
_STILL_CAPTURING = "Capture must end on the same stream it began on"


class Probes(NamedTuple):
    """What the capture path asks torch, as cgguard._core.patches answers it."""

    is_capturing: Callable[[], bool]  # whether the current stream captures
    current_stream: Callable[[], Any]
    is_current_stream: Callable[[Any], bool]
    stream_captures: Callable[[Any], bool]  # whether a given stream captures
    # The allocator's statistics of the current device, (device, reserved bytes, allocated
    # bytes), read once; None where torch has no CUDA allocator (CPU builds), and the probe
    # answers None while CUDA is not initialised (the simulated runtime).
    memory: Callable[[], tuple[int, int, int] | None] | None = None


def _no(*_: object) -> bool:
    return False


def _none() -> None:
    return None


# Without torch: nothing captures, and no stream is known (so no record is ever found stale).
NO_TORCH = Probes(_no, _none, _no, _no)


class Tracker:
    """The captures under way in one installation, and the hooks that keep them."""

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
        # Captures begun and not yet ended, by id() of the graph that holds them. Mutated in
        # place only: the capture_end function binds this very dict.
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
        # What follows each capture beyond the rules (cgguard._core.watch), replaced whole by
        # watch(): all of them; the first, told directly, and the rest, told in a loop; those
        # that watch replays.
        self.watchers: tuple[Watcher, ...] = ()
        self.lead: Watcher | None = None
        self.rest: tuple[Watcher, ...] = ()
        self.replay_watchers: tuple[Watcher, ...] = ()
        # The tokens of each capture under way, by id() of its graph: the first watcher's in
        # ``led``, the rest's in ``tokens``.
        self.led: dict[int, Told] = {}
        self.tokens: dict[int, Tokens] = {}
        # Whether graphs may hold a watcher's notes (the process's): until then, capture_begin
        # has none to drop.
        self.notes = notes if notes is not None else GraphNotes()
        self.forgets = self.notes.kept

    def set_watchers(self, watchers: tuple[Watcher, ...]) -> None:
        """Follow each capture begun from now on with ``watchers``, told in that order.

        The first is told without the loop the others go through, and its token is kept on
        its own: it is the census when the census is on, the one watcher on by default, so
        the one whose cost every capture pays (docs/census.md).
        """
        self.watchers = watchers
        self.lead = watchers[0] if watchers else None
        self.rest = watchers[1:]
        self.replay_watchers = tuple(w for w in watchers if w.wants_replays)
        self.forgets = self.notes.note(watchers)

    def after_fork(self) -> None:
        """A forked child's fresh start: the parent's captures belong to threads it lacks."""
        self.active.clear()
        self.entering.clear()
        # Replaced, not cleared: the fork may have caught another thread inside them.
        self.captured_events = weakref.WeakKeyDictionary()
        self.events_of = {}
        self.led = {}
        self.tokens = {}
        for watcher in self.watchers:
            _tell(watcher.after_fork)

    # The hooks.

    # Each hook is one Python call: torch.accelerator's are the same methods with their own
    # ``api``, bound by functools.partial (cgguard._core.patches), so that they too find the user's
    # frame one up.

    def graph_enter(
        self, wrapped: Any, instance: Any, args: Any, kwargs: Any, api: str = API_GRAPH
    ) -> Any:
        """torch.cuda.graph.__enter__ (a wrapt wrapper), or torch.accelerator.Graph's."""
        if api is API_GRAPH:
            mode = instance.capture_error_mode
            graph = id(instance.cuda_graph)
            # torch.cuda.graph captures on its own stream, set when it was made.
            stream = getattr(instance, "capture_stream", None)
        else:
            # torch.accelerator.Graph: the graph is the instance, and it captures on the
            # current stream.
            mode = _accelerator_mode(instance)
            graph = id(instance)
            stream = self._current_stream()
        # Checked before torch's __enter__ runs: it synchronizes, empties the cache and switches
        # the current stream before capture_begin, and a refusal raised after that would leave
        # the thread on the capture stream for good, since __exit__ never runs.
        key = (get_ident(), graph)
        stack = with_stack(sys._getframe(1))  # the caller of __enter__
        if self.active or self.follows or not self.flag.enabled:
            checked = self.check(api, graph, mode, stack, stream)
        else:
            # check()'s first case, without the call: nothing capturing, nothing followed, and
            # capture enabled, as at nearly every capture.
            checked = ((graph, _marks.ref, api, mode, stack, stream), ())
        try:
            # For the capture_begin that __enter__ makes: passed aside, not through the active
            # captures, since torch's own synchronize before capture_begin is no synchronize
            # during a capture; with it, the captures this one was checked against.
            self.entering[key] = checked
            return wrapped(*args, **kwargs)
        finally:
            self.entering.pop(key, None)

    def capture_begin(
        self, wrapped: Any, instance: Any, args: Any, kwargs: Any, api: str = API_CAPTURE_BEGIN
    ) -> Any:
        """CUDAGraph.capture_begin (a wrapt wrapper), or torch.accelerator.Graph's, whose mode
        is the graph's."""
        graph = id(instance)
        entry = self.entering.pop((get_ident(), graph), None)
        if entry is None:
            # Walked now: a raw capture_begin is often made by a helper that returns at once,
            # and its callers move on while the capture stays active. It captures on the
            # current stream. Its mode is read here alone: a torch.cuda.graph's was read as
            # __enter__ began.
            mode = (
                _error_mode(args, kwargs)
                if api is API_CAPTURE_BEGIN
                else _accelerator_mode(instance)
            )
            stack, stream = snapshot(1), self._current_stream()
            if self.active or self.follows or not self.flag.enabled:
                record = self.check(api, graph, mode, stack, stream)[0]
            else:  # check()'s first case, without the call, as in graph_enter
                record = (graph, _marks.ref, api, mode, stack, stream)
        else:
            # The capture_begin of a torch.cuda.graph, checked when __enter__ began; a capture
            # another thread began while torch prepared this one was not.
            record, seen = entry
            if self.active:
                self._recheck_concurrent(record, seen)
        active = self.active
        previous = active.get(graph)  # a capture into this graph already under way, if any
        if self.forgets:
            forget_graph(instance)  # what a watcher kept for this graph's earlier capture
        # Inline, not a method: this runs at every capture the census counts.
        led: Told | None = None
        lead = self.lead
        if lead is not None:
            try:
                led = (lead, lead.opening(instance, record, args, kwargs))
            except Exception as exc:
                warn_once("watch:open", f"internal error while watching a capture: {exc!r}")
        tokens = self._open_rest(instance, record, args, kwargs) if self.rest else None
        try:
            # Recorded first: an interrupt right after torch began the capture must not leave
            # it unknown, and a later nested capture unrefused.
            active[graph] = record
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            self._begin_failed(graph, record, previous, led=led, tokens=tokens, exc=exc)
            raise
        if led is not None:
            self.led[graph] = led
        if tokens:
            self.tokens[graph] = tokens
        return result

    def _open_rest(self, graph: Any, record: Record, args: Any, kwargs: Any) -> Tokens:
        """Tell the watchers after the first that a capture into ``graph`` opens: their tokens."""
        tokens: Tokens = []
        for watcher in self.rest:
            try:
                tokens.append((watcher, watcher.opening(graph, record, args, kwargs)))
            except Exception as exc:
                warn_once("watch:open", f"internal error while watching a capture: {exc!r}")
        return tokens

    def _begin_failed(
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
        if active.get(graph) is record and not self._began_here(record, previous):
            if previous is None:
                active.pop(graph, None)
            else:
                active[graph] = previous
            if led is not None:
                _close((led,), FAILED, exc)
            if tokens:
                _close(tokens, FAILED, exc)
            return
        # It began: torch raised only afterwards.
        if led is not None:
            self.led[graph] = led
        if tokens:
            self.tokens[graph] = tokens

    def make_capture_end(self, original: Any) -> Any:
        """CUDAGraph.capture_end, forgetting the capture once CUDA has ended it.

        A plain function, not a wrapt wrapper: it runs on every capture and does one dict pop,
        and wrapt's binding and call protocol would cost several times that (about 1 us of the
        capture path, benchmarks/capture_overhead.py). Put on the class, a function binds as
        the method it replaces, so it covers subclasses as a wrapt wrapper would.
        """
        active, tracker = self.active, self

        @functools.wraps(original)
        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = original(self, *args, **kwargs)
            except BaseException as exc:
                if not tracker._still_capturing(exc):
                    tracker._forget_events(id(self), active.pop(id(self), None))
                    if tracker.led or tracker.tokens:
                        tracker._closed(id(self), FAILED, exc)
                raise
            key = id(self)
            # An interrupt here leaves a record whose capture has ended: found stale later.
            ended = active.pop(key, None)
            if tracker.events_of:  # no event was recorded into any capture: nothing to forget
                tracker._forget_events(key, ended)
            # The first watcher's token, told as _close would, inline: this runs at the end of
            # every capture the census counts.
            led = tracker.led
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
            if tracker.tokens:
                tokens = tracker.tokens.pop(key, None)
                if tokens:
                    _close(tokens, ENDED, None)
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
            if self._stale(captures):
                found = find_violations(disabled, record[THREAD], mode, list(self.active.values()))
        except Exception as exc:
            warn_once(
                "guard:begin", f"internal error while checking a capture, not checked: {exc!r}"
            )
            return record, ()
        if found:
            error = self._violated(found, api, stack, refuse=True)
            if error is not None:
                for watcher in self.watchers:
                    _tell(watcher.refused, record)
                raise error
        return record, seen

    def _recheck_concurrent(self, begun: Record, seen: tuple[int, ...]) -> None:
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
            self._violated(found, begun[API], begun[BEGAN_AT], refuse=False)

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
        self.sweep()
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
                capturing_stream = self.probes.stream_captures(instance)
            cause, captured_in = self._sync_cause(
                thread, api in QUERIES, capturing_stream, captured_in
            )
            if cause is None:
                return
            why = why_sync(cause, thread, captured_in, capturing_stream)
            if any(entering_thread == ident for entering_thread, _ in list(self.entering)):
                # torch.cuda.graph.__enter__'s own synchronize: part of the capture attempt,
                # reported already under the rule it breaks, unless that rule is off.
                covered = "nested_capture" if cause[THREAD] == thread else "concurrent_capture"
                if self.reporter.config.action(covered) != "off":
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

    def _sync_cause(
        self, thread: object, query: bool, capturing_stream: bool, captured_in: Record | None
    ) -> tuple[Record | None, Record | None]:
        """The capture a synchronize breaks, live, and the capture its event was recorded into
        if that is still live: a stale cause is dropped and the next one looked for."""
        cause = None
        for _ in range(len(self.active) + 1):  # each stale cause found drops one record
            cause = find_sync_violation(
                thread,
                list(self.active.values()),
                query=query,
                on_capturing_stream=capturing_stream,
                captured_in=captured_in,
            )
            if cause is None or not self._stale([cause]):
                break
            if cause is captured_in:
                captured_in = None
        return cause, captured_in

    def _violated(
        self, found: Found, api: str, stack: Snapshot | LiveStack, *, refuse: bool, why: str = ""
    ) -> CaptureViolation | None:
        # Read once: a reconfiguration swaps the reporter whole.
        reporter = self.reporter
        return reporter.violated(found, api, stack, refuse=refuse, why=why)

    def make_replay(self, original: Any) -> Any:
        """CUDAGraph.replay, shown first to the watchers that watch replays.

        A plain function, as capture_end: a serving loop replays on every step. Put on the class
        only while some watcher wants replays (cgguard._core.patches.patch_replay).
        """
        tracker = self

        @functools.wraps(original)
        def replay(self: Any, *args: Any, **kwargs: Any) -> Any:
            for watcher in tracker.replay_watchers:
                try:
                    watcher.replaying(self)
                except CaptureViolation:
                    raise  # a refusal: the replay does not run
                except Exception as exc:
                    warn_once("watch:replay", f"internal error while watching a replay: {exc!r}")
            return original(self, *args, **kwargs)

        return replay

    def _closed(self, key: int, outcome: str, error: BaseException | None) -> None:
        """Tell the watchers of the capture at ``key`` that it is over, once."""
        led = self.led.pop(key, None)
        tokens = self.tokens.pop(key, None)
        if led is not None:
            _close((led,), outcome, error)
        if tokens:
            _close(tokens, outcome, error)

    def note_record(self, event: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Remember whether ``event`` was just recorded into one of this thread's captures.

        Known only for the current stream (torch's default for record()): whether another
        stream captures is not known without asking CUDA, so such a record is forgotten.
        """
        try:
            stream = args[0] if args else kwargs.get("stream")
            thread = this_thread()
            into = None
            if (stream is None or self.probes.is_current_stream(stream)) and (
                self.probes.is_capturing()
            ):
                into = next(
                    (r for r in reversed(list(self.active.values())) if r[THREAD] is thread),
                    None,
                )
            if into is None:
                self.captured_events.pop(event, None)
            else:
                self.captured_events[event] = into
                self.events_of.setdefault(into[KEY], []).append(weakref.ref(event))
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

    def _captured_into(self, events: list[Any]) -> Record | None:
        """The active capture the first of ``events`` was last recorded into, if any."""
        if not self.captured_events:
            return None
        for event in events:
            record = self.captured_events.get(event)
            # An entry outlives its capture: it counts only while its record is the active one.
            if record is not None and self.active.get(record[KEY]) is record:
                return record
        return None

    def forget(self, kept: tuple[Record, ...] = ()) -> list[Record]:
        """Forget every capture under way but ``kept``; return the records forgotten."""
        return [
            record
            for key, record in list(self.active.items())
            if not any(record is k for k in kept) and self._drop(key, record)
        ]

    def _drop(self, key: int, record: Record, outcome: str = ABANDONED) -> bool:
        """Forget the capture at ``key`` if it is still ``record``; whether this call did.

        Popped only while it is this record: its thread may end it meanwhile, and of two
        threads that find it, one drops it.
        """
        if self.active.get(key) is record and self.active.pop(key, None) is record:
            self._forget_events(key, record)
            if self.led or self.tokens:
                self._closed(key, outcome, None)
            return True
        return False

    def sweep(self) -> None:
        """Forget, and report once, the captures of threads that have ended."""
        if self.active:  # a storm of refusals with nothing capturing: nothing to sweep
            self.drop_abandoned()

    def drop_abandoned(self) -> None:
        """Forget, and report once, the captures of threads that have ended."""
        try:
            # Relaxed captures are left alone: CUDA lets another thread end them.
            dead = [
                (k, r)
                for k, r in list(self.active.items())
                if r[THREAD]() is None and r[MODE] != "relaxed"
            ]
        except Exception as exc:
            warn_once("guard:threads", f"internal error while checking threads: {exc!r}")
            return
        for key, record in dead:
            if self._drop(key, record):  # dropped first: of two threads, one reports it
                self._violated(
                    [("abandoned_capture", record)], record[API], record[BEGAN_AT], refuse=False
                )

    def _stale(self, causes: list[Record]) -> bool:
        """Forget those of ``causes`` whose stream no longer captures; whether there were any.

        Such a record is cgguard's own mistake, not the program's: its capture ended where
        cgguard could not see it (an interrupt right after torch's capture_end, a capture_end
        that skips torch's). Asked only of a violation's causes, just before it is reported.
        """
        stale = [cause for cause in causes if not self._began(cause, unknown=True)]
        for record in stale:
            # It ended, in a way cgguard could not see.
            self._drop(record[KEY], record, ENDED)
        return bool(stale)

    def _began_here(self, record: Record, previous: Record | None) -> bool:
        """Whether the capture_begin that raised had begun ``record``'s capture: its stream
        captures, and for no other capture cgguard knows (torch refuses a capture_begin on a
        stream already capturing)."""
        if not self._began(record):
            return False
        others = [r for r in self.active.values() if r is not record]
        if previous is not None:
            others.append(previous)
        try:
            return not any(other[STREAM] == record[STREAM] for other in others)
        except Exception:
            return True

    def _began(self, record: Record, *, unknown: bool = False) -> bool:
        """Whether ``record``'s stream captures (``unknown`` where that cannot be told)."""
        stream = record[STREAM]
        try:
            if stream is None:
                return unknown
            return self.probes.stream_captures(stream)
        except Exception:
            return unknown

    def _current_stream(self) -> Any:
        try:
            return self.probes.current_stream()
        except Exception:
            return None

    def _still_capturing(self, exc: BaseException) -> bool:
        """Whether the capture a failed capture_end was ending goes on."""
        if _STILL_CAPTURING in str(exc):
            return True  # refused on another stream: the capture's own stream still captures
        try:
            # On the capture's stream: anything that failed before CUDA ended the capture (a
            # bad argument, an interrupt) leaves that stream capturing.
            return self.probes.is_capturing()
        except Exception:
            return False


def _tell(method: Callable[..., object], *args: Any) -> None:
    """Call a watcher's ``method``; its failure is one warning, never the program's."""
    try:
        method(*args)
    except Exception as exc:
        warn_once("watch:" + method.__name__, f"internal error while watching a capture: {exc!r}")


def _close(tokens: Iterable[Told], outcome: str, error: BaseException | None) -> None:
    """Tell each watcher how its capture came to an end: a list token of one that ENDED is
    stamped instead (cgguard._core.watch.Watcher)."""
    # Not through _tell: this runs at the end of every capture, and a call less is part of
    # what keeps a watcher's cost within the capture path's budget.
    for watcher, token in tokens:
        try:
            if outcome == ENDED and type(token) is list:
                token[0] += perf_counter()
            else:
                watcher.closed(token, outcome, error)
        except Exception as exc:
            warn_once("watch:closed", f"internal error while watching a capture: {exc!r}")


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
