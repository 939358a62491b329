"""What every view of ``cgguard report`` says alike: the headline, a process and a site named,
counts by action taken, and the processes shown where a job has more than a view lists.

Every text a report holds (names, code, messages, hosts, ranks, paths) came from elsewhere:
each is shown safe (cgguard._support.text) before it is put in a line; a view that has a syntax
of its own (Markdown, HTML) escapes the line as it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cgguard._commands.report_merge import ACTIONS, LOGGED, RAISED, top_hits
from cgguard._data.census_merge import counted
from cgguard._reporting.log import format_stacks
from cgguard._support.frames import format_frames, where
from cgguard._support.text import safe, shown

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cgguard._commands.report_merge import JobRuleSite, Merged, Process
    from cgguard._data.rank_compare import RankDifference
    from cgguard._support.frames import FrameInfo

UNKNOWN_HOST = "unknown host"  # a report written before reports carried the host name
# The processes a view names under each site and in its list of processes, unless --top says
# otherwise: as many as the exit summary names capture sites (the census's top five).
TOP = 5


def site_line(top: FrameInfo | None) -> str:
    """A site's frame as one-line messages name it, shown safe."""
    return safe(where([top])) if top else "an unknown site"


def who(process: Process) -> str:
    """A process by host, pid and rank (where known), shown safe."""
    parts = [shown(process["host"]) or UNKNOWN_HOST, f"pid {process['pid']}"]
    if process["rank"] is not None:
        parts.append(f"rank {shown(process['rank'])}")
    return " ".join(parts)


def more_processes(left: int, violations: int, what: str = "violation") -> str:
    """The processes a list leaves out: "and 3 more processes (7 violations)"."""
    return f"and {counted(left, 'more process', 'more processes')} ({counted(violations, what)})"


def hits(site: JobRuleSite, top: int, what: str = "violation") -> str:
    """The processes that hit ``site``, the most first, each with its count; past ``top``, how
    many more."""
    shown_hits, left, rest = top_hits(site, top)
    named = [f"{who(process)} ({count})" for process, count in shown_hits]
    if left:
        named.append(more_processes(left, rest, what))
    return ", ".join(named)


def actions_text(actions: Mapping[str, int], total: int) -> str:
    """Counts by action (as in_order() orders them), those of none left out: "1 raised, 5
    logged"; and "2 not listed" for violations a report counted at a site it did not list yet
    (its first event was still being written)."""
    raised, logged = actions.get(RAISED, 0), actions.get(LOGGED, 0)
    if len(actions) == len(ACTIONS) and raised + logged == total:
        # Nearly every site's, and a view words a million sites: without the loop below.
        if not raised:
            return f"{logged} logged"
        return f"{raised} raised" if not logged else f"{raised} raised, {logged} logged"
    parts = []
    listed = 0
    for action, count in actions.items():
        if count:
            # An action this cgguard names is its own word; any other is a report's text.
            parts.append(f"{count} {action if action in ACTIONS else shown(action)}")
            listed += count
    if total > listed:
        parts.append(f"{total - listed} not listed")
    return ", ".join(parts)


