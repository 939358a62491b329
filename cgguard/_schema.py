"""What cgguard says, as types: the events and the JSON report of docs/rules-and-events.md.

Types only, so that the modules that build these values (cgguard._events) and those that keep
what they hold (cgguard._ledger, cgguard._exempt_match) share them without importing each other;
``cgguard report`` checks the reports it reads against them (cgguard._report_merge).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from typing_extensions import NotRequired

    from cgguard._frames import FrameInfo

# The keys a distributed job's events and reports carry, where its launcher set them.
RANK_KEYS = ("rank", "local_rank", "world_size")


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
