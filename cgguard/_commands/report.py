"""``cgguard report``: the JSON reports of a whole job's processes merged into one view.

A torchrun or multi-node job leaves one report per process. Merged, they say per rule and site
how often it was hit and by which processes (host, pid, rank), with the first full stacks, and
list every process that was guarded, those without a violation included.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import gc
import hashlib
import json
import math
import os
import stat
import sys
from typing import TYPE_CHECKING, Any, TextIO, TypedDict

from cgguard._config.settings import shown as quoted
from cgguard._data.census_merge import (
    CensusMerge,
    contradiction,
    counted,
    place_text,
    site_text,
    skip_text,
    slowest_text,
)
from cgguard._data.schema import RANK_KEYS, REPORT_SCHEMA, ReportDocument
from cgguard._reporting.log import format_stacks
from cgguard._rules.record import OUTCOMES
from cgguard._rules.table import NAMES
from cgguard._support.frames import format_frames, where
from cgguard._support.text import markdown, safe, shown
from cgguard._support.typecheck import non_finite
from cgguard._support.typecheck import problem as schema_problem

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from cgguard._support.frames import FrameInfo

FORMATS = ("text", "json", "markdown")
_UNKNOWN_HOST = "unknown host"  # a report written before reports carried the host name
_GLOB_MAGIC = ("*", "?", "[")
# The most of one report read, unless --max-bytes says otherwise: a report of a million sites
# is about 400 MB, and anything larger is more likely a wrong path than a report.
MAX_BYTES = 1 << 30
# The census's sections, read from reports of schema 2 on.
_SINCE_SCHEMA_2 = ("captures", "cudagraph_skips")
# The JSON view's encoder: json.dumps's own, except that a NaN or an Infinity stops it (a
# ValueError) rather than be written as text strict JSON parsers refuse. read() lets none
# through; this keeps it so whatever reaches the view.
_encode = json.JSONEncoder(allow_nan=False).encode


class ReportError(Exception):
    """A path that is not a readable cgguard report; its message is one line naming it."""


class Process(TypedDict):
    """One process of the job, as its report describes it."""

    host: str | None
    pid: int
    rank: int | str | None
    local_rank: int | str | None
    world_size: int | str | None
    job: str | None  # the run, for a report path without {pid}
    violations: int
    totals: dict[str, int]
    exempted: int  # captures exemptions let through
    exempted_totals: dict[str, int]
    report: str
    written_at: str


class Skipped(TypedDict):
    """A report not counted: a byte-for-byte copy of one already read."""

    report: str
    same_as: str


class SameProcess(TypedDict):
    """Reports of one host, pid and job that differ, each counted as a process."""

    host: str | None
    pid: int
    job: str | None
    reports: list[str]


class JobRuleSite:
    """One rule at one place in the code, across the job: its count, each process's (in the
    order read, merged and sorted by finish()), and the earliest first event."""

    __slots__ = ("api", "count", "exemption", "first", "hits", "rule", "top")

    def __init__(
        self, rule: str, top: FrameInfo | None, first: dict[str, Any], exemption: str | None
    ) -> None:
        self.rule = rule
        self.top = top  # the innermost frame of the offending (or exempted) call
        self.first = first
        self.api: str | None = first.get("api")
        self.exemption = exemption  # for what an exemption let through
        self.count = 0
        self.hits: list[tuple[Process, int]] = []

    def add(self, process: Process, count: int, first: dict[str, Any]) -> None:
        self.count += count
        if self.hits and self.hits[-1][0] is process:
            # Two sites of one report at one line (two instructions of it): one count.
            self.hits[-1] = (process, self.hits[-1][1] + count)
        else:
            self.hits.append((process, count))
        if _earlier(first, self.first):
            self.first = first

    def processes(self) -> list[dict[str, object]]:
        """Each process's count here, as the JSON view lists them."""
        return [
            {"host": p["host"], "pid": p["pid"], "rank": p["rank"], "count": count}
            for p, count in self.hits
        ]


