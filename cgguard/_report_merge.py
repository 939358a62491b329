"""``cgguard report``: the JSON reports of a whole job's processes merged into one view.

A torchrun or multi-node job leaves one report per process. Merged, they say per rule and site
how often it was hit and by which processes (host, pid, rank), with the first full stacks, and
list every process that was guarded, those without a violation included.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import stat
import sys
from typing import TYPE_CHECKING, Any, TextIO, TypedDict

from cgguard._frames import format_frames
from cgguard._log import format_stacks
from cgguard._rules import NAMES
from cgguard._safe_text import markdown, safe, shown
from cgguard._schema import RANK_KEYS, REPORT_SCHEMA, ReportDocument
from cgguard._schema import problem as schema_problem
from cgguard._settings import shown as quoted

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from cgguard._frames import FrameInfo
    from cgguard._schema import ViolationEvent

FORMATS = ("text", "json", "markdown")
_UNKNOWN_HOST = "unknown host"  # a report written before reports carried the host name
_GLOB_MAGIC = ("*", "?", "[")
# The most of one report read, unless --max-bytes says otherwise: a report of a million sites
# is about 400 MB, and anything larger is more likely a wrong path than a report.
MAX_BYTES = 1 << 30


class ReportError(Exception):
    """A path that is not a readable cgguard report; its message is one line naming it."""


class Process(TypedDict):
    """One process of the job, as its report describes it."""

    host: str | None
    pid: int
    rank: int | str | None
    local_rank: int | str | None
    world_size: int | str | None
    violations: int
    totals: dict[str, int]
    exempted: int  # captures exemptions let through
    exempted_totals: dict[str, int]
    report: str
    written_at: str | None


class Hit(TypedDict):
    """One process's count at a merged site."""

    host: str | None
    pid: int
    rank: int | str | None
    count: int


class MergedSite(TypedDict):
    """One rule at one place in the code, across the job."""

    rule: str
    api: str | None
    site: FrameInfo | None  # the innermost frame of the offending call's stack
    count: int
    processes: list[Hit]
    first: ViolationEvent  # the earliest first event among the processes


class MergedExempted(TypedDict):
    """Captures one exemption let through for one rule at one place, across the job."""

    rule: str
    exemption: str
    site: FrameInfo | None  # the innermost frame of the exempted call's stack
    count: int
    processes: list[Hit]


class Merged(TypedDict):
    """The whole job: totals per rule, the merged sites, what exemptions let through, and
    every process."""

    reports: int
    hosts: list[str | None]
    totals: dict[str, int]
    violations: list[MergedSite]
    exempted_totals: dict[str, int]
    exempted: list[MergedExempted]
    processes: list[Process]


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


