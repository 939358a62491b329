"""What cgguard says: the one place that builds violation events, repeats, the exit summary and
the JSON report's document, each of the shape cgguard._data.schema names."""

from __future__ import annotations

import functools
import os
import platform
import threading
import time
from typing import TYPE_CHECKING, cast

from cgguard._data.census_merge import counted, sites_in
from cgguard._data.schema import RANK_KEYS, REPORT_SCHEMA
from cgguard._rules.table import RULES, Cause
from cgguard._support.frames import where
from cgguard._version import __version__, distribution_version

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cgguard._config.config import Config
    from cgguard._data.census import Census
    from cgguard._data.ledger import Ledger, RuleSite, Tally
    from cgguard._data.manifest import Manifest
    from cgguard._data.schema import (
        CaptureEntry,
        CensusEvent,
        ExemptedEvent,
        ReportDocument,
        ReportViolation,
        SiteCount,
        SkipEntry,
        SummaryEvent,
        ViolationEvent,
    )
    from cgguard._support.frames import FrameInfo, Stack

# Where a launcher says which process of a distributed job this is: (variable, key).
_RANK_VARIABLES = tuple(zip(("RANK", "LOCAL_RANK", "WORLD_SIZE"), RANK_KEYS, strict=True))


def ranks() -> dict[str, int | str]:
    """RANK, LOCAL_RANK and WORLD_SIZE where set: a distributed job's reports, told apart.

    A plain decimal number becomes an int; anything else is kept as the string it is.
    """
    found: dict[str, int | str] = {}
    for variable, key in _RANK_VARIABLES:
        value = os.environ.get(variable)
        if value is not None:
            # Not isdigit(): it is true for "²", which int() rejects.
            found[key] = int(value) if value.isascii() and value.isdecimal() else value
    return found