class Merged:
    """The whole job: totals per rule, the merged sites, what exemptions let through, every
    process, and what the merge met on the way (jobs, times, copies skipped)."""

    def __init__(self) -> None:
        self.processes: list[Process] = []
        self.violations: list[JobRuleSite] = []
        self.exempted: list[JobRuleSite] = []
        self.totals: dict[str, int] = {}
        self.exempted_totals: dict[str, int] = {}
        self.hosts: list[str | None] = []
        self.jobs: list[str] = []
        self.written: tuple[str, str] | None = None  # the first and last written_at
        self.skipped: list[Skipped] = []
        self.same_process: list[SameProcess] = []
        self.census = CensusMerge()  # the reports' captures and skipped compiled graphs


# --- finding and reading the reports -------------------------------------------------------


def collect(paths: Sequence[str]) -> list[str]:
    """The report files named by ``paths``: files, folders (their ``*.json`` files) and globs.

    Raises ReportError for a path that names nothing, or a folder or glob that holds no report.
    """
    found: dict[str, str] = {}  # by real path, so that a file named twice is read once
    for path in paths:
        if os.path.lexists(path):
            matches = [path]
        elif any(magic in path for magic in _GLOB_MAGIC):
            matches = sorted(set(_expand(path)))
            if not matches:
                raise ReportError(f"{quoted(path)}: no file matches this pattern")
        else:
            raise ReportError(f"{quoted(path)}: no such file or folder")
        for match in matches:
            if os.path.isdir(match):
                files = _folder(match)
                if not files:
                    raise ReportError(f"{quoted(match)}: a folder with no cgguard report (*.json)")
            else:
                files = [match]
            for file in files:
                found.setdefault(os.path.realpath(file), file)
    return list(found.values())


def _folder(folder: str) -> list[str]:
    """A folder's ``*.json`` entries, sorted, hidden ones left out as a shell's ``*`` does.

    Not its subfolders'. Whatever is named so is listed, a FIFO or a folder too: load()
    refuses what is not a regular file, naming it, rather than skip it unseen.
    """
    with os.scandir(folder) as entries:
        names = [e.name for e in entries if e.name.endswith(".json") and e.name[0] != "."]
    return [os.path.join(folder, name) for name in sorted(names)]


def _expand(pattern: str) -> Iterator[str]:
    """The paths a glob pattern matches, as ``glob.glob(pattern, recursive=True)`` finds them,
    except that ``**`` never enters a symlinked folder.

    glob's ``**`` follows links to folders, so a link to a folder above it walks in circles
    until the patience of whoever waits runs out; two such links, exponentially. Real folders
    make a finite tree. A link named by the pattern's other parts is followed, as glob does.
    """
    root = os.sep if pattern.startswith(os.sep) else ""
    parts = [part for part in pattern.split(os.sep) if part]
    return _matches(root, parts)


def _matches(base: str, parts: list[str]) -> Iterator[str]:
    if not parts:
        yield base
        return
    part, rest = parts[0], parts[1:]
    if part == "**":
        # No folder, or one more real folder, with the ** still to match.
        yield from _matches(base, rest)
        for entry in _entries(base):
            if entry.name[0] != "." and entry.is_dir(follow_symlinks=False):
                yield from _matches(entry.path, parts)
    elif any(magic in part for magic in _GLOB_MAGIC):
        hidden = part[0] == "."  # glob's wildcards match a leading dot only when written
        for entry in _entries(base):
            if (hidden or entry.name[0] != ".") and fnmatch.fnmatchcase(entry.name, part):
                if not rest:
                    yield entry.path
                elif entry.is_dir():
                    yield from _matches(entry.path, rest)
    else:
        path = os.path.join(base, part)
        if rest and os.path.isdir(path):
            yield from _matches(path, rest)
        elif not rest and os.path.lexists(path):
            yield path


def _entries(folder: str) -> list[os.DirEntry[str]]:
    # A folder that cannot be listed matches nothing, as with glob.
    try:
        with os.scandir(folder or os.curdir) as entries:
            return list(entries)
    except OSError:
        return []


