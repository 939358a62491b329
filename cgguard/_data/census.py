"""The capture census: every capture counted, timed and weighed at its site, and torch.compile's
skipped cudagraphs counted by reason and site.

A ``Census`` keeps one aggregate per site (the user's frame, as violations are sited), not one
record per capture, so a process with a hundred thousand captures at one place keeps one entry.
It belongs to the run (cgguard._data.ledger.Run): kept across reconfiguration, and started afresh in
a forked child. ``CensusWatcher`` is what the capture path tells (cgguard._core.watcher). A plain
capture (unmeasured, its replays not counted) costs the capture path one list appended to its
site's ``pending`` list at its begin, and the clock added to it at its end; the counting is
done a batch at a time, in C where it can be, by whoever reads the census. A capture on a
device also reads the allocator's statistics once at each end, and is counted as it ends.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
import weakref
from collections import Counter
from typing import TYPE_CHECKING, Any, cast

from cgguard._data.site import Site
from cgguard._rules.record import (
    ABANDONED,
    ENDED,
    OUTCOMES,
    REFUSED,
)
from cgguard._support.frames import frame_of, held_weakly, place_of

if TYPE_CHECKING:
    from types import CodeType

    from cgguard._data.schema import CaptureEntry, SkipEntry
    from cgguard._support.frames import FrameInfo, Place

    # What the allocator says of the current device: (its index, reserved bytes, allocated
    # bytes); None where there is no allocator to ask (a CPU build, CUDA not initialised).
    Memory = tuple[int, int, int]

# A capture as the census counts it: (api, mode, thread name, pool, device or None).
Kind = tuple[str, str, str, str, "str | None"]
# A capture as the capture path notes it at its begin, in its site's pending list:
# [seconds, thread, api, mode, pool, site]: ``thread``, ``api`` and ``mode`` as its record has
# them, ``pool`` as capture_begin was given it (None: the graph's own), made into its Kind only
# when it is counted, a batch at a time, where a column of one value is found by identity
# alone. A list, so that the capture path adds the clock at its end to its first item
# (cgguard._core.watcher.Watcher), without a lock or a call: ``seconds`` is minus the clock at its
# begin until then, so negative while it is under way (perf_counter() reads above 0), and its
# seconds once it has ended. It is UNDER_WAY from the moment the entry is in its list: a fold
# may read it before the clock is.
Entry = list[Any]
_SITE = 5
UNDER_WAY = -1.0

# A site keeps at most this many distinct (api, mode, thread, pool, device) combinations; the
# rest are counted under "other", so that a pool of threads with fresh names stays bounded.
KINDS_MAX = 64
OTHER = "other"
# At most this many sites are kept, each a place in the user's code; captures at any other are
# counted at one more, "other sites", so that code compiled per request, notebook cells or
# ``exec`` stay bounded.
SITES_MAX = 4096
# At most this many distinct torch.compile skips (reason, site) are kept, and this much of each
# full message: a message carries a stack trace of the user's code.
SKIPS_MAX = 1024
EXAMPLE_MAX = 2000
# The words torch puts before every reason it gives.
SKIP_PREFIX = "skipping cudagraphs due to "


class CaptureSite(Site):
    """What the captures begun at one place came to: the place by value (file, line and
    function), not the code, which a census would otherwise keep alive."""

    __slots__ = (
        "built",
        "bytes_allocated",
        "bytes_reserved",
        "count",
        "entry",
        "errors",
        "graphs_replayed",
        "graphs_tracked",
        "kinds",
        "max_seconds",
        "open",
        "outcomes",
        "pending",
        "place",
        "replays",
        "seconds",
        "sites",
        "version",
    )

    def __init__(self, place: Place | None, *, other: bool = False) -> None:
        super().__init__(None, -1)
        self.place = place  # None: no frame of the user's; or the other sites
        # The other sites (past SITES_MAX): how many places this one counts for; else None.
        self.sites: int | None = 0 if other else None
        # The report's entry as last built, and the values it was built from: a report rewrite
        # takes it as it was while they hold (cgguard._reporting.report_file encodes it once).
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
        # The captures begun here and not yet counted, as Entry lists (see CensusWatcher):
        # list.append is atomic, so the capture path takes no lock, and Census.fold counts
        # those that have ended a batch at a time. Those still under way, as the last fold
        # found them: in the count, in no outcome.
        self.pending: list[Entry] = []
        self.open = 0
        self.replays = 0
        # Graphs captured here while replays were counted, and those of them replayed at least
        # once: a graph captured before replays were counted is in neither.
        self.graphs_tracked = 0
        self.graphs_replayed = 0

    def _render(self) -> FrameInfo | None:
        return None if self.sites is not None else frame_of(self.place)


class SkipSite(Site):
    """The cudagraphs torch.compile skipped for one reason, at one place."""

    __slots__ = ("count", "example", "reason")

    def __init__(self, reason: str, example: str, code: CodeType | None, lasti: int) -> None:
        super().__init__(code, lasti)
        self.reason = reason
        self.example = example  # torch's whole message, once
        self.count = 0


class Census:
    """Captures and torch.compile's skipped cudagraphs, per site. Thread-safe.

    The capture path appends each capture's entry to its site's ``pending`` list at its begin,
    and adds the clock to a plain capture's entry at its end, without a lock; what has ended is
    counted into the site's aggregate by whoever reads the census (the report's writer, the
    summary, census()), or by the capture that finds the list full. Anything but a plain end is
    counted at once, under the lock. ``replays`` says whether replays are counted (the census
    speaks of them only then).
    """

    def __init__(self) -> None:
        self._fresh()

    def _fresh(self) -> None:
        # Everything made here and nowhere else: a forked child starts from a state no parent
        # thread can hold a lock of.
        self._lock = threading.Lock()
        # The site of a (id() of the code, instruction), read without the lock by the capture
        # path, added to under it. The code is held weakly, and its keys leave with it, before
        # its id() can be another's (self._codes): they are never iterated.
        self.sites_at: dict[tuple[int, int], CaptureSite] = {}
        # Per code that keys sites_at, by id(): its weak reference and its keys.
        self._codes: dict[int, tuple[weakref.ref[CodeType], list[tuple[int, int]]]] = {}
        # The sites, by place, in the order first seen, and the one counting the places past
        # SITES_MAX.
        self._places: dict[Place | None, CaptureSite] = {}
        self._other: CaptureSite | None = None
        self._skips: dict[tuple[str, int, int], SkipSite] = {}
        # The site of each graph captured while replays are counted, and whether it has been
        # replayed; weak, so an entry goes with its graph.
        self._graphs: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        self.replays = False
        # Numbers the captures begun since the last fold, across all sites, after those still
        # under way then: without a lock, so an estimate, which is all a bound needs. A capture
        # numbered ``limit`` folds every site first: more than PENDING_MAX wait only while that
        # many captures are under way at once.
        self.ticks = itertools.count(1)
        self.limit = PENDING_MAX

    def after_fork(self) -> None:
        """A forked child's census starts empty: what the parent captured is the parent's."""
        self._fresh()

    def __len__(self) -> int:
        """How many capture sites have been seen, those counted as other sites included."""
        other = self._other
        if other is None:
            return len(self._places)
        return len(self._places) - 1 + (other.sites or 0)  # the other sites are one place

    def seen(self) -> bool:
        """Whether anything was counted: a capture or a skipped compiled graph."""
        return bool(self._places or self._skips)

    def site(self, where: tuple[CodeType | None, int]) -> CaptureSite:
        """The site at ``where`` (the user's code and instruction), made on its first capture
        there: its place's, or past SITES_MAX places the other sites'."""
        code, lasti = where
        key = (id(code), lasti)
        site = self.sites_at.get(key)
        if site is None:
            with self._lock:
                site = self.sites_at.get(key)
                if site is None:
                    site = self._site_at(code, lasti, key)
        return site

    def _site_at(self, code: CodeType | None, lasti: int, key: tuple[int, int]) -> CaptureSite:
        place = place_of(code, lasti)
        site = self._places.get(place)
        if site is None and len(self._places) < SITES_MAX:
            site = self._places[place] = CaptureSite(place)
        elif site is None:
            site = self._other
            if site is None:
                site = self._other = CaptureSite(None, other=True)
                self._places[_OTHER] = site
            site.sites = (site.sites or 0) + 1
            site.version += 1
        if code is not None:
            held = self._codes.get(id(code))
            if held is None:
                gone = functools.partial(_drop_keys, self.sites_at)
                held = self._codes[id(code)] = (held_weakly(self._codes, code, gone), [])
            held[1].append(key)
        self.sites_at[key] = site
        return site

    def fold(self) -> None:
        """Count the captures ended since the last fold into their sites."""
        with self._lock:
            self._fold()

    def _fold(self) -> None:
        still = 0
        for site in self._places.values():
            if site.pending or site.open:  # open: one may have ended and been counted
                still += _drain(site)
        self.ticks = itertools.count(still + 1)
        self.limit = max(PENDING_MAX, 2 * still)

    def capture(  # noqa: PLR0917 - once per capture: positional costs least
        self,
        site: CaptureSite,
        kind: Kind,
        outcome: str,
        error: str | None,
        seconds: float,
        grown: tuple[int, int, int] | None = None,
        graph: Any = None,
        entry: Entry | None = None,
    ) -> None:
        """Count one capture at ``site`` that came to ``outcome``, at once.

        ``kind``: (api, mode, thread name, pool, device); ``error``: a failed capture's error
        type; ``grown``: (device, reserved growth, allocated growth), where measured;
        ``graph``: the graph of an ended capture, while replays are counted; ``entry``: the
        capture's entry in the site's pending list, where it began.
        """
        with self._lock:
            if entry is not None:
                _remove(site.pending, entry)
            site.count += 1
            site.version += 1
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
            _add_kind(site, kind, 1)
            if graph is not None:
                site.graphs_tracked += 1
                self._graphs[graph] = [site, False]

    def replayed(self, graph: Any) -> bool:
        """Count one replay of ``graph``, if it was captured while replays were counted;
        whether it was."""
        with self._lock:
            entry = self._graphs.get(graph)
            if entry is None:
                return False
            site = entry[0]
            site.replays += 1
            site.version += 1
            if not entry[1]:
                entry[1] = True
                site.graphs_replayed += 1
        return True

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
                skip = self._skips[key] = SkipSite(reason, example, code, lasti)
            skip.count += 1
        return True

    def sites(self) -> list[CaptureSite]:
        with self._lock:
            self._fold()
            return list(self._places.values())

    def captures(self, *, fresh: bool = False) -> list[CaptureEntry]:
        """The report's ``captures``: one entry per site, in the order first seen.

        A site's entry is the one built last time while its values are unchanged (the report's
        rewrite encodes it once), unless ``fresh``: new values for a caller to keep.
        """
        with self._lock:
            # Folded and copied under one hold: a capture counted open by the fold and ended
            # before the copy would be in both its count and its open ones.
            self._fold()
            # Only the sites changed since their entry was built are copied: a report of
            # thousands of sites is rewritten while new ones come.
            sites = [
                (site, site.version, None if _built(site, fresh) else _copy(site))
                for site in self._places.values()
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
            top = skip.frame()
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


# The key of the other sites among the places: no place is at line -1.
_OTHER: Place = ("", -1, "other sites")


def _drop_keys(
    sites_at: dict[tuple[int, int], CaptureSite],
    held: tuple[weakref.ref[CodeType], list[tuple[int, int]]],
) -> None:
    """A code object that keyed sites is gone: its keys go, before its id() is another's. Run
    by the garbage collector on any thread, so without the census's lock: each is one dict
    operation, and nothing iterates these dicts."""
    for key in held[1]:
        sites_at.pop(key, None)


def _built(site: CaptureSite, fresh: bool) -> bool:
    """Whether ``site``'s entry, as last built, holds its values now."""
    return not fresh and site.entry is not None and site.built == site.version


