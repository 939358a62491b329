"""The census's watcher: what the capture path tells the census of each capture, and of each
replay where replays are counted (cgguard._data.census keeps the counts)."""

from __future__ import annotations

from time import perf_counter
from types import FrameType
from typing import TYPE_CHECKING, Any

from cgguard._core.watcher import Watcher
from cgguard._data.census import _SITE, UNDER_WAY, kind_of
from cgguard._rules.record import API, BEGAN_AT, ENDED, FAILED, MODE, REFUSED, THREAD
from cgguard._support.frames import site_of

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType

    from cgguard._data.census import CaptureSite, Census, Entry, Memory
    from cgguard._rules.record import Record


class CensusWatcher(Watcher):
    """What the capture path tells the census: each capture's begin, end and refusal, and each
    replay where replays are counted.

    ``memory`` gives the memory probe of the capture path once torch is patched (None where
    there is nothing to ask); ``changed``, if any, is told after each capture (the report);
    ``counted`` too (the metrics); ``replayed``, if any, of each replay counted (the metrics:
    told 0 at the first capture, so that the metric shows 0 until the first replay). ``prepare``,
    if any, runs once before the first capture's clock starts: a one-time set-up that a
    watcher told after this one would otherwise pay inside that capture (inspection's). A
    plain capture (unmeasured, its replays not counted, neither report nor metrics told,
    ended) costs a comparison with the last capture's site, one list appended to its site's
    pending list and a clock reading at its begin, and the capture path's stamp at its end;
    anything else is counted as it ends, under the lock.
    """

    def __init__(
        self,
        census: Census,
        *,
        replays: bool,
        memory: Callable[[], Callable[[], Memory | None] | None],
        changed: Callable[[], None] | None = None,
        counted: Callable[[str, float, int | None], None] | None = None,
        replayed: Callable[[int], None] | None = None,
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self.census = census
        self.wants_replays = replays
        census.replays = replays
        self._memory = memory
        self._replayed = replayed if replays else None
        self._prepare = prepare
        self._probe: Any = _UNKNOWN  # the memory probe, asked for at the first capture
        # Whether a capture that reads no memory needs only its end stamped (nothing else to
        # tell), and whether every capture is such a one (nothing to read): both known at the
        # first capture.
        self._stamped = False
        self._plain = False
        self._changed = changed
        self._counted = counted
        # The last site found, as (innermost code, instruction, site), where that code is the
        # user's: a loop capturing at one line finds its site at once. One tuple, replaced
        # whole, so that a thread never reads one capture's code with another's site.
        self._last: tuple[Any, int, Any] = (None, -1, None)

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        # Every line here is on the capture path of every capture: inline, no calls but
        # where the capture is not a plain one or its site not the last capture's.
        stack: Any = record[BEGAN_AT]
        # The innermost code: a with statement's frame's, or a walked stack's first.
        code = stack[0]
        if type(code) is FrameType:
            code = code.f_code
        last = self._last
        site = last[2] if code is last[0] and stack[1] == last[1] else self._site(stack, code)
        # Its pool: None (the graph's own), or the shared pool's handle, as
        # graph_pool_handle() or another graph's pool() gave it. Looked up without a call.
        pool = args[0] if args else kwargs["pool"] if kwargs and "pool" in kwargs else None
        entry = [UNDER_WAY, record[THREAD], record[API], record[MODE], pool, site]
        census = self.census
        waiting = next(census.ticks)
        if self._plain and waiting < census.limit:
            site.pending.append(entry)  # in its site's count from now, even if it never ends
            entry[0] = -perf_counter()  # read last: the time is capture_begin's own
            return entry  # stamped as it ends (cgguard._core.watcher.Watcher)
        return self._opening(entry, graph, waiting)

    def _opening(self, entry: Entry, graph: Any, waiting: int) -> Any:
        """opening(), for a capture that is more than a plain one, or that finds the captures
        waiting to be counted at their bound: a token closed() is told of, not a stamped one."""
        probe = self._probe
        if probe is _UNKNOWN:
            if self._prepare is not None:
                self._prepare()  # before the clock: not this capture's time
            if self._replayed is not None:
                self._replayed(0)
            probe = self._probe = self._memory()
            self._stamped = (
                not self.wants_replays and self._changed is None and self._counted is None
            )
            self._plain = probe is None and self._stamped
        census = self.census
        if waiting >= census.limit:
            census.fold()  # before the clock: the fold is not the capture's time
        before = probe() if probe is not None else None
        entry[_SITE].pending.append(entry)
        entry[0] = -perf_counter()
        if before is None and self._stamped:
            return entry  # nothing measured (CUDA not initialised): stamped, as a plain one
        return (entry, before, graph if self.wants_replays else None)

    def _site(self, stack: Any, code: CodeType) -> CaptureSite:
        """The site of a capture whose innermost ``code`` and instruction are not the last
        one's; remembered when that code is the user's (its own site). A frame is never kept:
        its locals may hold tensors."""
        where = site_of(stack)
        site = self.census.site(where)
        if where[0] is code:
            self._last = (code, where[1], site)
        return site

    def closed(self, token: Any, outcome: str, error: BaseException | None) -> None:
        end = perf_counter()
        entry, before, graph = (token, None, None) if type(token) is list else token
        grown = None
        if before is not None:
            after = self._probe()
            # The same device at both ends: a capture does not switch devices.
            if after is not None and after[0] == before[0]:
                grown = (after[0], after[1] - before[1], after[2] - before[2])
        seconds = end + entry[0]  # minus the clock at its begin: not stamped
        self.census.capture(
            entry[_SITE],
            kind_of(entry),
            outcome,
            type(error).__name__ if outcome == FAILED else None,
            seconds,
            grown,
            graph if outcome == ENDED else None,
            entry,
        )
        if self._changed is not None:
            self._changed()
        if self._counted is not None:
            self._counted(outcome, seconds, grown[1] if grown is not None else None)

    def after_fork(self) -> None:
        # The census starts afresh in the child (Census.after_fork): no site of the parent's.
        self._last = (None, -1, None)

    def refused(self, record: Record) -> None:
        kind = (record[API], record[MODE], record[THREAD].name, "", None)
        census = self.census
        census.capture(census.site(site_of(record[BEGAN_AT])), kind, REFUSED, None, 0.0)
        if self._changed is not None:
            self._changed()
        if self._counted is not None:
            self._counted(REFUSED, 0.0, None)

    def replaying(self, graph: Any) -> None:
        if self.census.replayed(graph) and self._replayed is not None:
            self._replayed(1)


_UNKNOWN: Any = object()
