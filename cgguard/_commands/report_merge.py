"""A job's reports found, read, checked and merged: the values every view of ``cgguard report``
renders.

A torchrun or multi-node job leaves one report per process. Merged, they say per rule and site
how often it was hit, by which processes (host, pid, rank) and with what action (raised or
logged), with the first full stacks, and list every process that was guarded, those without a
violation included.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import stat
from typing import TYPE_CHECKING, Any, TypedDict

from cgguard._commands.report_ranks import Ranks
from cgguard._config.settings import shown as quoted
from cgguard._data.census_merge import CensusMerge, contradiction
from cgguard._data.schema import REPORT_SCHEMA, ReportDocument
from cgguard._rules.table import NAMES
from cgguard._support.typecheck import non_finite
from cgguard._support.typecheck import problem as schema_problem

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from cgguard._support.frames import FrameInfo

_GLOB_MAGIC = ("*", "?", "[")
# The most of one report read, unless --max-bytes says otherwise: a report of a million sites
# is about 400 MB, and anything larger is more likely a wrong path than a report.
MAX_BYTES = 1 << 30
# The census's sections, read from reports of schema 2 on.
_SINCE_SCHEMA_2 = ("captures", "cudagraph_skips")


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
    actions: dict[str, int]  # the violations of the sites listed, by the action taken
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
    """One rule at one place in the code, across the job: its count, by action taken, each
    process's (in the order read, then sorted by process), and the earliest first event."""

    __slots__ = (
        "api", "count", "exemption", "first", "hits", "logged", "others", "raised", "rule", "top"
    )  # fmt: skip

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
        # A report counts a site under the action of its first event there (the ledger keeps
        # one action per site), so a site's actions are its reports' first events' actions.
        # Two counts, not a dict: a report of a million sites holds a million of them.
        self.raised = 0
        self.logged = 0
        self.others: dict[str, int] | None = None  # actions a newer cgguard names

    def add(self, process: Process, count: int, first: dict[str, Any]) -> None:
        self.count += count
        action = first["action"]
        if action == LOGGED:
            self.logged += count
        elif action == RAISED:
            self.raised += count
        else:
            others = self.others = self.others or {}
            others[action] = others.get(action, 0) + count
        if self.hits and self.hits[-1][0] is process:
            # Two sites of one report at one line (two instructions of it): one count.
            self.hits[-1] = (process, self.hits[-1][1] + count)
        else:
            self.hits.append((process, count))
        if _earlier(first, self.first):
            self.first = first

    def actions(self) -> dict[str, int]:
        """The count by action taken, as in_order() gives it."""
        counts = {RAISED: self.raised, LOGGED: self.logged}
        if self.others:
            counts.update(sorted(self.others.items()))
        return counts

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
        self.actions: dict[str, int] = {}  # the sites' counts by action: raised, logged
        self.exempted_totals: dict[str, int] = {}
        self.hosts: list[str | None] = []
        self.jobs: list[str] = []
        self.written: tuple[str, str] | None = None  # the first and last written_at
        self.skipped: list[Skipped] = []
        self.same_process: list[SameProcess] = []
        self.census = CensusMerge()  # the reports' captures and skipped compiled graphs
        self.ranks = Ranks()  # the ranks' capture manifests, compared


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
    actions: dict[str, int] = {}  # one process's, by action
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
            actions[first["action"]] = actions.get(first["action"], 0) + violation["count"]
        process["actions"] = in_order(actions)
        actions.clear()
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
        merged.ranks.add(process, document.get("manifest"))
        del document  # what merge keeps of it is in its sites and its manifest
    processes = merged.processes
    processes.sort(key=_process_order)
    for site in (*sites.values(), *exempted.values()):
        site.hits.sort(key=lambda hit: _process_order(hit[0]))
    merged.violations = sorted(sites.values(), key=_site_order)
    merged.exempted = sorted(exempted.values(), key=_site_order)
    sites.clear()
    exempted.clear()
    merged.totals = _sum(p["totals"] for p in processes)
    merged.actions = in_order(_sum(p["actions"] for p in processes))
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
        "actions": {},  # merge() counts them, a site at a time
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


# The actions a violation's event names (cgguard._reporting.reporter), in the order shown;
# one a newer cgguard writes follows, by name.
RAISED, LOGGED = ACTIONS = ("raised", "logged")


def in_order(actions: Mapping[str, int]) -> dict[str, int]:
    """Counts by action: raised and logged always (0 where none), then any other, by name."""
    ordered = {action: actions.get(action, 0) for action in ACTIONS}
    for action in sorted(actions.keys() - ordered.keys()):
        ordered[action] = actions[action]
    return ordered


def top_hits(site: JobRuleSite, top: int) -> tuple[list[tuple[Process, int]], int, int]:
    """The ``top`` processes that hit ``site`` most, the most first, then by host, rank and
    pid; and how many processes and violations are left out."""
    hits = site.hits
    if len(hits) > 1:
        # Stable: hits are already by host, rank and pid.
        hits = sorted(hits, key=lambda hit: -hit[1])
    if len(hits) <= top:
        return hits, 0, 0
    shown = hits[:top]
    return shown, len(hits) - top, site.count - sum(count for _, count in shown)


def top_processes(merged: Merged, top: int) -> tuple[list[Process], list[Process]]:
    """The ``top`` processes with the most violations, the most first, then by host, rank and
    pid; and the processes left out."""
    # Stable: processes are already by host, rank and pid.
    ordered = sorted(merged.processes, key=lambda process: -process["violations"])
    return ordered[:top], ordered[top:]


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