def _drain(site: CaptureSite) -> int:
    """Count the entries of ``site``'s pending list that have ended into its aggregate, under
    the census's lock; keep those still under way.

    A batch at a time, its columns read, summed and counted in C: with the capture path's
    append and one addition, this is the census's whole cost per plain capture. Only the lock's
    holder removes from the list, and the capture path only appends to its end, so the first
    ``n`` are this batch whatever is added meanwhile.
    """
    pending = site.pending
    n = len(pending)
    batch = pending[:n]
    del pending[:n]
    # Its columns, in one pass: seconds (negative: under way), thread, api, mode, pool, site.
    columns = list(zip(*batch, strict=True))
    still = 0
    if batch and min(columns[0]) < 0.0:  # some still under way: back they go
        # Split by the seconds as read once: one stamped since is kept, and counted next time.
        split: tuple[list[Entry], list[Entry]] = ([], [])
        for each, seconds in zip(batch, columns[0], strict=True):
            split[seconds < 0.0].append(each)
        batch, kept = split
        pending.extend(kept)
        still = len(kept)
        columns = list(zip(*batch, strict=True))
    if still != site.open:
        site.open = still
        site.version += 1
    if not batch:
        return still
    seconds = columns[0]
    n = len(batch)
    site.count += n
    site.version += 1
    site.outcomes[ENDED] += n
    site.seconds += sum(seconds)
    longest = max(seconds)
    site.max_seconds = max(site.max_seconds, longest)
    # One kind, as a rule: each of its columns one object, found so without a comparison.
    if all(column.count(column[0]) == n for column in columns[1:5]):
        _add_kind(site, kind_of(batch[0]), n)
    else:
        for kind, times in Counter(map(kind_of, batch)).items():
            _add_kind(site, kind, times)
    return still