def _read(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` of them."""
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
    return data


def _too_large(path: str, max_bytes: int) -> str:
    return f"{quoted(path)}: larger than {max_bytes} bytes (--max-bytes raises the limit)"


def load(path: str, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """One report, checked against the report's schema; ReportError if it is not one."""
    data = _read(path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReportError(f"{quoted(path)}: not a cgguard report: not UTF-8 text") from None
    del data  # the text alone is kept while parsing: a report may be hundreds of MB
    try:
        document = json.loads(text)
    except RecursionError:
        message = "not a cgguard report: not JSON (nested too deeply)"
        raise ReportError(f"{quoted(path)}: {message}") from None
    except ValueError as exc:
        raise ReportError(f"{quoted(path)}: not a cgguard report: not JSON ({exc})") from None
    del text
    problem = schema_problem(document, ReportDocument)
    if problem is None and document.get("schema", REPORT_SCHEMA) > REPORT_SCHEMA:
        problem = (
            f"of report schema {document['schema']}, which this cgguard cannot read "
            f"(it reads schema {REPORT_SCHEMA})"
        )
    if problem is not None:
        raise ReportError(f"{quoted(path)}: not a cgguard report: {problem}")
    return dict(document)


# --- merging --------------------------------------------------------------------------------


def merge(reports: Sequence[tuple[str, dict[str, Any]]]) -> Merged:
    """The job's view of ``reports``, (path, document) pairs checked by load()."""
    processes: list[Process] = []
    sites: dict[tuple[str, str | None, int | None, str | None], MergedSite] = {}
    for path, document in reports:
        process = _process(path, document)
        processes.append(process)
        for violation in document["violations"]:
            first = violation["first"]
            # A first event is a full one, with its stack; one without is at an unknown site.
            stack = first.get("stack")
            top: FrameInfo | None = stack[-1] if stack else None
            key = (
                violation["rule"],
                top["file"] if top else None,
                top["line"] if top else None,
                top["function"] if top else None,
            )
            merged = sites.get(key)
            if merged is None:
                merged = sites[key] = {
                    "rule": violation["rule"],
                    "api": first.get("api"),
                    "site": top,
                    "count": 0,
                    "processes": [],
                    "first": first,
                }
            elif _earlier(first, merged["first"]):
                merged["first"] = first
            merged["count"] += violation["count"]
            merged["processes"].append(
                {
                    "host": process["host"],
                    "pid": process["pid"],
                    "rank": process["rank"],
                    "count": violation["count"],
                }
            )
    processes.sort(key=_process_order)
    for merged in sites.values():
        merged["processes"].sort(key=_process_order)
    violations = sorted(sites.values(), key=_site_order)
    exempted = _merge_exempted(reports, processes)
    hosts = sorted({p["host"] for p in processes}, key=lambda h: (h is None, h or ""))
    return {
        "reports": len(processes),
        "hosts": hosts,
        "totals": _sum(p["totals"] for p in processes),
        "violations": violations,
        "exempted_totals": _sum(p["exempted_totals"] for p in processes),
        "exempted": exempted,
        "processes": processes,
    }


def _merge_exempted(
    reports: Sequence[tuple[str, dict[str, Any]]], processes: list[Process]
) -> list[MergedExempted]:
    """What exemptions let through, per rule, exemption and site, across the job."""
    by_path = {p["report"]: p for p in processes}
    sites: dict[tuple[str, str, str | None, int | None], MergedExempted] = {}
    for path, document in reports:
        process = by_path[path]
        for entry in document.get("exempted", []):
            stack = entry["first"]["stack"]
            top: FrameInfo | None = stack[-1] if stack else None
            key = (
                entry["rule"],
                entry["exemption"],
                top["file"] if top else None,
                top["line"] if top else None,
            )
            merged = sites.setdefault(
                key,
                {
                    "rule": entry["rule"],
                    "exemption": entry["exemption"],
                    "site": top,
                    "count": 0,
                    "processes": [],
                },
            )
            merged["count"] += entry["count"]
            merged["processes"].append(
                {
                    "host": process["host"],
                    "pid": process["pid"],
                    "rank": process["rank"],
                    "count": entry["count"],
                }
            )
    for merged in sites.values():
        merged["processes"].sort(key=_process_order)
    return sorted(sites.values(), key=lambda site: (-site["count"], _rule_order(site["rule"])))


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
    written_at = document.get("written_at")
    return {
        "host": document.get("host"),
        "pid": document["pid"],
        "rank": document.get("rank"),
        "local_rank": document.get("local_rank"),
        "world_size": document.get("world_size"),
        "violations": sum(totals.values()),
        "totals": totals,
        "exempted": sum(exempted_totals.values()),
        "exempted_totals": exempted_totals,
        "report": path,
        "written_at": written_at if isinstance(written_at, str) else None,
    }


def _earlier(event: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    # ISO 8601 timestamps in UTC with a fixed width compare as text.
    mine, theirs = event.get("timestamp"), than.get("timestamp")
    return isinstance(mine, str) and (not isinstance(theirs, str) or mine < theirs)


def _rank_order(rank: int | str | None) -> tuple[int, int, str]:
    if isinstance(rank, int):
        return (0, rank, "")
    return (1, 0, rank) if rank is not None else (2, 0, "")


def _process_order(process: Process | Hit) -> tuple[object, ...]:
    host = process["host"]
    return (host is None, host or "", _rank_order(process["rank"]), process["pid"])


def _rule_order(rule: str) -> tuple[int, str]:
    # The table's order, then rules a newer cgguard wrote, by name.
    return (NAMES.index(rule), "") if rule in NAMES else (len(NAMES), rule)


def _site_order(site: MergedSite) -> tuple[object, ...]:
    top = site["site"]
    return (
        -site["count"],
        _rule_order(site["rule"]),
        top["file"] if top else "",
        top["line"] if top else 0,
    )


# --- rendering ------------------------------------------------------------------------------


# Every text a report holds (names, code, messages, hosts, ranks, paths) came from elsewhere:
# each is shown safe (cgguard._safe_text) before it is put in a line.


def _where(top: FrameInfo | None) -> str:
    if not top:
        return "an unknown site"
    return f"{shown(top['file'])}:{top['line']} (in {shown(top['function'])})"


def _who(process: Process | Hit) -> str:
    parts = [shown(process["host"]) or _UNKNOWN_HOST, f"pid {process['pid']}"]
    if process["rank"] is not None:
        parts.append(f"rank {shown(process['rank'])}")
    return " ".join(parts)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun if count == 1 else noun + ('es' if noun.endswith('s') else 's')}"


def _headline(merged: Merged) -> str:
    count = sum(merged["totals"].values())
    found = (
        f"{_plural(count, 'violation')} at {_plural(len(merged['violations']), 'site')}"
        if count
        else "no violation"
    )
    exempted = sum(merged["exempted_totals"].values())
    if exempted:
        found += f"; {exempted} exempted"
    return (
        f"{_plural(merged['reports'], 'process')} on {_plural(len(merged['hosts']), 'host')}: "
        f"{found}"
    )


def _exempted_line(site: MergedExempted) -> str:
    return (
        f"{shown(site['rule'])} at {_where(site['site'])}: {site['count']} exempted by "
        f"{shown(site['exemption'])}, in "
        + ", ".join(f"{_who(h)} ({h['count']})" for h in site["processes"])
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


def render_text(merged: Merged) -> str:
    """For a person at a terminal."""
    lines = [f"cgguard report: {_headline(merged)}"]
    for site in merged["violations"]:
        lines += [
            "",
            f"{shown(site['rule'])} at {_where(site['site'])}: {site['count']} in "
            f"{_plural(len(site['processes']), 'process')}",
        ]
        lines += [f"  {_who(hit)}: {hit['count']}" for hit in site["processes"]]
        lines.append(f"  {shown(site['first'].get('message', ''))}")
        # format_frames made the stacks safe: each "\n" is one of their own line breaks.
        stacks = _stacks(dict(site["first"]))
        lines += [f"  {line}" if line else "" for line in _lines(stacks)]
    if merged["exempted"]:
        lines += ["", "exempted:"]
        lines += [f"  {_exempted_line(site)}" for site in merged["exempted"]]
    lines += ["", "processes:"]
    lines += [f"  {_process_line(process)}" for process in merged["processes"]]
    return "\n".join(lines) + "\n"


def render_json(merged: Merged) -> str:
    """For a machine: the merged view as one JSON document."""
    return json.dumps(merged, indent=2) + "\n"


def _cell(value: object) -> str:
    # A table cell is one line of literal text: no line break (\r included), no bare |, no
    # link or HTML of its own.
    return markdown(shown(value))


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(row) for row in rows)]


def _fence(lines: Sequence[str]) -> str:
    # Each line safe, so that the only line breaks are those between them (a \r would end a
    # line for CommonMark too); the fence longer than any line of backticks inside (indented
    # or not), so that the block cannot end early.
    lines = [safe(line) for line in lines]
    runs = (line.strip() for line in lines)
    longest = max((len(run) for run in runs if set(run) == {"`"}), default=0)
    ticks = "`" * max(3, longest + 1)
    return "\n".join((f"{ticks}text", *lines, ticks))


def render_markdown(merged: Merged) -> str:
    """For a CI summary or a pull request: tables, and each site's stacks in a code block."""
    lines = ["# cgguard report", "", f"{_headline(merged)}."]
    if merged["violations"]:
        lines += ["", "## Violations", ""]
        lines += _table(
            ["rule", "site", "count", "processes"],
            [
                [
                    site["rule"],
                    _where(site["site"]),
                    site["count"],
                    ", ".join(f"{_who(hit)} ({hit['count']})" for hit in site["processes"]),
                ]
                for site in merged["violations"]
            ],
        )
        for site in merged["violations"]:
            heading = f"{_cell(site['rule'])} at {_cell(_where(site['site']))}"
            # The message with the stacks, as the terminal shows them: in a code block, where
            # nothing it holds is read as Markdown.
            message = shown(site["first"].get("message", ""))
            stacks = _lines(_stacks(dict(site["first"])))
            lines += ["", f"### {heading}", "", _fence([message, *stacks])]
    if merged["exempted"]:
        lines += ["", "## Exempted", ""]
        lines += _table(
            ["rule", "site", "exemption", "count", "processes"],
            [
                [
                    site["rule"],
                    _where(site["site"]),
                    site["exemption"],
                    site["count"],
                    ", ".join(f"{_who(hit)} ({hit['count']})" for hit in site["processes"]),
                ]
                for site in merged["exempted"]
            ],
        )
    lines += ["", "## Processes", ""]
    lines += _table(
        ["host", "pid", *RANK_KEYS, "violations", "exempted", "report"],
        [
            [
                p["host"] or _UNKNOWN_HOST,
                p["pid"],
                *(value for _, value in _ranks(p)),
                p["violations"],
                p["exempted"],
                p["report"],
            ]
            for p in merged["processes"]
        ],
    )
    return "\n".join(lines) + "\n"


_RENDERERS = {"text": render_text, "json": render_json, "markdown": render_markdown}


def _byte_count(text: str) -> int:
    """--max-bytes: a whole number of bytes above 0."""
    import argparse

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
    from cgguard._runner import Parser

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
    with _escaping(sys.stdout, sys.stderr):
        try:
            reports = [(path, load(path, options.max_bytes)) for path in collect(options.paths)]
        except ReportError as exc:
            sys.stderr.write(f"cgguard report: {safe(str(exc))}\n")
            return 2
        except MemoryError:
            # Status 1 would say "violations found": a report too large for this machine is
            # a report that could not be read.
            sys.stderr.write("cgguard report: the reports do not fit in memory\n")
            return 2
        merged = merge(reports)
        sys.stdout.write(_RENDERERS[options.format](merged))
    return 1 if merged["totals"] else 0
