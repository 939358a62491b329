"""The capture census: every capture counted, timed and weighed at its site, and torch.compile's
skipped cudagraphs counted by reason and site.

A ``Census`` keeps one aggregate per site (the user's frame, as violations are sited), not one
record per capture, so a process with a hundred thousand captures at one place keeps one entry.
It belongs to the run (cgguard._ledger.Run): kept across reconfiguration, and started afresh in
a forked child. ``CensusWatcher`` is what the capture path tells (cgguard._watch): it reads the
clock and, on a device, the allocator's statistics once at each end of a capture, and does the
rest of its work after the capture has ended.
"""

from __future__ import annotations

import collections
import re
import threading
import weakref
from time import perf_counter
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from cgguard._checks import API, BEGAN_AT, MODE, THREAD
from cgguard._frames import frame_at, innermost_visible, walk
from cgguard._watch import ABANDONED, ENDED, FAILED, OUTCOMES, Watcher

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType

    from cgguard._checks import Record
    from cgguard._frames import FrameInfo
    from cgguard._schema import CaptureEntry, SkipEntry

    # What the allocator says of the current device: (its index, reserved bytes, allocated
    # bytes); None where there is no allocator to ask (the simulated runtime, a CPU build).
    Memory = tuple[int, int, int]

# A capture as the census counts it: (api, mode, thread name, pool, device or None).
Kind = tuple[str, str, str, str, "str | None"]
# A capture ended and not yet folded: (where, kind, outcome, error type, seconds, growth,
# graph); one begun is (where,) in the same queue, before its end.
Ended = (
    tuple[
        "tuple[CodeType | None, int]",
        Kind,
        str,
        "str | None",
        float,
        "tuple[int, int, int] | None",
        Any,
    ]
    | tuple["tuple[CodeType | None, int]"]
)

REFUSED = OUTCOMES[2]

# A site keeps at most this many distinct (api, mode, thread, pool, device) combinations; the
# rest are counted under "other", so that a pool of threads with fresh names stays bounded.
KINDS_MAX = 64
OTHER = "other"
# At most this many distinct torch.compile skips (reason, site) are kept, and this much of each
# full message: a message carries a stack trace of the user's code.
SKIPS_MAX = 1024
EXAMPLE_MAX = 2000
# The words torch puts before every reason it gives.
SKIP_PREFIX = "skipping cudagraphs due to "


def pool_name(pool: object) -> str:
    """A capture's memory pool as the census names it: "private" (the graph's own) or the
    shared pool's handle, as ``graph_pool_handle()`` or another graph's ``pool()`` gave it."""
    return "private" if pool is None else f"shared {pool!r}"


class CaptureSite:
    """What the captures begun at one place came to."""

    __slots__ = (
        "_top",
        "built",
        "bytes_allocated",
        "bytes_reserved",
        "code",
        "count",
        "entry",
        "errors",
        "graphs_replayed",
        "graphs_tracked",
        "kinds",
        "lasti",
        "max_seconds",
        "outcomes",
        "replays",
        "seconds",
        "version",
    )

    def __init__(self, code: CodeType | None, lasti: int) -> None:
        self.code = code  # held: the key is its id()
        self.lasti = lasti
        self._top: list[FrameInfo | None] = []  # rendered once, when first asked
        # The report's entry as last built, and the values it was built from: a report rewrite
        # takes it as it was while they hold (cgguard._report_file encodes it once).
        self.entry: CaptureEntry | None = None
        self.version = 0  # counts each change, so that an unchanged site is not copied
        self.built = -1  # the version its entry was built from
        self.count = 0
        self.seconds = 0.0
        self.max_seconds = 0.0
        self.bytes_reserved: int | None = None  # None until a capture here was measured
        self.bytes_allocated: int | None = None
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.errors: dict[str, int] = {}  # failed captures by the error's type
        # (api, mode, thread name, pool, device) -> captures.
        self.kinds: dict[Kind, int] = {}
        self.replays = 0
        # Graphs captured here while replays were counted, and those of them replayed at least
        # once: a graph captured before replays were counted is in neither.
        self.graphs_tracked = 0
        self.graphs_replayed = 0

    def frame(self) -> FrameInfo | None:
        """The site's user frame, rendered once."""
        if not self._top:
            self._top.append(frame_at(self.code, self.lasti))
        return self._top[0]