# What a path that is not a regular file is, for the message that refuses it.
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _read(path: str, max_bytes: int) -> tuple[bytes, tuple[int, int]]:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` of them, and the file's
    identity (device, inode)."""
    try:
        # O_NONBLOCK: a FIFO at the path would block a plain open until a writer came. What
        # the open file is decides, not a stat of the path before it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | os.O_CLOEXEC)
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                kind = next((name for test, name in _KINDS if test(status.st_mode)), "unknown")
                raise ReportError(f"{quoted(path)}: not a regular file ({kind})")
            if status.st_size > max_bytes:
                raise ReportError(_too_large(path, max_bytes))
            with open(fd, "rb", buffering=0, closefd=False) as file:
                # One read of the size stat gave, and more only if the file grew since.
                data = file.read(status.st_size + 1) or b""
                while len(data) <= max_bytes and (more := file.read(1 << 20)):
                    data += more
        finally:
            os.close(fd)
    except OSError as exc:
        raise ReportError(f"{quoted(path)}: cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ReportError(_too_large(path, max_bytes))
    return data, (status.st_dev, status.st_ino)


def _too_large(path: str, max_bytes: int) -> str:
    return f"{quoted(path)}: larger than {max_bytes} bytes (--max-bytes raises the limit)"


def read(
    paths: Sequence[str], max_bytes: int = MAX_BYTES, skipped: list[Skipped] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, document) of each report ``paths`` name, checked, one at a time.

    One at a time, so that merge() keeps of each only what it needs. A file reached by two
    names (a hard link, a link, two globs) is read once; a byte-for-byte copy of a report
    already read (gathered twice) is not counted again, and is noted in ``skipped``.
    ReportError for the first path that is not a report.
    """
    files: set[tuple[int, int]] = set()
    digests: dict[bytes, str] = {}
    frames: dict[tuple[str, int, str, str | None], dict[str, Any]] = {}
    for path in collect(paths):
        data, identity = _read(path, max_bytes)
        if identity in files:
            continue
        files.add(identity)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        if digest in digests:
            if skipped is not None:
                skipped.append({"report": path, "same_as": digests[digest]})
            continue
        digests[digest] = path
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ReportError(f"{quoted(path)}: not a cgguard report: not UTF-8 text") from None
        del data  # the text alone is kept while parsing: a report may be hundreds of MB
        yield path, _parsed(path, text, frames)


def _parsed(
    path: str, text: str, frames: dict[tuple[str, int, str, str | None], dict[str, Any]]
) -> dict[str, Any]:
    def shared(value: dict[str, Any]) -> dict[str, Any]:
        # One object for each distinct frame: the frames of a job's stacks repeat (their
        # outer frames above all), and a report of a million sites holds several million.
        # Only a frame of exactly the schema's kinds: sharing must not hide one that is not.
        if len(value) == 4:
            file, line = value.get("file"), value.get("line")
            function, code = value.get("function"), value.get("code", 0)
            if (
                type(file) is str
                and type(line) is int
                and type(function) is str
                and (code is None or type(code) is str)
            ):
                return frames.setdefault((file, line, function, code), value)
        return value

    # NaN, Infinity and -Infinity are not JSON, though json.loads reads them, as it reads a
    # number too large for a float as Infinity. Noted as they are parsed, and their place looked
    # for only where one was seen: a good report costs a look at each of its floats.
    unlike_json: list[str] = []

    def constant(name: str) -> float:
        unlike_json.append(name)
        return float(name)

    def number(digits: str) -> float:
        value = float(digits)
        if math.isinf(value):
            unlike_json.append(digits)
        return value

    try:
        document = json.loads(text, object_hook=shared, parse_constant=constant, parse_float=number)
    except RecursionError:
        message = "not a cgguard report: not JSON (nested too deeply)"
        raise ReportError(f"{quoted(path)}: {message}") from None
    except ValueError as exc:
        raise ReportError(f"{quoted(path)}: not a cgguard report: not JSON ({exc})") from None
    if isinstance(document, dict) and document.get("schema", 1) == 1:
        # Keys that schema 2 gave a meaning are another writer's in a report of schema 1:
        # unknown keys, let through and not read.
        for key in _SINCE_SCHEMA_2:
            document.pop(key, None)
    problem = (
        # Before the schema: such a number may be in a key it does not name, passed on as it is
        # to the JSON view.
        (non_finite(document) if unlike_json else None)
        or schema_problem(document, ReportDocument)
        or _contradiction(document)
    )
    if problem is not None:
        raise ReportError(f"{quoted(path)}: not a cgguard report: {problem}")
    return document  # type: ignore[no-any-return]


def _contradiction(document: dict[str, Any]) -> str | None:
    """What a report of the schema says against itself, or None."""
    if document.get("schema", REPORT_SCHEMA) > REPORT_SCHEMA:
        return (
            f"of report schema {document['schema']}, which this cgguard cannot read "
            f"(it reads schema {REPORT_SCHEMA})"
        )
    census = contradiction(document.get("captures", ()))
    if census is not None:
        return census
    for i, violation in enumerate(document["violations"]):
        if violation["first"]["rule"] != violation["rule"]:
            return (
                f"violations[{i}] is of rule {quoted(violation['rule'])}, its first event of "
                f"{quoted(violation['first']['rule'])}"
            )
    # A total may exceed its sites' counts (a site whose first event was still being rendered
    # when the report was written is counted, not listed); it may not fall short of them.
    for totals, entries, what in (
        ("totals", "violations", "violations"),
        ("exempted_totals", "exempted", "exempted"),
    ):
        listed: dict[str, int] = {}
        for entry in document.get(entries, ()):
            listed[entry["rule"]] = listed.get(entry["rule"], 0) + entry["count"]
        held = document.get(totals, {})
        for rule, count in listed.items():
            if held.get(rule, 0) < count:
                return (
                    f"{totals}[{quoted(rule)}] is {held.get(rule, 0)}, fewer than its {what} "
                    f"count ({count})"
                )
    return None


# --- merging --------------------------------------------------------------------------------


def merge(reports: Iterable[tuple[str, dict[str, Any]]], skipped: Sequence[Skipped] = ()) -> Merged:
    """The job's view of ``reports``, (path, document) pairs checked by read().

    One pass: of each document, only the first events of its sites are kept, so that a job of
    many reports is held in memory a report at a time.
    """
    merged = Merged()
    sites: dict[tuple[object, ...], JobRuleSite] = {}
    exempted: dict[tuple[object, ...], JobRuleSite] = {}
    for path, document in reports:
        process = _process(path, document)
        merged.processes.append(process)
        for violation in document["violations"]:
            first = violation["first"]
            # A first event is a full one, with its stack; one without is at an unknown site.
            stack = first.get("stack")
            top: FrameInfo | None = stack[-1] if stack else None
            key = (violation["rule"], *_place(top))
            site = sites.get(key)
            if site is None:
                site = sites[key] = JobRuleSite(violation["rule"], top, first, None)
            site.add(process, violation["count"], first)
        for entry in document.get("exempted", ()):
            stack = entry["first"]["stack"]
            top = stack[-1] if stack else None
            key = (entry["rule"], entry["exemption"], *_place(top))
            site = exempted.get(key)
            if site is None:
                site = exempted[key] = JobRuleSite(
                    entry["rule"], top, entry["first"], entry["exemption"]
                )
            site.add(process, entry["count"], entry["first"])
        try:
            merged.census.add(
                process["host"],
                process["pid"],
                process["rank"],
                document.get("captures", ()),
                document.get("cudagraph_skips", ()),
            )
        except OverflowError as exc:
            raise ReportError(f"{quoted(path)}: {exc}") from None
        del document  # what merge keeps of it is in its sites
    processes = merged.processes
    processes.sort(key=_process_order)
    for site in (*sites.values(), *exempted.values()):
        site.hits.sort(key=lambda hit: _process_order(hit[0]))
    merged.violations = sorted(sites.values(), key=_site_order)
    merged.exempted = sorted(exempted.values(), key=_site_order)
    sites.clear()
    exempted.clear()
    merged.totals = _sum(p["totals"] for p in processes)
    merged.exempted_totals = _sum(p["exempted_totals"] for p in processes)
    merged.hosts = sorted({p["host"] for p in processes}, key=lambda h: (h is None, h or ""))
    merged.jobs = sorted({p["job"] for p in processes if p["job"] is not None})
    times = [p["written_at"] for p in processes]
    merged.written = (min(times), max(times)) if times else None
    merged.skipped = list(skipped)
    merged.same_process = _same_processes(processes)
    return merged


def _place(top: FrameInfo | None) -> tuple[object, ...]:
    return (top["file"], top["line"], top["function"]) if top else (None, None, None)


def _same_processes(processes: list[Process]) -> list[SameProcess]:
    """Reports of one host, pid and job that are not copies of one another (those were
    skipped): a pid used again, or one process's report taken at different times."""
    groups: dict[tuple[str | None, int, str | None], list[str]] = {}
    for p in processes:
        groups.setdefault((p["host"], p["pid"], p["job"]), []).append(p["report"])
    return [
        {"host": host, "pid": pid, "job": job, "reports": reports}
        for (host, pid, job), reports in groups.items()
        if len(reports) > 1
    ]


def _sum(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Counts per rule added up, in the rule table's order."""
    totals: dict[str, int] = {}
    for each in counts:
        for rule, count in each.items():
            totals[rule] = totals.get(rule, 0) + count
    return dict(sorted(totals.items(), key=lambda item: _rule_order(item[0])))


def _process(path: str, document: dict[str, Any]) -> Process:
    # The report's own totals: they also count a site whose first event was still being
    # rendered when the report was written.
    held = sorted(document["totals"].items(), key=lambda item: _rule_order(item[0]))
    totals = {rule: count for rule, count in held if count}
    exempted = sorted(document.get("exempted_totals", {}).items())
    exempted_totals = {rule: count for rule, count in exempted if count}
    return {
        "host": document.get("host"),
        "pid": document["pid"],
        "rank": document.get("rank"),
        "local_rank": document.get("local_rank"),
        "world_size": document.get("world_size"),
        "job": document.get("job"),
        "violations": sum(totals.values()),
        "totals": totals,
        "exempted": sum(exempted_totals.values()),
        "exempted_totals": exempted_totals,
        "report": path,
        "written_at": document["written_at"],
    }


def _earlier(event: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    # ISO 8601 timestamps in UTC with a fixed width compare as text.
    mine, theirs = event.get("timestamp"), than.get("timestamp")
    return isinstance(mine, str) and (not isinstance(theirs, str) or mine < theirs)


def _rank_order(rank: int | str | None) -> tuple[int, int, str]:
    if isinstance(rank, int):
        return (0, rank, "")
    return (1, 0, rank) if rank is not None else (2, 0, "")


def _process_order(process: Process) -> tuple[object, ...]:
    host = process["host"]
    return (host is None, host or "", _rank_order(process["rank"]), process["pid"])


# The table's order, then rules a newer cgguard wrote, by name.
_RULE_ORDER = {rule: (i, "") for i, rule in enumerate(NAMES)}


def _rule_order(rule: str) -> tuple[int, str]:
    return _RULE_ORDER.get(rule) or (len(NAMES), rule)


def _site_order(site: JobRuleSite) -> tuple[object, ...]:
    top = site.top
    return (
        -site.count,
        _rule_order(site.rule),
        site.exemption or "",
        top["file"] if top else "",
        top["line"] if top else 0,
    )


# --- rendering ------------------------------------------------------------------------------

# Every text a report holds (names, code, messages, hosts, ranks, paths) came from elsewhere:
# each is shown safe (cgguard._support.text) before it is put in a line. Each view is written a
# site at a time, so that a report of a million sites is never held as text whole.


def _site_line(top: FrameInfo | None) -> str:
    """A site's frame as one-line messages name it, shown safe."""
    return safe(where([top])) if top else "an unknown site"


def _place_line(entry: Mapping[str, Any]) -> str:
    """A census entry's place, as _site_line shows a site's frame."""
    return place_text(entry)


def _who(process: Process) -> str:
    parts = [shown(process["host"]) or _UNKNOWN_HOST, f"pid {process['pid']}"]
    if process["rank"] is not None:
        parts.append(f"rank {shown(process['rank'])}")
    return " ".join(parts)


def _hits(site: JobRuleSite) -> str:
    return ", ".join(f"{_who(process)} ({count})" for process, count in site.hits)


def _headline(merged: Merged) -> str:
    count = sum(merged.totals.values())
    found = (
        f"{counted(count, 'violation')} at {counted(len(merged.violations), 'site')}"
        if count
        else "no violation"
    )
    exempted = sum(merged.exempted_totals.values())
    if exempted:
        found += f"; {exempted} exempted"
    return (
        f"{counted(len(merged.processes), 'process', 'processes')} on "
        f"{counted(len(merged.hosts), 'host')}: {found}"
    )


def _merged_what(merged: Merged) -> list[str]:
    """What was merged, beyond the counts: when the reports were written, the runs they name,
    the copies skipped and one process's differing reports."""
    lines = []
    if merged.written is not None:
        first, last = (shown(time) for time in merged.written)
        lines.append(
            f"reports written at {first}"
            if first == last
            else f"reports written from {first} to {last}"
        )
    if merged.jobs:
        lines.append("jobs: " + ", ".join(shown(job) for job in merged.jobs))
    lines += [
        f"skipped {shown(s['report'])}: the same report as {shown(s['same_as'])}"
        for s in merged.skipped
    ]
    for same in merged.same_process:
        who = f"{shown(same['host']) or _UNKNOWN_HOST} pid {same['pid']}"
        if same["job"] is not None:
            who += f" job {shown(same['job'])}"
        lines.append(
            f"{who}: {len(same['reports'])} different reports, each counted as a process: "
            + ", ".join(shown(report) for report in same["reports"])
        )
    return lines


def _exempted_line(site: JobRuleSite) -> str:
    return (
        f"{shown(site.rule)} at {_site_line(site.top)}: {site.count} exempted by "
        f"{shown(site.exemption)}, in {_hits(site)}"
    )


def _stacks(event: dict[str, Any]) -> str:
    """The first event's stacks as the console shows them; plain frames for a rule unknown
    to this cgguard."""
    text = format_stacks(event)
    if text or not isinstance(event.get("stack"), list):
        return text
    return "The call was made at (most recent call last):\n" + format_frames(event["stack"])


def _lines(text: str) -> list[str]:
    # Only "\n": the text is safe, so it holds no other line break of its own.
    return text.split("\n") if text else []


def _ranks(process: Process) -> list[tuple[str, int | str | None]]:
    return [
        ("rank", process["rank"]),
        ("local_rank", process["local_rank"]),
        ("world_size", process["world_size"]),
    ]


def _process_line(process: Process) -> str:
    ranks = " ".join(f"{key} {shown(value)}" for key, value in _ranks(process) if value is not None)
    found = (
        ", ".join(f"{shown(rule)} {count}" for rule, count in process["totals"].items())
        if process["violations"]
        else "no violation"
    )
    if process["exempted"]:
        found += f" ({process['exempted']} exempted)"
    head = f"{shown(process['host']) or _UNKNOWN_HOST} pid {process['pid']}"
    return "  ".join(part for part in (head, ranks, found, shown(process["report"])) if part)


def render_text(merged: Merged) -> Iterator[str]:
    """For a person at a terminal, a piece at a time."""
    yield f"cgguard report: {_headline(merged)}\n"
    for line in _merged_what(merged):
        yield line + "\n"
    for site in merged.violations:
        lines = [
            "",
            f"{shown(site.rule)} at {_site_line(site.top)}: {site.count} in "
            f"{counted(len(site.hits), 'process', 'processes')}",
        ]
        lines += [f"  {_who(process)}: {count}" for process, count in site.hits]
        lines.append(f"  {shown(site.first.get('message', ''))}")
        lines += [f"  {line}" if line else "" for line in _lines(_stacks(dict(site.first)))]
        yield "\n".join(lines) + "\n"
    if merged.exempted:
        yield "\nexempted:\n"
        for site in merged.exempted:
            yield f"  {_exempted_line(site)}\n"
    census = merged.census.summary()
    if census:
        yield f"\n{census}\n"
        for entry in merged.census.captures():
            yield f"  {site_text(entry)}\n"
        skips = merged.census.cudagraph_skips()
        if skips:
            yield "torch.compile's skipped cudagraphs:\n"
            for skip in skips:
                yield f"  {skip_text(skip)}\n"
    yield "\nprocesses:\n"
    for process in merged.processes:
        yield f"  {_process_line(process)}\n"


def render_json(merged: Merged) -> Iterator[str]:
    """For a machine: the merged view as one JSON document, a site or process to a line.

    json.dumps without ``indent``, a piece at a time: with ``indent`` the encoder is the pure
    Python one, many times slower, and one call would hold the whole document as text.
    """
    dumps = _encode
    first, last = merged.written or (None, None)
    yield (
        f'{{"reports": {len(merged.processes)}, "hosts": {dumps(merged.hosts)}, '
        f'"jobs": {dumps(merged.jobs)}, '
        f'"written": {dumps({"first": first, "last": last})}, '
        f'"totals": {dumps(merged.totals)},\n"violations": ['
    )
    yield from _json_items(
        {
            "rule": site.rule,
            "api": site.api,
            "site": site.top,
            "count": site.count,
            "processes": site.processes(),
            "first": site.first,
        }
        for site in merged.violations
    )
    yield f'],\n"exempted_totals": {dumps(merged.exempted_totals)},\n"exempted": ['
    yield from _json_items(
        {
            "rule": site.rule,
            "exemption": site.exemption,
            "site": site.top,
            "count": site.count,
            "processes": site.processes(),
        }
        for site in merged.exempted
    )
    yield '],\n"captures": ['
    yield from _json_items(merged.census.captures())
    yield '],\n"cudagraph_skips": ['
    yield from _json_items(merged.census.cudagraph_skips())
    yield f'],\n"slowest_capturing": {dumps(merged.census.slowest_json())},\n"processes": ['
    yield from _json_items(merged.processes)
    yield (
        f'],\n"skipped": {dumps(merged.skipped)},\n"same_process": {dumps(merged.same_process)}}}\n'
    )


def _json_items(values: Iterable[object]) -> Iterator[str]:
    """The items of a JSON array, one to a line, each encoded as it comes."""
    dumps = _encode
    for i, value in enumerate(values):
        yield ("\n" if i == 0 else ",\n") + dumps(value)


def _cell(value: object) -> str:
    # A table cell is one line of literal text: no line break (\r included), no bare |, no
    # link or HTML of its own.
    return "" if value is None else markdown(str(value))


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |\n"


def _header(names: Sequence[str]) -> str:
    return _row(names) + _row(["---"] * len(names))


def _fence(lines: Sequence[str]) -> str:
    # Each line safe, so that the only line breaks are those between them (a \r would end a
    # line for CommonMark too); the fence longer than any line of backticks inside (indented
    # or not), so that the block cannot end early.
    lines = [safe(line) for line in lines]
    runs = (line.strip() for line in lines if "```" in line)
    longest = max((len(run) for run in runs if not run.strip("`")), default=0)
    ticks = "`" * max(3, longest + 1)
    return "\n".join((f"{ticks}text", *lines, ticks))


