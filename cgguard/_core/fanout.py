"""The watchers of one installation, told of each capture (cgguard._core.watcher): the first
directly, its token kept on its own, the others in a loop.

The first is the census when the census is on: the one watcher on by default, so the one whose
cost every capture pays (docs/census.md). The capture path (cgguard._core.tracker) tells it
inline, at each capture's begin and end; everything else goes through here.
"""

from __future__ import annotations

import functools
from time import perf_counter
from typing import TYPE_CHECKING, Any

from cgguard._core.watcher import GraphNotes
from cgguard._errors import CaptureViolation, hidden_by_pytest
from cgguard._rules.record import ENDED
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from cgguard._core.watcher import Watcher
    from cgguard._rules.record import Record

# The traceback of a violation ends at the user's line (cgguard._errors.hidden_by_pytest).
__tracebackhide__ = hidden_by_pytest

# What a watcher of a capture under way keeps for it, as its opening() returned, with the
# watcher that will be told how the capture ended; and what the watchers after the first keep.
Told = tuple["Watcher", Any]
Tokens = list[Told]


class Fanout:
    """Each capture's watchers, and what each keeps for the captures under way."""

    def __init__(self, notes: GraphNotes | None = None) -> None:
        # All of them, in order; the first, told directly, and the rest, told in a loop; those
        # that watch replays. Replaced whole by set().
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

    def set(self, watchers: tuple[Watcher, ...]) -> None:
        """Follow each capture begun from now on with ``watchers``, told in that order."""
        self.watchers = watchers
        self.lead = watchers[0] if watchers else None
        self.rest = watchers[1:]
        self.replay_watchers = tuple(w for w in watchers if w.wants_replays)
        self.forgets = self.notes.note(watchers)

    def open_rest(self, graph: Any, record: Record, args: Any, kwargs: Any) -> Tokens:
        """Tell the watchers after the first that a capture into ``graph`` opens: their tokens."""
        tokens: Tokens = []
        for watcher in self.rest:
            try:
                tokens.append((watcher, watcher.opening(graph, record, args, kwargs)))
            except Exception as exc:
                warn_once("watch:open", f"internal error while watching a capture: {exc!r}")
        return tokens

    def keep(self, key: int, led: Told | None, tokens: Tokens | None) -> None:
        """The capture at ``key`` began: keep what its watchers returned until it ends."""
        if led is not None:
            self.led[key] = led
        if tokens:
            self.tokens[key] = tokens

    def closed(self, key: int, outcome: str, error: BaseException | None) -> None:
        """Tell the watchers of the capture at ``key`` that it is over, once."""
        led = self.led.pop(key, None)
        tokens = self.tokens.pop(key, None)
        if led is not None:
            close((led,), outcome, error)
        if tokens:
            close(tokens, outcome, error)

    def refused(self, record: Record) -> None:
        """A rule refused the capture attempt ``record``: every watcher is told."""
        for watcher in self.watchers:
            tell(watcher.refused, record)

    def make_replay(self, original: Any) -> Any:
        """CUDAGraph.replay, shown first to the watchers that watch replays.

        A plain function, as capture_end: a serving loop replays on every step. Put on the class
        only while some watcher wants replays (cgguard._core.installation).
        """
        fanout = self

        @functools.wraps(original)
        def replay(self: Any, *args: Any, **kwargs: Any) -> Any:
            for watcher in fanout.replay_watchers:
                try:
                    watcher.replaying(self)
                except CaptureViolation:
                    raise  # a refusal: the replay does not run
                except Exception as exc:
                    warn_once("watch:replay", f"internal error while watching a replay: {exc!r}")
            return original(self, *args, **kwargs)

        return replay

    def after_fork(self) -> None:
        """A forked child's fresh start: what the parent's captures left is not the child's."""
        self.led = {}
        self.tokens = {}
        for watcher in self.watchers:
            tell(watcher.after_fork)


def tell(method: Callable[..., object], *args: Any) -> None:
    """Call a watcher's ``method``; its failure is one warning, never the program's."""
    try:
        method(*args)
    except Exception as exc:
        warn_once("watch:" + method.__name__, f"internal error while watching a capture: {exc!r}")


def close(tokens: Iterable[Told], outcome: str, error: BaseException | None) -> None:
    """Tell each watcher how its capture came to an end: a list token of one that ENDED is
    stamped instead (cgguard._core.watcher.Watcher)."""
    # Not through tell: this runs at the end of every capture, and a call less is part of
    # what keeps a watcher's cost within the capture path's budget.
    for watcher, token in tokens:
        try:
            if outcome == ENDED and type(token) is list:
                token[0] += perf_counter()
            else:
                watcher.closed(token, outcome, error)
        except Exception as exc:
            warn_once("watch:closed", f"internal error while watching a capture: {exc!r}")