class _Skip:
    __slots__ = ("code", "count", "example", "lasti", "reason", "top")

    def __init__(self, reason: str, example: str, code: CodeType | None, lasti: int) -> None:
        self.reason = reason
        self.example = example
        self.code = code
        self.lasti = lasti
        self.count = 0
        self.top: list[FrameInfo | None] = []  # rendered once, when first asked


class Census:
    """Captures and torch.compile's skipped cudagraphs, per site. Thread-safe.

    The capture path only appends each ended capture to a bounded queue (``ended``); it is
    folded into the sites' aggregates by whoever reads them (the report's writer, the summary,
    census()), or by the capture that finds the queue full. ``replays`` says whether replays
    are counted (the census speaks of them only then).
    """

    def __init__(self) -> None:
        self._fresh()

    def _fresh(self) -> None:
        # Everything made here and nowhere else: a forked child starts from a state no parent
        # thread can hold a lock of.
        self._lock = threading.Lock()
        self._sites: dict[tuple[int, int], CaptureSite] = {}
        self._skips: dict[tuple[str, int, int], _Skip] = {}
        # The site of each graph captured while replays are counted, and whether it has been
        # replayed; weak, so an entry goes with its graph.
        self._graphs: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        # Captures ended and not yet folded, as Ended tuples: a deque, whose append and
        # popleft are atomic, so no capture is lost to a fold running on another thread.
        self.ended: collections.deque[Ended] = collections.deque()
        self.replays = False

    def after_fork(self) -> None:
        """A forked child's census starts empty: what the parent captured is the parent's."""
        self._fresh()

    def __len__(self) -> int:
        """How many capture sites have been seen."""
        self.fold()
        return len(self._sites)

    def seen(self) -> bool:
        """Whether anything was counted: a capture or a skipped compiled graph."""
        return bool(self.ended or self._sites or self._skips)

    def fold(self) -> None:
        """Count the captures ended since the last fold into their sites.

        One loop, with the look-up of each site and the counts of a plain ended capture inline:
        it runs once per capture, and a method call per entry would double its cost.
        """
        ended = self.ended
        if not ended:
            return
        with self._lock:
            sites = self._sites
            popleft = ended.popleft
            while True:
                try:
                    item = popleft()
                except IndexError:
                    break
                where = item[0]
                key = (id(where[0]), where[1])
                site = sites.get(key)
                if site is None:
                    site = sites[key] = CaptureSite(where[0], where[1])
                site.version += 1
                if len(item) == 1:
                    # A capture is in its site's count from its begin: one still open when the
                    # census is read is counted, in no outcome yet.
                    site.count += 1
                    continue
                _, kind, outcome, error, seconds, grown, graph = item
                kinds = site.kinds
                # The common case: ended, unmeasured, of a kind seen here before.
                if outcome == ENDED and grown is None and graph is None and kind in kinds:
                    site.outcomes[ENDED] += 1
                    site.seconds += seconds
                    if seconds > site.max_seconds:  # noqa: PLR1730 - no call: once per capture
                        site.max_seconds = seconds
                    kinds[kind] += 1
                else:
                    self._tally(site, kind, outcome, error, seconds, grown, graph)

    def capture(  # noqa: PLR0917 - the fold's own call: positional costs least
        self,
        where: tuple[CodeType | None, int],
        kind: Kind,
        outcome: str,
        error: str | None,
        seconds: float,
        grown: tuple[int, int, int] | None = None,
        graph: Any = None,
    ) -> None:
        """Count one capture at ``where`` (the user's code and instruction), as it ended.

        ``kind``: (api, mode, thread name, pool, device); ``error``: a failed capture's error
        type; ``grown``: (device, reserved growth, allocated growth), where measured;
        ``graph``: the graph of an ended capture, while replays are counted.
        """
        with self._lock:
            site = self._site(where)
            site.count += 1  # a refused capture never began: counted here, not at its begin
            self._tally(site, kind, outcome, error, seconds, grown, graph)

    def _site(self, where: tuple[CodeType | None, int]) -> CaptureSite:
        code, lasti = where
        key = (id(code), lasti)
        site = self._sites.get(key)
        if site is None:
            site = self._sites[key] = CaptureSite(code, lasti)
        site.version += 1
        return site

    def _tally(  # noqa: PLR0917 - run per capture in the fold's loop
        self,
        site: CaptureSite,
        kind: Kind,
        outcome: str,
        error: str | None,
        seconds: float,
        grown: tuple[int, int, int] | None,
        graph: Any,
    ) -> None:
        """Count one capture that has come to ``outcome`` into ``site``, whose count holds it."""
        site.outcomes[outcome] += 1
        if outcome not in (ABANDONED, REFUSED):
            # An abandoned capture's time is only how long cgguard took to notice.
            site.seconds += seconds
            site.max_seconds = max(site.max_seconds, seconds)
        if error is not None:
            site.errors[error] = site.errors.get(error, 0) + 1
        if grown is not None:
            kind = (*kind[:4], f"cuda:{grown[0]}")
            site.bytes_reserved = (site.bytes_reserved or 0) + grown[1]
            site.bytes_allocated = (site.bytes_allocated or 0) + grown[2]
        kinds = site.kinds
        if kind not in kinds and len(kinds) >= KINDS_MAX:
            kind = (OTHER, OTHER, OTHER, OTHER, None)
        kinds[kind] = kinds.get(kind, 0) + 1
        if graph is not None:
            site.graphs_tracked += 1
            self._graphs[graph] = [site, False]

    def replayed(self, graph: Any) -> None:
        """Count one replay of ``graph``, if it was captured while replays were counted."""
        if self.ended:
            self.fold()  # its capture may not be folded yet
        with self._lock:
            entry = self._graphs.get(graph)
            if entry is None:
                return
            site = entry[0]
            site.replays += 1
            site.version += 1
            if not entry[1]:
                entry[1] = True
                site.graphs_replayed += 1

    def skipped(self, message: str, where: tuple[CodeType | None, int]) -> bool:
        """Count one cudagraph torch.compile skipped, with torch's ``message``, at the user's
        call ``where``; whether it was counted (the distinct skips kept are bounded)."""
        reason = skip_reason(message)
        code, lasti = where
        key = (reason, id(code), lasti)
        with self._lock:
            skip = self._skips.get(key)
            if skip is None:
                if len(self._skips) >= SKIPS_MAX:
                    return False
                example = message.strip()[:EXAMPLE_MAX]
                skip = self._skips[key] = _Skip(reason, example, code, lasti)
            skip.count += 1
        return True

    def sites(self) -> list[CaptureSite]:
        self.fold()
        with self._lock:
            return list(self._sites.values())

    def captures(self, *, fresh: bool = False) -> list[CaptureEntry]:
        """The report's ``captures``: one entry per site, in the order first seen.

        A site's entry is the one built last time while its values are unchanged (the report's
        rewrite encodes it once), unless ``fresh``: new values for a caller to keep.
        """
        self.fold()
        with self._lock:
            # Only the sites changed since their entry was built are copied: a report of
            # thousands of sites is rewritten while new ones come.
            sites = [
                (site, site.version, None if _built(site, fresh) else _copy(site))
                for site in self._sites.values()
            ]
            replays = self.replays
        out = []
        for site, version, values in sites:
            built = site.entry
            if values is not None or built is None:
                built = entry(site.frame(), values or _copy(site), replays=replays)
                if not fresh:
                    site.entry, site.built = built, version
            out.append(built)
        return out

    def skips(self) -> list[SkipEntry]:
        """The report's ``cudagraph_skips``: one entry per reason and site."""
        with self._lock:
            skips = [(s, s.count) for s in self._skips.values()]
        out: list[SkipEntry] = []
        for skip, count in skips:
            if not skip.top:
                skip.top.append(frame_at(skip.code, skip.lasti))
            top = skip.top[0]
            out.append(
                {
                    "reason": skip.reason,
                    "count": count,
                    "example": skip.example,
                    "file": top["file"] if top else None,
                    "line": top["line"] if top else None,
                    "function": top["function"] if top else None,
                }
            )
        return out


