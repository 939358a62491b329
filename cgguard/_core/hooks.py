"""The hooks on torch's capture entry points: the plain functions put in place of
torch.cuda.graph.__enter__, CUDAGraph.capture_begin and CUDAGraph.capture_end (and
torch.accelerator.Graph's), each doing its work over one Tracker's state (cgguard._core.tracker).

Plain functions, not wrapt wrappers, as every hook on the capture path is: wrapt's binding and
call protocol cost about four Python calls each, twice per capture. Put on the class, a function
binds as the method it replaces, so it covers subclasses as a wrapt wrapper would. Each holds
the tracker's parts it reads, the very objects, and takes torch's own parameters where torch's
are known, so that no capture pays for packing and spreading its arguments.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from time import perf_counter
from typing import TYPE_CHECKING, Any

from cgguard._core.fanout import close
from cgguard._core.tracker import accelerator_mode
from cgguard._core.watcher import forget_graph
from cgguard._errors import hidden_by_pytest
from cgguard._rules.record import API_CAPTURE_BEGIN, API_GRAPH, ENDED, FAILED
from cgguard._support.frames import ENTERS_WITH, SUSPENDS, snapshot_from
from cgguard._support.threads import marks as _marks
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._core.fanout import Told
    from cgguard._core.tracker import Tracker
    from cgguard._support.frames import LiveStack, Snapshot

# The traceback of a violation ends at the user's line (cgguard._errors.hidden_by_pytest).
__tracebackhide__ = hidden_by_pytest


def graph_enter(tracker: Tracker, original: Any, api: str = API_GRAPH) -> Any:
    """torch.cuda.graph.__enter__, or torch.accelerator.Graph's: its capture checked before
    torch's own __enter__ runs, which synchronizes, empties the cache and switches the
    current stream before capture_begin: a refusal raised after that would leave the thread
    on the capture stream for good, since __exit__ never runs."""
    active, entering, flag, follows = (
        tracker.active,
        tracker.entering,
        tracker.flag,
        tracker.follows,
    )
    accelerator = api is not API_GRAPH

    # __enter__ takes no argument (the context manager protocol): none to pass through.
    @functools.wraps(original)
    def enter(instance: Any) -> Any:
        if accelerator:
            # The graph is the instance, and it captures on the current stream.
            mode = accelerator_mode(instance)
            graph = id(instance)
            stream = tracker.probes.stream()
        else:
            mode = instance.capture_error_mode
            graph = id(instance.cuda_graph)
            # torch.cuda.graph captures on its own stream, set when it was made (every release).
            stream = instance.capture_stream
        # Where the capture began (cgguard._support.frames.with_stack, inline: this runs at
        # every capture): a frame entering a ``with`` runs for the whole block, and is kept.
        caller = sys._getframe(1)  # the caller of __enter__
        code, lasti = caller.f_code, caller.f_lasti
        if code.co_code[lasti] in ENTERS_WITH and not code.co_flags & SUSPENDS:
            stack: Snapshot | LiveStack = (caller, lasti)
        else:
            stack = snapshot_from(caller)
        if active or follows or not flag.enabled:
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


def capture_begin(tracker: Tracker, original: Any, api: str = API_CAPTURE_BEGIN) -> Any:
    """CUDAGraph.capture_begin, or torch.accelerator.Graph's (whose mode is the graph's):
    the capture recorded and its watchers told, then torch's own run.

    Where torch's own takes (pool, capture_error_mode, check_input_liveness), as from 2.13,
    so does its hook, with the same defaults: torch.cuda.graph passes them by keyword, and
    a hook that takes ``**kwargs`` costs every capture a dict built and spread again.
    Elsewhere the arguments pass through as they came.
    """
    opened = _opening(tracker, original, api)
    if not _takes(original, _CAPTURE_BEGIN_PARAMETERS):

        @functools.wraps(original)
        def begin_with(instance: Any, *args: Any, **kwargs: Any) -> Any:
            return opened(instance, args, kwargs)

        return begin_with

    @functools.wraps(original)
    def begin(
        instance: Any,
        pool: Any = None,
        capture_error_mode: str = "global",
        check_input_liveness: bool = False,
    ) -> Any:
        return opened(instance, (pool, capture_error_mode, check_input_liveness), _NO_KEYWORDS)

    return begin


def _opening(
    tracker: Tracker, original: Any, api: str
) -> Callable[[Any, tuple[Any, ...], Any], Any]:
    """The work of the hook on capture_begin: ``(instance, args, kwargs)`` as torch's own
    was called, which it then calls."""
    active, entering, fanout = tracker.active, tracker.entering, tracker.fanout

    def opened(instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
        graph = id(instance)
        held = entering.capture
        if held is None or held[0] != graph:
            record = tracker.raw_record(api, instance, args, kwargs)
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
            # Without keywords (torch's own parameters taken), spread as positions alone.
            result = original(instance, *args, **kwargs) if kwargs else original(instance, *args)
        except BaseException as exc:
            tracker.begin_failed(graph, record, previous, led=led, tokens=tokens, exc=exc)
            raise
        if led is not None:
            fanout.led[graph] = led
        if tokens:
            fanout.tokens[graph] = tokens
        return result

    return opened


def capture_end(tracker: Tracker, original: Any) -> Any:
    """CUDAGraph.capture_end, forgetting the capture once CUDA has ended it, and telling its
    watchers.

    torch's capture_end takes no argument, and its hook takes none either, which spares a
    packing of arguments at every capture; one that takes some (no release has yet) gets a
    hook that passes them through, at that cost.
    """
    if not _takes_self_alone(original):

        @functools.wraps(original)
        def capture_end_with(instance: Any, *args: Any, **kwargs: Any) -> Any:
            return _capture_end(tracker, lambda graph: original(graph, *args, **kwargs))(instance)

        return capture_end_with
    return functools.wraps(original)(_capture_end(tracker, original))


def _capture_end(tracker: Tracker, call: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The hook on capture_end, calling torch's as ``call(graph)``."""
    active, events, fanout = tracker.active, tracker.events, tracker.fanout

    def capture_end(self: Any) -> Any:
        try:
            result = call(self)
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
                    warn_once("watch:closed", f"internal error while watching a capture: {exc!r}")
        if fanout.tokens:
            tokens = fanout.tokens.pop(key, None)
            if tokens:
                close(tokens, ENDED, None)
        return result

    return capture_end


# torch's CUDAGraph.capture_begin from 2.13: its parameters, and their defaults.
_CAPTURE_BEGIN_PARAMETERS = (
    ("self", inspect.Parameter.empty),
    ("pool", None),
    ("capture_error_mode", "global"),
    ("check_input_liveness", False),
)
# What a hook that takes torch's own parameters tells its watchers of keywords: none, read-only.
_NO_KEYWORDS: Any = types.MappingProxyType({})


def _takes(function: Any, parameters: tuple[tuple[str, Any], ...]) -> bool:
    """Whether ``function`` is a Python function taking exactly ``parameters`` (name, default),
    each positional-or-keyword."""
    if type(function) is not types.FunctionType:
        return False
    try:
        found = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return (
        all(p.kind is p.POSITIONAL_OR_KEYWORD for p in found)
        and tuple((p.name, p.default) for p in found) == parameters
    )


def _takes_self_alone(function: Any) -> bool:
    """Whether ``function``, a method's plain function, takes no argument but ``self``."""
    code = getattr(function, "__code__", None)
    return (
        code is not None
        and code.co_argcount == 1
        and not code.co_kwonlyargcount
        and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    )
