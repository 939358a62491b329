"""What cgguard says, as data: the schemas of docs/rules-and-events.md as types, and the one place
that builds violation events, repeats, the exit summary and the JSON report's document."""

from __future__ import annotations

import os
import platform
import threading
import time
from typing import TYPE_CHECKING, TypedDict, cast

from cgguard._frames import FrameInfo, render, where
from cgguard._rules import RULES, Cause
from cgguard._version import __version__, distribution_version

if TYPE_CHECKING:
    from types import CodeType

    from typing_extensions import NotRequired

    from cgguard._config import Config
    from cgguard._exemptions import Tally
    from cgguard._frames import Snapshot
    from cgguard._ledger import Ledger, Site

_RANK_VARIABLES = (("RANK", "rank"), ("LOCAL_RANK", "local_rank"), ("WORLD_SIZE", "world_size"))


class _Ranked(TypedDict):
    """The keys a distributed job's events and reports carry, where the launcher set them."""

    rank: NotRequired[int | str]
    local_rank: NotRequired[int | str]
    world_size: NotRequired[int | str]


class ViolationEvent(_Ranked):
    """``cgguard.capture_violation``: one violation, in full, or a repeat at its site, briefly."""

    event: str
    level: str  # "error" when raised, "warning" when logged
    rule: str
    action: str  # "raised" or "logged"
    api: str
    message: str
    count: int
    thread: str
    thread_id: int | None
    pid: int
    timestamp: str
    stack: NotRequired[list[FrameInfo]]
    outer_stack: NotRequired[list[FrameInfo]]
    disabled_stack: NotRequired[list[FrameInfo] | None]
    other_stack: NotRequired[list[FrameInfo]]
    other_thread_id: NotRequired[int]
    capture_stack: NotRequired[list[FrameInfo]]
    capture_thread_id: NotRequired[int | None]
    site: NotRequired[FrameInfo | None]  # a repeat only, in place of the stacks


class ExemptedEvent(_Ranked):
    """``cgguard.capture_exempted``: the first capture an exemption let through at a site."""

    event: str
    level: str  # "debug"
    rule: str
    action: str  # "exempted"
    api: str
    message: str
    exemption: str  # the exemption that matched, as written: "capture_disabled=torch._inductor."
    matched: FrameInfo  # the frame it matched, torch's own included
    count: int
    thread: str
    thread_id: int | None
    pid: int
    timestamp: str
    stack: list[FrameInfo]


class SiteCount(TypedDict):
    """One site in the exit summary."""

    rule: str
    count: int
    file: str | None
    line: int | None
    function: str | None


class ExemptedSiteCount(SiteCount):
    """One site of exempted captures in the exit summary, with the exemption that matched."""

    exemption: str


class SummaryEvent(_Ranked):
    """``cgguard.summary``: the run's counts per rule and per site, at exit."""

    event: str
    level: str  # "warning"; "info" when every capture seen was exempted
    pid: int
    timestamp: str
    totals: dict[str, int]
    sites: list[SiteCount]
    exempted_totals: NotRequired[dict[str, int]]  # where an exemption let a capture through
    exempted_sites: NotRequired[list[ExemptedSiteCount]]


class ReportViolation(TypedDict):
    """A distinct violation in the JSON report: its rule, count and first full event."""

    rule: str
    count: int
    first: ViolationEvent


class ReportExempted(TypedDict):
    """Captures an exemption let through at one site, in the JSON report."""

    rule: str
    count: int
    exemption: str
    first: ExemptedEvent


class ReportDocument(_Ranked):
    """The JSON report."""

    cgguard: str
    python: str
    torch: str | None
    host: str  # so that reports gathered from several machines merge (cgguard report)
    pid: int
    written_at: str
    config: dict[str, object]
    totals: dict[str, int]
    violations: list[ReportViolation]
    exempted_totals: dict[str, int]
    exempted: list[ReportExempted]
    job: NotRequired[str]  # the run sharing a report path without {pid}


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
    stack: Snapshot,
    cause_stack: Snapshot | None,
    cause: Cause,
    *,
    action: str,
    count: int,
    thread: tuple[str, int | None] | None = None,
) -> ViolationEvent:
    """A violation as the full event docs/rules-and-events.md documents.

    ``cause_stack`` is where the cause happened, if known; ``cause`` says the rest, its
    ``where`` completed here from the cause's stack when there is one.
    """
    spec = RULES[rule]
    event = _common(rule, api, action, count, thread)
    frames = render(stack)
    event["stack"] = frames
    cause_frames = render(cause_stack) if cause_stack is not None else None
    if spec.cause_key is not None:
        event[spec.cause_key] = cause_frames
    if rule == "concurrent_capture":
        event["other_thread_id"] = cause.thread_id
    elif rule == "sync_during_capture":
        event["capture_thread_id"] = cause.thread_id
    if cause_frames is not None:
        cause = cause.completed(where(cause_frames))
    event["message"] = spec.message(f"{api} at {where(frames)}", cause)
    return cast("ViolationEvent", event)


def repeat(site: Site, count: int, top: FrameInfo | None) -> ViolationEvent:
    """A brief report of a repeat: the count and the site, no stacks."""
    event = _common(site.rule, site.api, site.action, count)
    event["message"] = f"repeated {count} times at {where([top] if top else [])}"
    event["site"] = top
    return cast("ViolationEvent", event)


def exempted(
    rule: str, api: str, stack: Snapshot, exemption: str, matched: FrameInfo
) -> ExemptedEvent:
    """The first capture ``exemption`` let through at a site, logged at debug level."""
    event = _common(rule, api, "exempted", 1)
    event.update(event="cgguard.capture_exempted", level="debug")
    frames = render(stack)
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
    sites = [_site_count(site.rule, site.count, ledger.where(site)) for site in ledger.sites()]
    exempted = exempt.sites() if exempt is not None else []
    level = "warning" if sites or not exempted else "info"
    event: dict[str, object] = {"event": "cgguard.summary", "level": level, "pid": os.getpid()}
    event.update(ranks())
    event.update(timestamp=timestamp(time.time()), totals=ledger.totals(), sites=sites)
    if exempt is not None and exempted:
        event["exempted_totals"] = exempt.totals()
        event["exempted_sites"] = [
            {**_site_count(s.rule, s.count, _where(s.code, s.lasti)), "exemption": s.exemption}
            for s in exempted
        ]
    return cast("SummaryEvent", event)


def _where(code: CodeType | None, lasti: int) -> FrameInfo | None:
    """The user's frame at (code, lasti), rendered."""
    frames = render((code, lasti)) if code is not None else []
    return frames[-1] if frames else None


def document(config: Config, ledger: Ledger, exempt: Tally | None = None) -> ReportDocument:
    """The JSON report as a JSON-ready value."""
    violations: list[ReportViolation] = [
        {"rule": site.rule, "count": site.count, "first": site.first}
        for site in ledger.sites()
        if site.first is not None
    ]
    doc: dict[str, object] = {
        "cgguard": __version__,
        "python": platform.python_version(),
        "torch": distribution_version("torch"),
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
    return cast("ReportDocument", doc)