def _built(site: CaptureSite, fresh: bool) -> bool:
    """Whether ``site``'s entry, as last built, holds its values now."""
    return not fresh and site.entry is not None and site.built == site.version


def _copy(site: CaptureSite) -> dict[str, Any]:
    """A site's values at one moment, taken under the census's lock."""
    return {
        "count": site.count,
        "seconds": site.seconds,
        "max_seconds": site.max_seconds,
        "bytes_reserved": site.bytes_reserved,
        "bytes_allocated": site.bytes_allocated,
        "outcomes": dict(site.outcomes),
        "errors": dict(site.errors),
        "kinds": dict(site.kinds),
        "replays": site.replays,
        "graphs_replayed": site.graphs_replayed,
        "graphs_tracked": site.graphs_tracked,
    }


def entry(top: FrameInfo | None, values: dict[str, Any], *, replays: bool) -> CaptureEntry:
    """One site's entry of the report's ``captures``, from its values."""
    kinds: dict[Kind, int] = values["kinds"]
    by: list[dict[str, int]] = [{}, {}, {}, {}, {}]
    for kind, count in kinds.items():
        for i, value in enumerate(kind):
            if value:  # a refused capture has no pool, a simulated one no device
                by[i][value] = by[i].get(value, 0) + count
    result: dict[str, object] = {
        "file": top["file"] if top else None,
        "line": top["line"] if top else None,
        "function": top["function"] if top else None,
        "count": values["count"],
        "seconds": round(values["seconds"], 9),
        "max_seconds": round(values["max_seconds"], 9),
        "bytes_reserved": values["bytes_reserved"],
        "bytes_allocated": values["bytes_allocated"],
        "outcomes": values["outcomes"],
        "errors": values["errors"],
        "apis": by[0],
        "modes": by[1],
        "threads": by[2],
        "pools": by[3],
        "devices": by[4] or None,
    }
    if replays:
        result["replays"] = values["replays"]
        result["never_replayed"] = values["graphs_tracked"] - values["graphs_replayed"]
    return cast("CaptureEntry", result)