def timestamp(now: float) -> str:
    """ISO 8601 in UTC with microseconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def _common(
    rule: str, api: str, action: str, count: int, thread: tuple[str, int | None] | None = None
) -> dict[str, object]:
    """The keys every violation event starts with, in schema order; ``thread`` (name, id)
    where it happened, if not on the calling thread."""
    now = time.time()
    if thread is None:
        current = threading.current_thread()
        thread = (current.name, current.ident)
    event: dict[str, object] = {
        "event": "cgguard.capture_violation",
        "level": "error" if action == "raised" else "warning",
        "rule": rule,
        "action": action,
        "api": api,
        "message": "",
        "count": count,
        "thread": thread[0],
        "thread_id": thread[1],
        "pid": os.getpid(),
    }
    event.update(ranks())
    event["timestamp"] = timestamp(now)
    return event


def violation(
    rule: str,
    api: str,
    stack: Stack,
    cause_stack: Stack | None,
    cause: Cause,
    *,
    action: str,
    count: int,
    thread: tuple[str, int | None] | None = None,
    more: Mapping[str, Stack | None] | None = None,
) -> ViolationEvent:
    """A violation as the full event docs/rules-and-events.md documents.

    ``cause_stack`` is where the cause happened, if known; ``cause`` says the rest, its
    ``where`` completed here from the cause's stack when there is one. ``more`` holds the
    further stacks the rule's table entry names (None: not known); its ``why`` may name each
    one's place as ``{key}``.
    """
    spec = RULES[rule]
    event = _common(rule, api, action, count, thread)
    frames = stack.frames
    event["stack"] = frames
    cause_frames = cause_stack.frames if cause_stack is not None else None
    if spec.cause_key is not None:
        event[spec.cause_key] = cause_frames
    if spec.thread_key is not None:
        event[spec.thread_key] = cause.thread_id
    if spec.more_stacks:
        places = {}
        for key, _ in spec.more_stacks:
            known = (more or {}).get(key)
            more_frames = known.frames if known is not None else None
            event[key] = more_frames
            places[key] = where(more_frames) if more_frames else "an unknown place"
        # Each declared {key} replaced, the rest of the text taken as it is: it names tensors
        # and bindings the program wrote, braces and all.
        why = cause.why
        for key, place in places.items():
            why = why.replace("{" + key + "}", place)
        cause = cause.explained(why)
    if cause_frames is not None:
        cause = cause.completed(where(cause_frames))
    event["message"] = spec.message(f"{api} at {where(frames)}", cause)
    return cast("ViolationEvent", event)


def repeat(site: RuleSite, count: int, top: FrameInfo | None) -> ViolationEvent:
    """A brief report of a repeat: the count and the site, no stacks."""
    event = _common(site.rule, site.api, site.action, count)
    event["message"] = f"repeated {count} times at {where([top] if top else [])}"
    event["site"] = top
    return cast("ViolationEvent", event)


def exempted(
    rule: str, api: str, stack: Stack, exemption: str, matched: FrameInfo
) -> ExemptedEvent:
    """The first capture ``exemption`` let through at a site, logged at debug level."""
    event = _common(rule, api, "exempted", 1)
    event.update(event="cgguard.capture_exempted", level="debug")
    frames = stack.frames
    at = where([matched])
    event["message"] = f"{rule} exempted by {exemption} (matched {at}): {api} at {where(frames)}"
    event.update(exemption=exemption, matched=matched, count=1)
    event["stack"] = frames
    return cast("ExemptedEvent", event)


def _site_count(rule: str, count: int, top: FrameInfo | None) -> SiteCount:
    return {
        "rule": rule,
        "count": count,
        "file": top["file"] if top else None,
        "line": top["line"] if top else None,
        "function": top["function"] if top else None,
    }


def summary(ledger: Ledger, exempt: Tally | None = None) -> SummaryEvent:
    """The ``cgguard.summary`` event: counts per rule and per site, and of exempted captures."""
    sites = [_site_count(site.rule, site.count, site.frame()) for site in ledger.sites()]
    exempted = exempt.sites() if exempt is not None else []
    level = "warning" if sites or not exempted else "info"
    event: dict[str, object] = {"event": "cgguard.summary", "level": level, "pid": os.getpid()}
    event.update(ranks())
    event.update(timestamp=timestamp(time.time()), totals=ledger.totals(), sites=sites)
    if exempt is not None and exempted:
        event["exempted_totals"] = exempt.totals()
        event["exempted_sites"] = [
            {**_site_count(s.rule, s.count, s.frame()), "exemption": s.exemption} for s in exempted
        ]
    return cast("SummaryEvent", event)


@functools.cache
def _torch_version() -> str | None:
    """torch's installed version, looked up once: a look-up reads package metadata from disk,
    and the report is written once per new site while it is small."""
    return distribution_version("torch")


# The exit summary names at most this many capture sites, the slowest first; and this many of
# torch.compile's skips, the most counted first, each example cut to this many characters (the
# report keeps every skip the census keeps, and more of each example).
TOP_SITES = 5
TOP_SKIPS = 5
SKIP_EXAMPLE_SHOWN = 200


def census_totals(
    captures: list[CaptureEntry], skips: list[SkipEntry], *, replays: bool
) -> dict[str, object]:
    """The census's totals: captures, sites, seconds, bytes (null where nothing was measured),
    outcomes, skipped compiled graphs, and graphs never replayed where replays are counted."""
    outcomes: dict[str, int] = {}
    for site in captures:
        for outcome, count in site["outcomes"].items():
            outcomes[outcome] = outcomes.get(outcome, 0) + count
    measured = [site for site in captures if site["bytes_reserved"] is not None]
    totals: dict[str, object] = {
        "captures": sum(site["count"] for site in captures),
        "sites": sites_in(captures),
        "seconds": round(sum(site["seconds"] for site in captures), 9),
        "bytes_reserved": sum(s["bytes_reserved"] or 0 for s in measured) if measured else None,
        "bytes_allocated": sum(s["bytes_allocated"] or 0 for s in measured) if measured else None,
        "outcomes": outcomes,
        "cudagraph_skips": sum(skip["count"] for skip in skips),
    }
    if replays:
        totals["never_replayed"] = sum(site.get("never_replayed", 0) for site in captures)
    return totals


def census_line(totals: dict[str, object]) -> str:
    """The census's totals as the summary's one line."""
    grown = totals["bytes_reserved"]
    weight = "bytes not measured" if grown is None else f"{grown} bytes reserved"
    captures, sites = cast("int", totals["captures"]), cast("int", totals["sites"])
    skipped = cast("int", totals["cudagraph_skips"])
    line = (
        f"{counted(captures, 'capture')} at {counted(sites, 'site')}, "
        f"{totals['seconds']:.6f} s, {weight}; {counted(skipped, 'compiled graph')} skipped"
    )
    if "never_replayed" in totals:
        never = cast("int", totals["never_replayed"])
        line += f"; {counted(never, 'graph')} never replayed"
    return line


def census(counted: Census) -> CensusEvent:
    """The ``cgguard.census`` event: the totals, in one line and as values, the top sites and
    the most counted skips, their examples cut."""
    captures, skips = counted.captures(), counted.skips()
    totals = census_totals(captures, skips, replays=counted.replays)
    top = sorted(captures, key=lambda site: -site["seconds"])[:TOP_SITES]
    top_skips: list[SkipEntry] = [
        {**skip, "example": skip["example"][:SKIP_EXAMPLE_SHOWN]}
        for skip in sorted(skips, key=lambda skip: -skip["count"])[:TOP_SKIPS]
    ]
    event: dict[str, object] = {
        "event": "cgguard.census",
        "level": "info",
        "message": census_line(totals),
        "pid": os.getpid(),
    }
    event.update(ranks())
    event.update(
        timestamp=timestamp(time.time()), totals=totals, captures=top, cudagraph_skips=top_skips
    )
    return cast("CensusEvent", event)


def document(
    config: Config,
    ledger: Ledger,
    exempt: Tally | None = None,
    counted: Census | None = None,
    manifest: Manifest | None = None,
) -> ReportDocument:
    """The JSON report as a JSON-ready value; with the census's sections where it is on, and
    the capture manifest where it is recorded."""
    violations: list[ReportViolation] = [
        {"rule": site.rule, "count": site.count, "first": cast("ViolationEvent", site.first)}
        for site in ledger.sites()
        if site.first is not None
    ]
    doc: dict[str, object] = {
        "schema": REPORT_SCHEMA,
        "cgguard": __version__,
        "python": platform.python_version(),
        "torch": _torch_version(),
        "host": platform.node(),
        "pid": os.getpid(),
    }
    doc.update(ranks())
    doc.update(
        written_at=timestamp(time.time()),
        config=config.as_dict(),
        totals=ledger.totals(),
        violations=violations,
        exempted_totals=exempt.totals() if exempt is not None else {},
        exempted=[
            {"rule": s.rule, "count": s.count, "exemption": s.exemption, "first": s.first}
            for s in (exempt.sites() if exempt is not None else [])
            if s.first is not None
        ],
    )
    if counted is not None and config.census:
        doc.update(captures=counted.captures(), cudagraph_skips=counted.skips())
    if manifest is not None and manifest.recording:
        doc["manifest"] = manifest.document()
    return cast("ReportDocument", doc)