def render_markdown(merged: Merged) -> Iterator[str]:
    """For a CI summary or a pull request: tables, and each site's message and stacks in a
    code block, a piece at a time."""
    yield f"# cgguard report\n\n{_cell(_headline(merged))}.\n"
    what = _merged_what(merged)
    if what:
        yield "\n" + "".join(f"- {_cell(line)}\n" for line in what)
    if merged.violations:
        yield "\n## Violations\n\n" + _header(["rule", "site", "count", "processes"])
        for site in merged.violations:
            yield _row([site.rule, _site_line(site.top), site.count, _hits(site)])
        for site in merged.violations:
            heading = f"{_cell(site.rule)} at {_cell(_site_line(site.top))}"
            # The message with the stacks, as the terminal shows them: in a code block, where
            # nothing it holds is read as Markdown.
            message = shown(site.first.get("message", ""))
            stacks = _lines(_stacks(dict(site.first)))
            yield f"\n### {heading}\n\n{_fence([message, *stacks])}\n"
    if merged.exempted:
        yield "\n## Exempted\n\n" + _header(["rule", "site", "exemption", "count", "processes"])
        for site in merged.exempted:
            yield _row([site.rule, _site_line(site.top), site.exemption, site.count, _hits(site)])
    census = merged.census.summary()
    if census:
        yield f"\n## Captures\n\n{_cell(census)}.\n\n" + _header(
            ["site", "count", "ended", "failed", "refused", "abandoned", "seconds", "max seconds",
             "bytes reserved", "processes", "slowest"]
        )  # fmt: skip
        for entry in merged.census.captures():
            slowest = entry["slowest"]
            yield _row(
                [
                    _place_line(entry),
                    entry["count"],
                    *(entry["outcomes"].get(k, 0) for k in OUTCOMES),
                    f"{entry['seconds']:.6f}",
                    f"{entry['max_seconds']:.6f}",
                    "not measured" if entry["bytes_reserved"] is None else entry["bytes_reserved"],
                    entry["processes"],
                    slowest_text(slowest) if slowest else "",
                ]
            )  # fmt: skip
        skips = merged.census.cudagraph_skips()
        if skips:
            yield "\n### torch.compile's skipped cudagraphs\n\n" + _header(
                ["reason", "site", "count"]
            )
            for skip in skips:
                yield _row([skip["reason"], _place_line(skip), skip["count"]])
    yield "\n## Processes\n\n" + _header(
        ["host", "pid", *RANK_KEYS, "violations", "exempted", "report"]
    )
    for p in merged.processes:
        yield _row(
            [
                p["host"] or _UNKNOWN_HOST,
                p["pid"],
                *(value for _, value in _ranks(p)),
                p["violations"],
                p["exempted"],
                p["report"],
            ]
        )


