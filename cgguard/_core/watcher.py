"""Watchers: what follows each capture from its begin to its end, and each replay, beyond the
rules that judge whether it may begin.

The capture path (cgguard._core.tracker) tells every watcher of its installation when a capture is
about to begin, when it has ended (or failed, or was abandoned), when a rule refused it, and,
for watchers that ask, when a graph is about to replay. A watcher's own failure is its own: the
tracker warns once and the capture goes on. Only a ``CaptureViolation`` a watcher raises from
``replaying`` reaches the program, as a refusal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._rules.record import Record

# What a watcher keeps on a graph for the graph's replays (cgguard._inspect.inspector): the
# capture path drops it at every capture_begin into that graph, watched or not, so that a
# replay is never judged by what an earlier capture into the same graph read.
GRAPH_NOTES: Final = "_cgguard_inputs"


class GraphNotes:
    """Whether graphs may hold a watcher's notes: until a watcher that keeps them
    (``Watcher.notes_graphs``) has watched, none does, and capture_begin skips forget_graph.
    The process's (cgguard._process), not an installation's: a graph keeps its notes across a
    reinstall."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept = False

    def note(self, watchers: tuple[Watcher, ...]) -> bool:
        """Whether graphs may hold notes, now that ``watchers`` watch."""
        self.kept = self.kept or any(w.notes_graphs for w in watchers)
        return self.kept


def forget_graph(graph: Any) -> None:
    """Drop what a watcher kept on ``graph`` for an earlier capture into it (one look-up)."""
    notes = getattr(graph, "__dict__", None)
    if notes and GRAPH_NOTES in notes:
        del notes[GRAPH_NOTES]


class Watcher:
    """The base of every watcher: each method does nothing, so a watcher defines what it needs.

    ``opening`` runs on the capturing thread just before torch's capture_begin, and returns
    what the watcher keeps for that capture (its token); ``closed`` gets the token back once,
    whichever way the capture ends, on the thread that ended it.

    A token that is a ``list`` is stamped instead: when its capture ends (ENDED), the capture
    path adds ``time.perf_counter()``, read as torch's capture_end returns, to its first item,
    and ``closed`` is not called; any other ending is told to ``closed`` as usual. It is for a
    watcher that only needs to know how long a capture took: one that puts minus the time of
    its begin there finds the capture's seconds there once it has ended, and a negative number
    while it is under way, at the cost of one addition (the first item: CPython specialises a
    subscript at a non-negative index, not one at -1).
    """

    # Whether the installation hooks CUDAGraph.replay for this watcher: off, replay is left as
    # torch has it, since it runs on every step of a serving loop.
    wants_replays: bool = False
    # Whether this watcher keeps notes on graphs (GRAPH_NOTES): once one has, the capture path
    # drops them at every capture_begin (forget_graph).
    notes_graphs: bool = False
    # Modules the program may import later whose attributes hooks() names once they are: the
    # installation asks for the hooks again as each is imported (never importing one itself).
    hook_modules: tuple[str, ...] = ()

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        """A capture into ``graph`` is about to begin, called with ``args`` and ``kwargs``."""
        return None

    def closed(self, token: Any, outcome: str, error: BaseException | None) -> None:
        """The capture ``token`` was returned for is over: ``outcome`` is ENDED, FAILED (with
        torch's ``error``) or ABANDONED."""

    def refused(self, record: Record) -> None:
        """A rule refused the capture attempt ``record``: it never began."""

    def replaying(self, graph: Any) -> None:
        """``graph`` is about to replay (only for a watcher that ``wants_replays``). Raise a
        CaptureViolation to refuse the replay."""

    def started(self) -> None:
        """This watcher follows captures from now on, the one it replaced retired: what it
        puts on besides its hooks goes on here."""

    def retired(self) -> None:
        """A reconfiguration replaced this watcher, or uninstall() ended it: the captures it
        watches that are still under way get no more from it than ``closed``."""

    def after_fork(self) -> None:
        """A forked child's fresh start: what the parent watched is not the child's."""

    def hooks(self) -> list[tuple[Any, str, Callable[[Any], Any]]]:
        """Torch attributes this watcher wraps while it is installed, as (owner, name, make):
        put on once torch is patched, and again as each module of ``hook_modules`` is
        imported; taken off with the watcher (cgguard._core.installation)."""
        return []