# A node's or an op's name in parentheses, "(arg0_1)", "(2 instances)", "(=8)"; and a number.
_PARENTHESES = re.compile(r"\s*\([^()]*\)")
_NUMBER = re.compile(r"\d+")


def skip_reason(message: str) -> str:
    """The reason of torch's "skipping cudagraphs due to REASON", grouped: without the stack
    trace torch appends ("Found from"), names in parentheses, what follows a colon (the devices
    or nodes it lists) and numbers, so that one cause at many nodes is one reason."""
    text = message.strip()
    while text.startswith(SKIP_PREFIX):  # torch repeats it for a reason it formatted itself
        text = text[len(SKIP_PREFIX) :]
    text = text.split(". Found from", 1)[0]
    text = _PARENTHESES.sub("", text)
    text = text.split(":", 1)[0]
    text = _NUMBER.sub("N", text)
    return " ".join(text.split()).rstrip(" .,") or "unknown"


def site_of(stack: Any) -> tuple[CodeType | None, int]:
    """The user's frame of a capture record's stack: (code, instruction).

    A ``with`` statement's frame is the user's, as a rule: then nothing is walked. One in
    hidden code (torch's own ``with torch.cuda.graph``) is walked outwards, while it runs.
    """
    if len(stack) == 2 and type(stack[0]) is FrameType:
        frame = stack[0]
        found = innermost_visible((frame.f_code, stack[1]))
        if found[0] is not None:
            return found
        return innermost_visible(walk(stack))
    return innermost_visible(stack)


