"""The census of a job: each process's ``captures`` and ``cudagraph_skips`` merged per site.

``cgguard report`` (cgguard._commands.report) hands each report's sections here as it reads them,
a report at a time, and renders what is kept in its text, JSON and Markdown views. A site is
its (file, line, function) in every process; each site names the process whose captures there
took longest, and the job names its slowest process overall: one rank capturing for 40 s
while the rest take 12 s is what a census of a job is for.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

from cgguard._support.text import shown

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from cgguard._data.schema import CaptureEntry, SkipEntry, SlowestProcess

_SUMMED = ("outcomes", "errors", "apis", "modes", "threads", "pools")
# The parts of a site's captures, each counting some of them (a refused capture has no pool, an
# unmeasured one no device, one still open no outcome yet): none counts more than the site.
_PARTS = (*_SUMMED, "devices")
# A site across reports: (file, line, function), as each report renders its frame.
Where = tuple[Any, Any, Any]
# Where the rows of the other sites, past each census's bound, are merged: no file is there.
_OTHER: Where = (None, None, "other sites")


class _Process:
    __slots__ = ("captures", "host", "pid", "rank", "seconds")

    def __init__(self, host: str | None, pid: int, rank: int | str | None) -> None:
        self.host = host
        self.pid = pid
        self.rank = rank
        self.seconds = 0.0
        self.captures = 0

    def who(self) -> str:
        parts = [shown(self.host) or "unknown host", f"pid {self.pid}"]
        if self.rank is not None:
            parts.append(f"rank {shown(self.rank)}")
        return " ".join(parts)


class JobCaptureSite:
    """One capture site across a job's reports: its entry summed, and its slowest process."""

    __slots__ = ("entry", "processes", "slowest")

    def __init__(self, entry: dict[str, Any]) -> None:
        self.entry = entry  # the merged entry, of the report's shape
        self.processes = 0
        self.slowest: SlowestProcess | None = None


class CensusMerge:
    """The job's census, merged a report at a time."""

    def __init__(self) -> None:
        self.sites: dict[Where, JobCaptureSite] = {}
        self.skips: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.processes: list[_Process] = []
        self.replays = False  # whether any report counted replays
        self.seconds = 0.0  # the job's, all sites of all processes

    def add(
        self,
        host: str | None,
        pid: int,
        rank: int | str | None,
        captures: Iterable[CaptureEntry | Mapping[str, Any]],
        skips: Iterable[SkipEntry | Mapping[str, Any]],
    ) -> None:
        """One process's census sections (empty for a report without them).

        OverflowError where its seconds take a sum past what a float holds: each is a number,
        and their sum would be Infinity.
        """
        process = _Process(host, pid, rank)
        mine: dict[Where, dict[str, Any]] = {}
        for captured in captures:
            entry: Mapping[str, Any] = captured
            place = (
                (entry["file"], entry["line"], entry["function"])
                if "other_sites" not in entry
                else _OTHER
            )
            held = mine.get(place)
            if held is None:
                mine[place] = _copy(entry)
            else:  # two instructions of one line: one site
                _add(held, entry)
        for skip in skips:
            key = (skip["reason"], skip["file"], skip["line"], skip["function"])
            kept = self.skips.get(key)
            if kept is None:
                self.skips[key] = dict(skip)
            else:
                kept["count"] += skip["count"]
        if not mine:
            return
        self.processes.append(process)
        for place, entry in mine.items():
            process.seconds += entry["seconds"]
            process.captures += entry["count"]
            self.replays = self.replays or "replays" in entry
            site = self.sites.get(place)
            if site is None:
                site = self.sites[place] = JobCaptureSite(_copy(entry))
            else:
                _add(site.entry, entry)
            site.processes += 1
            if site.slowest is None or entry["seconds"] > site.slowest["seconds"]:
                site.slowest = {
                    "pid": pid,
                    "host": host,
                    "rank": rank,
                    "seconds": round(entry["seconds"], 9),
                    "count": entry["count"],
                }
        self.seconds += process.seconds
        # Every sum shown: the sites' this process added to, the process's and the job's.
        sums = (*(self.sites[place].entry["seconds"] for place in mine), process.seconds)
        if not all(map(math.isfinite, (*sums, self.seconds))):
            raise OverflowError("captures: the seconds add up to more than a float holds")

    def captures(self) -> list[dict[str, Any]]:
        """The merged ``captures``, the most seconds first, each with its slowest process."""
        out = []
        for site in sorted(self.sites.values(), key=lambda s: -s.entry["seconds"]):
            entry = dict(site.entry)
            entry["seconds"] = round(entry["seconds"], 9)
            entry["processes"] = site.processes
            entry["slowest"] = site.slowest
            out.append(entry)
        return out

    def cudagraph_skips(self) -> list[dict[str, Any]]:
        """The merged ``cudagraph_skips``, the most first."""
        return sorted(self.skips.values(), key=lambda skip: -skip["count"])

    def slowest(self) -> _Process | None:
        """The process whose captures took the most seconds in all."""
        return max(self.processes, key=lambda p: p.seconds, default=None)

    def summary(self) -> str:
        """The job's census in a line, or "" when no report holds a capture or a skip."""
        if not self.sites and not self.skips:
            return ""
        count = sum(site.entry["count"] for site in self.sites.values())
        sites = sites_in(site.entry for site in self.sites.values())
        seconds = self.seconds
        skipped = sum(skip["count"] for skip in self.skips.values())
        line = (
            f"census: {counted(count, 'capture')} at {counted(sites, 'site')} in "
            f"{counted(len(self.processes), 'process', 'processes')}, {seconds:.6f} s; "
            f"{counted(skipped, 'compiled graph')} skipped"
        )
        slowest = self.slowest()
        if slowest is not None and len(self.processes) > 1:
            others = max(p.seconds for p in self.processes if p is not slowest)
            line += (
                f"; slowest process {slowest.who()}: {slowest.seconds:.6f} s "
                f"(the next {others:.6f} s)"
            )
        return line

    def slowest_json(self) -> dict[str, Any] | None:
        slowest = self.slowest()
        if slowest is None:
            return None
        return {
            "host": slowest.host,
            "pid": slowest.pid,
            "rank": slowest.rank,
            "seconds": round(slowest.seconds, 9),
            "captures": slowest.captures,
        }