def headline(merged: Merged) -> str:
    """The job in a line: its processes and hosts, its violations by action, what was exempted."""
    count = sum(merged.totals.values())
    found = (
        f"{counted(count, 'violation')} at {counted(len(merged.violations), 'site')} "
        f"({actions_text(merged.actions, count)})"
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


def site_head(site: JobRuleSite) -> str:
    """A site's line: its rule and place, its count, in how many processes, by action."""
    return (
        f"{shown(site.rule)} at {site_line(site.top)}: {site.count} in "
        f"{counted(len(site.hits), 'process', 'processes')} "
        f"({actions_text(site.actions(), site.count)})"
    )


def merged_what(merged: Merged) -> list[str]:
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
        name = f"{shown(same['host']) or UNKNOWN_HOST} pid {same['pid']}"
        if same["job"] is not None:
            name += f" job {shown(same['job'])}"
        lines.append(
            f"{name}: {len(same['reports'])} different reports, each counted as a process: "
            + ", ".join(shown(report) for report in same["reports"])
        )
    return lines


def exempted_line(site: JobRuleSite, top: int) -> str:
    """A site of exempted captures in a line: where, how many, by which exemption, in which
    processes."""
    return (
        f"{shown(site.rule)} at {site_line(site.top)}: {site.count} exempted by "
        f"{shown(site.exemption)}, in {hits(site, top, 'exempted')}"
    )


def stacks(event: dict[str, Any]) -> str:
    """The first event's stacks as the console shows them; plain frames for a rule unknown
    to this cgguard."""
    text = format_stacks(event)
    if text or not isinstance(event.get("stack"), list):
        return text
    return "The call was made at (most recent call last):\n" + format_frames(event["stack"])


def lines_of(text: str) -> list[str]:
    """``text``'s lines; none for no text."""
    # Only "\n": the text is safe, so it holds no other line break of its own.
    return text.split("\n") if text else []


def ranks(process: Process) -> list[tuple[str, int | str | None]]:
    """A process's rank, local rank and world size, None where its launcher set none."""
    return [
        ("rank", process["rank"]),
        ("local_rank", process["local_rank"]),
        ("world_size", process["world_size"]),
    ]


def found_text(process: Process) -> str:
    """A process's violations per rule and by action, or "no violation", and what was
    exempted."""
    notes = []
    if process["violations"]:
        found = ", ".join(f"{shown(rule)} {count}" for rule, count in process["totals"].items())
        notes.append(actions_text(process["actions"], process["violations"]))
    else:
        found = "no violation"
    if process["exempted"]:
        notes.append(f"{process['exempted']} exempted")
    return f"{found} ({'; '.join(notes)})" if notes else found


def process_line(process: Process) -> str:
    """A process in a line: host and pid, its ranks, what it found, its report."""
    numbers = " ".join(
        f"{key} {shown(value)}" for key, value in ranks(process) if value is not None
    )
    head = f"{shown(process['host']) or UNKNOWN_HOST} pid {process['pid']}"
    parts = (head, numbers, found_text(process), shown(process["report"]))
    return "  ".join(part for part in parts if part)


def rest_line(rest: list[Process]) -> str:
    """The processes a list leaves out, in a line: how many, and how many of them violated."""
    violating = sum(1 for process in rest if process["violations"])
    return (
        f"and {counted(len(rest), 'more process', 'more processes')}: "
        f"{violating} with a violation, {len(rest) - violating} without"
    )


# The tables the Markdown view and the HTML page both hold: their columns, and a row's values.
SITE_COLUMNS = ("rule", "site", "count", "raised", "logged", "processes")
PROCESS_COLUMNS = ("host", "pid", "rank", "local_rank", "world_size", "violations", "raised",
                   "logged", "exempted", "report")  # fmt: skip
DIFFERENCE_COLUMNS = ("kind", "ranks", "differ from", "capture", "where they part")
EXEMPTED_COLUMNS = ("rule", "site", "exemption", "count", "processes")


def site_row(site: JobRuleSite, top: int) -> list[object]:
    """A violating site's row: rule, place, count, raised, logged, the processes that hit it."""
    actions = site.actions()
    place = site_line(site.top)
    return [site.rule, place, site.count, actions[RAISED], actions[LOGGED], hits(site, top)]


def exempted_row(site: JobRuleSite, top: int) -> list[object]:
    """An exempted site's row: rule, place, exemption, count, the processes it let through."""
    place = site_line(site.top)
    return [site.rule, place, site.exemption, site.count, hits(site, top, "exempted")]


def process_row(process: Process) -> list[object]:
    """A process's row: where it ran, its ranks, its counts, its report."""
    return [
        process["host"] or UNKNOWN_HOST,
        process["pid"],
        *(value for _, value in ranks(process)),
        process["violations"],
        process["actions"][RAISED],
        process["actions"][LOGGED],
        process["exempted"],
        process["report"],
    ]


def difference_row(difference: RankDifference) -> list[object]:
    """A difference between ranks' row: its kind, both sides, the capture, where they part."""
    return [
        difference.kind,
        ", ".join(map(str, difference.ranks)),
        ", ".join(map(str, difference.others)),
        difference.capture,
        difference.detail,
    ]
