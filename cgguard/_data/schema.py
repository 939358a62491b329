"""What cgguard says, as types: the events and the JSON report of docs/rules-and-events.md.

The modules that build these values (cgguard._reporting.events) and those that keep what they hold
(cgguard._data.ledger, cgguard._rules.exempt_match) share them without importing each other, and
``cgguard report`` checks the reports it reads against them with ``problem()``
(cgguard._support.typecheck): the TypedDicts are the schema, and there is no second description
of it to keep in step.

Optional keys live in ``total=False`` bases, and every name an annotation uses is importable
here at run time, so that ``typing.get_type_hints`` reads them on every supported Python
without typing_extensions.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from cgguard._support.frames import FrameInfo  # noqa: TC001 - the check reads annotations at run time
from cgguard._support.typecheck import AtLeast

# The keys a distributed job's events and reports carry, where its launcher set them.
RANK_KEYS = ("rank", "local_rank", "world_size")

# The report's schema version: a report without a "schema" key is of version 1. A later
# version is one this cgguard cannot read right, not one with keys it does not know: keys added
# since are optional, and unknown keys are let through.
# Version 2 added the census's optional "captures" and "cudagraph_skips" sections.
REPORT_SCHEMA = 2


Count = Annotated[int, AtLeast(0)]  # a count that may be nothing yet: a rule's total
# Seconds: JSON writes a float, and a reader of another writer may find a whole number. Never
# NaN, infinite or negative: a time taken is none of them, and a report's are added up.
Seconds = Annotated[float | int, AtLeast(0)]
Positive = Annotated[int, AtLeast(1)]  # a count of something seen: a site's count


class _Ranked(TypedDict, total=False):
    """The keys a distributed job's events and reports carry, where the launcher set them."""

    rank: int | str
    local_rank: int | str
    world_size: int | str


class _ViolationOptional(_Ranked, total=False):
    # A full event has ``stack`` and its rule's cause; a repeat has ``site`` instead.
    stack: list[FrameInfo]
    outer_stack: list[FrameInfo]
    disabled_stack: list[FrameInfo] | None
    other_stack: list[FrameInfo]
    other_thread_id: int
    capture_stack: list[FrameInfo]
    capture_thread_id: int | None
    read_stack: list[FrameInfo] | None  # dead_input: where the capture first read the tensor
    freed_stack: list[FrameInfo] | None  # dead_input: where its storage was freed, if known
    rebound_stack: list[FrameInfo] | None  # stale_binding: where the name was rebound, if seen
    site: FrameInfo | None  # a repeat only, in place of the stacks


class ViolationEvent(_ViolationOptional):
    """``cgguard.capture_violation``: one violation, in full, or a repeat at its site, briefly."""

    event: str
    level: str  # "error" when raised, "warning" when logged
    rule: str
    action: str  # "raised" or "logged"
    api: str
    message: str
    count: Positive
    thread: str
    thread_id: int | None
    pid: int
    timestamp: str


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
    count: Positive
    thread: str
    thread_id: int | None
    pid: int
    timestamp: str
    stack: list[FrameInfo]


class SiteCount(TypedDict):
    """One site in the exit summary."""

    rule: str
    count: Positive
    file: str | None
    line: int | None
    function: str | None


class ExemptedSiteCount(SiteCount):
    """One site of exempted captures in the exit summary, with the exemption that matched."""

    exemption: str


class _SummaryOptional(_Ranked, total=False):
    exempted_totals: dict[str, Count]  # where an exemption let a capture through
    exempted_sites: list[ExemptedSiteCount]


class SummaryEvent(_SummaryOptional):
    """``cgguard.summary``: the run's counts per rule and per site, at exit."""

    event: str
    level: str  # "warning"; "info" when every capture seen was exempted
    pid: int
    timestamp: str
    totals: dict[str, Count]
    sites: list[SiteCount]


class ReportViolation(TypedDict):
    """A distinct violation in the JSON report: its rule, count and first full event."""

    rule: str
    count: Positive
    first: ViolationEvent


class ReportExempted(TypedDict):
    """Captures an exemption let through at one site, in the JSON report."""

    rule: str
    count: Positive
    exemption: str
    first: ExemptedEvent