def contradiction(captures: Sequence[Mapping[str, Any]]) -> str | None:
    """What a report's ``captures``, of the schema, say against themselves, or None.

    A part of a site's captures that counts more than the site, seconds no float holds, graphs
    never replayed beyond the captures, or a longest capture longer than all of them together:
    no census writes these, and a merge would add them up into values that cannot be.
    """
    for i, entry in enumerate(captures):
        count = entry["count"]
        for key in _PARTS:
            part = sum((entry.get(key) or {}).values())
            if part > count:
                return f"captures[{i}].{key} add up to {part}, more than its count ({count})"
        if entry["seconds"] > sys.float_info.max:  # a whole number: json.loads reads it so
            return f"captures[{i}].seconds is a whole number past what a float holds"
        never = entry.get("never_replayed", 0)
        if never > count:
            return f"captures[{i}].never_replayed is {never}, more than its count ({count})"
        if entry["max_seconds"] > entry["seconds"]:
            return (
                f"captures[{i}].max_seconds is {entry['max_seconds']}, more than its seconds "
                f"({entry['seconds']})"
            )
    return None


def site_text(entry: Mapping[str, Any]) -> str:
    """One merged site in a line, its names shown safe."""
    outcomes = outcomes_text(entry)
    weight = (
        "bytes not measured"
        if entry["bytes_reserved"] is None
        else f"{entry['bytes_reserved']} bytes reserved"
    )
    captures = counted(entry["count"], "capture")
    line = f"{place_text(entry)}: {captures} ({outcomes}), {entry['seconds']:.6f} s"
    line += f", {weight}"
    if "replays" in entry:
        line += f", {entry['replays']} replays, {entry.get('never_replayed', 0)} never replayed"
    slowest = entry.get("slowest")
    if slowest is not None and entry.get("processes", 1) > 1:
        line += f"; slowest {slowest_text(slowest)}"
    return line


def slowest_text(slowest: Mapping[str, Any]) -> str:
    """A site's slowest process, its host, pid and rank (where known), and its seconds."""
    who = _Process(slowest["host"], slowest["pid"], slowest["rank"]).who()
    return f"{who} ({slowest['seconds']:.6f} s)"


def skip_text(skip: Mapping[str, Any]) -> str:
    """One merged skip in a line."""
    return f"{shown(skip['reason'])}: {skip['count']} at {place_text(skip)}"


def outcomes_text(entry: Mapping[str, Any]) -> str:
    """A census entry's captures by outcome, "open N" last for those begun and not ended when
    the census was read."""
    counts = entry["outcomes"]
    parts = [f"{shown(k)} {v}" for k, v in counts.items() if v]
    still = entry["count"] - sum(counts.values())
    if still > 0:
        parts.append(f"open {still}")
    return ", ".join(parts)


def counted(count: int, one: str, many: str = "") -> str:
    """``count`` of a thing, named in the singular for one: "1 capture", "3 captures"."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def place_text(entry: Mapping[str, Any]) -> str:
    """A census entry's site, its names shown safe: "an unknown site" where no file is known
    (a capture begun from code cgguard could not see), as the Markdown view says it."""
    if "other_sites" in entry:
        return counted(entry["other_sites"], "other site")
    if entry["file"] is None:
        return "an unknown site"
    return f"{shown(entry['file'])}:{entry['line']} (in {shown(entry['function'])})"


def sites_in(entries: Iterable[Mapping[str, Any]]) -> int:
    """How many sites census entries count: the row of the other sites counts for several."""
    return sum(entry.get("other_sites", 1) for entry in entries)


def _copy(entry: Mapping[str, Any]) -> dict[str, Any]:
    copied = dict(entry)
    for key in (*_SUMMED, "devices"):
        if isinstance(copied.get(key), dict):
            copied[key] = dict(copied[key])
    copied["seconds"] = float(copied["seconds"])
    return copied


def _add(held: dict[str, Any], entry: Mapping[str, Any]) -> None:
    """Add ``entry``'s counts to ``held``, a site's merged entry."""
    held["count"] += entry["count"]
    held["seconds"] += entry["seconds"]
    held["max_seconds"] = max(held["max_seconds"], entry["max_seconds"])
    for key in ("bytes_reserved", "bytes_allocated"):
        if entry[key] is not None:
            held[key] = (held[key] or 0) + entry[key]
    for key in _SUMMED:
        _sum_into(held.setdefault(key, {}), entry.get(key) or {})
    if entry.get("devices"):
        held["devices"] = held.get("devices") or {}
        _sum_into(held["devices"], entry["devices"])
    for key in ("replays", "never_replayed", "other_sites"):
        if key in entry:
            held[key] = held.get(key, 0) + entry[key]


def _sum_into(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for name, count in counts.items():
        into[name] = into.get(name, 0) + count