class CensusWatcher(Watcher):
    """What the capture path tells the census: each capture's begin, end and refusal, and each
    replay where replays are counted.

    ``memory`` gives the memory probe of the capture path once torch is patched (None where
    there is nothing to ask); ``changed``, if any, is told after each capture (the report);
    ``counted`` too (the metrics). Each capture costs two clock readings, a look-up of its
    frame's code, three tuples and two appends: the census is folded where it is read.
    """

    def __init__(
        self,
        census: Census,
        *,
        replays: bool,
        memory: Callable[[], Callable[[], Memory | None] | None],
        changed: Callable[[], None] | None = None,
        counted: Callable[[str, float, int | None], None] | None = None,
    ) -> None:
        self.census = census
        self.wants_replays = replays
        census.replays = replays
        self._memory = memory
        self._probe: Any = _UNKNOWN  # the memory probe, asked for at the first capture
        self._changed = changed
        self._counted = counted
        # Whether each code object seen is the user's (by id(), holding the code object).
        self._visible: dict[int, tuple[CodeType, bool]] = {}

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        stack = record[BEGAN_AT]
        where: tuple[CodeType | None, int]
        if len(stack) == 2 and type(stack[0]) is FrameType:
            # A with statement's frame: the user's, as a rule. The frame itself is not kept:
            # its locals may hold tensors.
            code = stack[0].f_code
            seen = self._visible.get(id(code))
            if seen is None:
                if len(self._visible) >= _CODES_MAX:
                    self._visible.clear()
                seen = self._visible[id(code)] = (code, _is_visible(code))
            where = (code, stack[1]) if seen[1] else site_of(stack)
        else:
            where = innermost_visible(stack)
        probe = self._probe
        if probe is _UNKNOWN:
            probe = self._probe = self._memory()
        before = probe() if probe is not None else None
        self.census.ended.append((where,))  # counted from its begin, even if never ended
        # Read last: the time is capture_begin's own, and the statistics' read is not in it.
        return (where, record, args, kwargs, graph, probe, before, perf_counter())

    def closed(self, token: Any, outcome: str, error: BaseException | None) -> None:
        end = perf_counter()
        where, record, args, kwargs, graph, probe, before, began = token
        grown = None
        if before is not None:
            after = probe()
            # The same device at both ends: a capture does not switch devices.
            if after is not None and after[0] == before[0]:
                grown = (after[0], after[1] - before[1], after[2] - before[2])
        pool = args[0] if args else kwargs.get("pool") if kwargs else None
        # pool_name(), inline: this runs at the end of every capture.
        named = "private" if pool is None else f"shared {pool!r}"
        kind = (record[API], record[MODE], record[THREAD].name, named, None)
        census = self.census
        census.ended.append(
            (
                where,
                kind,
                outcome,
                type(error).__name__ if outcome == FAILED else None,
                end - began,
                grown,
                graph if self.wants_replays and outcome == ENDED else None,
            )
        )
        if len(census.ended) >= ENDED_MAX:
            census.fold()
        if self._changed is not None:
            self._changed()
        if self._counted is not None:
            self._counted(outcome, end - began, grown[1] if grown is not None else None)

    def refused(self, record: Record) -> None:
        kind = (record[API], record[MODE], record[THREAD].name, "", None)
        self.census.capture(site_of(record[BEGAN_AT]), kind, REFUSED, None, 0.0)
        if self._changed is not None:
            self._changed()
        if self._counted is not None:
            self._counted(REFUSED, 0.0, None)

    def replaying(self, graph: Any) -> None:
        self.census.replayed(graph)


_UNKNOWN: Any = object()
# The most captures waiting to be folded, and of code objects remembered: bounded, so that a
# process whose census is never read, or whose code is made at run time, stays bounded.
ENDED_MAX = 1024
_CODES_MAX = 4096


def _is_visible(code: CodeType) -> bool:
    return innermost_visible((code, 0))[0] is not None