def kind_of(entry: Entry) -> Kind:
    """The Kind of a capture's entry. Its thread, a ThreadRef, is made into its name before
    anything is hashed: a reference to an ended thread has no hash."""
    thread, api, mode, pool = entry[1:5]
    return (api, mode, thread.name, "private" if pool is None else f"shared {pool!r}", None)


def _remove(pending: list[Entry], entry: Entry) -> None:
    """Take ``entry`` itself out of ``pending`` (two entries may be equal), if it is there."""
    for i, each in enumerate(pending):
        if each is entry:
            del pending[i]
            return


def _add_kind(site: CaptureSite, kind: Kind, count: int) -> None:
    """Count ``count`` captures of ``kind`` at ``site``: past KINDS_MAX kinds, as "other"."""
    kinds = site.kinds
    if kind not in kinds and len(kinds) >= KINDS_MAX:
        kind = (OTHER, OTHER, OTHER, OTHER, None)
    kinds[kind] = kinds.get(kind, 0) + count


def _copy(site: CaptureSite) -> dict[str, Any]:
    """A site's values at one moment, taken under the census's lock: its count holds the
    captures still under way there."""
    return {
        "count": site.count + site.open,
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
        "other_sites": site.sites,
    }


def entry(top: FrameInfo | None, values: dict[str, Any], *, replays: bool) -> CaptureEntry:
    """One site's entry of the report's ``captures``, from its values."""
    kinds: dict[Kind, int] = values["kinds"]
    by: list[dict[str, int]] = [{}, {}, {}, {}, {}]
    for kind, count in kinds.items():
        for i, value in enumerate(kind):
            if value:  # a refused capture has no pool, and one never measured no device
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
    if values.get("other_sites") is not None:
        result["other_sites"] = values["other_sites"]
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
    # "Found from" follows a reason after ". " or, for an incompatible op
    # (torch/_inductor/compile_fx.py), after a space alone.
    text = text.split("Found from", 1)[0]
    text = _PARENTHESES.sub("", text)
    text = text.split(":", 1)[0]
    text = _NUMBER.sub("N", text)
    return " ".join(text.split()).rstrip(" .,") or "unknown"


# The most captures waiting to be counted, across all sites: bounded, so that a process whose
# census is never read stays bounded, however many sites it captures at.
PENDING_MAX = 1024