class _CaptureOptional(TypedDict, total=False):
    # Only where replays are counted (census_replays).
    replays: Count
    never_replayed: Count  # graphs captured here (ended) that were never replayed
    # Only in `cgguard report`'s merge: the process whose captures here took longest.
    slowest: SlowestProcess
    processes: Positive  # how many processes captured here
    # Only in the row of the other sites, past the census's bound (4,096 sites): how many
    # sites it counts for (merged: summed over the processes, so at most that many places).
    other_sites: Positive


class SlowestProcess(TypedDict):
    """The process of a job whose captures at one site took the most seconds in all."""

    pid: int | None
    host: str | None
    rank: int | str | None
    seconds: Seconds
    count: Positive


class CaptureEntry(_CaptureOptional):
    """The census of one capture site: every capture begun at one place in the user's code."""

    file: str | None
    line: int | None
    function: str | None
    count: Positive  # captures begun here, refused ones included
    seconds: Seconds  # capture_begin to the end of capture_end, summed (ended and failed)
    max_seconds: Seconds
    bytes_reserved: int | None  # growth of the device's reserved bytes, summed; null: unmeasured
    bytes_allocated: int | None
    outcomes: dict[str, Count]  # "ended", "failed", "refused", "abandoned"
    errors: dict[str, Count]  # failed captures by the error's type
    apis: dict[str, Count]
    modes: dict[str, Count]
    threads: dict[str, Count]
    pools: dict[str, Count]  # "private", or "shared (HANDLE)"
    devices: dict[str, Count] | None  # "cuda:N"; null where no capture was measured


class SkipEntry(TypedDict):
    """Graphs torch.compile compiled without a CUDA graph, for one reason at one call site."""

    reason: str  # grouped: without node names, lists and numbers
    count: Positive
    example: str  # torch's full message, the first time
    file: str | None  # the user's call of the compiled function
    line: int | None
    function: str | None


class CensusReport(TypedDict):
    """``cgguard.census()``: the report's two census sections."""

    captures: list[CaptureEntry]
    cudagraph_skips: list[SkipEntry]


class CensusEvent(_Ranked):
    """``cgguard.census``: the run's capture census, at exit."""

    event: str
    level: str  # "info"
    message: str  # the totals, one line
    pid: int
    timestamp: str
    totals: dict[str, object]
    captures: list[CaptureEntry]  # the top sites, by seconds
    cudagraph_skips: list[SkipEntry]


class ManifestCollective(TypedDict):
    """One collective issued inside a capture, on the capturing thread (cgguard._data.manifest)."""

    op: str  # torch.distributed's function: "all_reduce", "all_gather_into_tensor", ...
    ranks: list[int] | None  # the group's global ranks; null where torch.distributed cannot say
    dtype: str | None  # the payload's, "float32"; null for a barrier
    numel: Count  # the payload's elements (summed over a list of tensors)


class _ManifestCaptureOptional(TypedDict, total=False):
    collectives_dropped: Positive  # collectives past the ones kept


class ManifestCapture(_ManifestCaptureOptional):
    """One capture of a process, in the order begun."""

    site: str  # "file:line (in function)", or "an unknown site"
    key: str  # "call N" (its ordinal at its site), or "N inputs DIGEST" where inspection saw them
    outcome: str  # the census's: "ended", "failed", "refused", "abandoned"; "open" while under way
    collectives: list[ManifestCollective]


class ManifestDocument(TypedDict):
    """A process's capture manifest: its rank identity, its captures in order (the first
    ones, cgguard._data.manifest.KEPT), and every capture counted per site."""

    identity: dict[str, int | str]  # rank, local_rank, world_size, dist_rank, dist_world_size
    captures: list[ManifestCapture]
    per_site: dict[str, Positive]
    later: Count  # captures past those kept in order


class _ReportOptional(_Ranked, total=False):
    # Keys a report written before they existed lacks; later sections are optional too.
    host: str  # so that reports gathered from several machines merge (cgguard report)
    exempted_totals: dict[str, Count]
    exempted: list[ReportExempted]
    job: str  # the run sharing a report path without {pid}
    schema: Positive  # REPORT_SCHEMA; absent in version 1
    captures: list[CaptureEntry]  # the census (version 2), where it was on
    cudagraph_skips: list[SkipEntry]
    manifest: ManifestDocument  # where the process has a rank identity and the manifest is on


class ReportDocument(_ReportOptional):
    """The JSON report."""

    cgguard: str
    python: str
    torch: str | None
    pid: int
    written_at: str
    config: dict[str, object]
    totals: dict[str, Count]
    violations: list[ReportViolation]