_RENDERERS = {"text": render_text, "json": render_json, "markdown": render_markdown}


def _byte_count(text: str) -> int:
    """--max-bytes: a whole number of bytes above 0."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes above 0")
    return value


@contextlib.contextmanager
def _escaping(*streams: TextIO) -> Iterator[None]:
    """Within: what a stream's encoding cannot hold is written as a backslash escape.

    Names are already safe (printable), but printable is not ASCII: a host name in Greek on
    a terminal whose encoding is ASCII would raise UnicodeEncodeError mid-report otherwise.
    """
    changed = []
    for stream in streams:
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
            changed.append(stream)
    try:
        yield
    finally:
        for stream in changed:
            stream.reconfigure(errors="strict")


def main(argv: Sequence[str]) -> int:
    """``cgguard report``: 1 when any violation is present, 0 when none, 2 on a bad path."""
    from cgguard._commands.run import Parser

    parser = Parser(
        prog="cgguard report",
        usage="cgguard report [--format {text,json,markdown}] [--max-bytes N] PATH [PATH ...]",
        description="Merge the JSON reports of a job's processes: report files, folders "
        "(their *.json files) and glob patterns. Exit status 1 when any violation is "
        "present, 0 when none, 2 when a path is not a readable cgguard report.",
    )
    parser.add_argument(
        "--format",
        type=str.lower,
        choices=FORMATS,
        default="text",
        help="text (default), json or markdown; case-insensitive",
    )
    parser.add_argument(
        "--max-bytes",
        type=_byte_count,
        default=MAX_BYTES,
        metavar="N",
        help=f"refuse a report larger than N bytes (default {MAX_BYTES}, 1 GiB)",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a report, folder or glob")
    options = parser.parse_args(argv)
    # A report of a million sites parses into tens of millions of objects, none in a cycle:
    # the collector would walk them again and again while they are made, for nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _report(options)
    finally:
        if collecting:
            gc.enable()


def _report(options: argparse.Namespace) -> int:
    with _escaping(sys.stdout, sys.stderr):
        skipped: list[Skipped] = []
        try:
            merged = merge(read(options.paths, options.max_bytes, skipped), skipped)
        except ReportError as exc:
            sys.stderr.write(f"cgguard report: {safe(str(exc))}\n")
            return 2
        except MemoryError:
            # Status 1 would say "violations found": a report too large for this machine is
            # a report that could not be read.
            sys.stderr.write("cgguard report: the reports do not fit in memory\n")
            return 2
        write = sys.stdout.write
        try:
            for piece in _RENDERERS[options.format](merged):
                write(piece)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader stopped early (`cgguard report ... | head`), as a pager does: no
            # traceback, and none at exit when Python flushes stdout again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
    # Any count: a report's totals are at least its sites' counts (read() checked).
    return 1 if any(merged.totals.values()) else 0
