"""What cgguard says, as types: the events and the JSON report of docs/rules-and-events.md.

The modules that build these values (cgguard._reporting.events) and those that keep what they hold
(cgguard._data.ledger, cgguard._rules.exempt_match) share them without importing each other, and
``cgguard report`` checks the reports it reads against them with ``problem()``: the TypedDicts
are the schema, and there is no second description of it to keep in step.

Optional keys live in ``total=False`` bases, and every name an annotation uses is importable
here at run time, so that ``typing.get_type_hints`` reads them on every supported Python
without typing_extensions.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Annotated, TypedDict

from cgguard._support.frames import FrameInfo  # noqa: TC001 - the check reads annotations at run time

if TYPE_CHECKING:
    from collections.abc import Callable

# The keys a distributed job's events and reports carry, where its launcher set them.
RANK_KEYS = ("rank", "local_rank", "world_size")

# The report's schema version: a report without a "schema" key is of version 1. A later
# version is one this cgguard cannot read right, not one with keys it does not know: keys added
# since are optional, and unknown keys are let through.
# Version 2 added the census's optional "captures" and "cudagraph_skips" sections.
REPORT_SCHEMA = 2


class AtLeast:
    """The least value of an ``Annotated[int, AtLeast(n)]``, which ``problem()`` checks."""

    __slots__ = ("least",)

    def __init__(self, least: int) -> None:
        self.least = least


Count = Annotated[int, AtLeast(0)]  # a count that may be nothing yet: a rule's total
# Seconds: JSON writes a float, and a reader of another writer may find a whole number.
Seconds = float | int
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


class _ReportOptional(_Ranked, total=False):
    # Keys a report written before they existed lacks; later sections are optional too.
    host: str  # so that reports gathered from several machines merge (cgguard report)
    exempted_totals: dict[str, Count]
    exempted: list[ReportExempted]
    job: str  # the run sharing a report path without {pid}
    schema: Positive  # REPORT_SCHEMA; absent in version 1
    captures: list[CaptureEntry]  # the census (version 2), where it was on
    cudagraph_skips: list[SkipEntry]


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


# --- checking a parsed JSON value against one of these types ---------------------------------

# A failure: the path to the value at fault, innermost part first (built only on the way out
# of a failed check, so that a good value costs no text), and what was wrong with it.
_Failure = tuple[list[str], str]

_checks: dict[object, Callable[[object], _Failure | None]] = {}
_MISSING = object()


def problem(value: object, schema: type) -> str | None:
    """What keeps ``value``, as ``json.loads`` returns it, from being a ``schema``, or None.

    ``schema`` is a TypedDict of this module (or any built of the same parts: ``str``,
    ``int`` (a bool is not one), ``None``, ``object`` (anything), unions, ``list[...]``,
    ``dict[str, ...]``, ``Annotated[int, AtLeast(n)]`` and nested TypedDicts). Required keys
    must be there and optional ones may be missing; keys the schema does not name are let
    through, so that reports of a later cgguard stay readable. The first fault is named by
    its path: ``violations[0].first.stack[1]: no "code"``.
    """
    failure = _check(schema)(value)
    if failure is None:
        return None
    parts, what = failure
    path = "".join(reversed(parts)).removeprefix(".")
    return f"{path}: {what}" if path else what


def _check(schema: object) -> Callable[[object], _Failure | None]:
    """The check of ``schema``, made once per type."""
    check = _checks.get(schema)
    if check is None:
        check = _checks[schema] = _made(schema)
    return check


def _kind(value: object) -> str:
    """What a JSON value is, in the words of a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return {int: "a whole number", float: "a number", str: "text", list: "a list"}.get(
        type(value), "an object" if isinstance(value, dict) else type(value).__name__
    )


def _wrong(expected: str, value: object) -> _Failure:
    return [], f"{expected} expected, found {_kind(value)}"


def _words(schema: object) -> str:
    """What ``schema`` accepts, in the words of a message."""
    origin = typing.get_origin(schema)
    if origin is Annotated:
        base, *extras = typing.get_args(schema)
        least = [extra.least for extra in extras if isinstance(extra, AtLeast)]
        return f"{_words(base)} of {least[0]} or more" if least else _words(base)
    if origin in (typing.Union, _UnionType):
        words = [_words(member) for member in typing.get_args(schema)]
        return ", ".join(words[:-1]) + " or " + words[-1]
    if origin is list:
        return "a list"
    if origin is dict or typing.is_typeddict(schema):
        return "an object"
    return {
        str: "text",
        int: "a whole number",
        float: "a number",
        type(None): "null",
        bool: "true or false",
    }[
        schema  # type: ignore[index]
    ]


_UnionType = type(int | str)
_UNIONS = (typing.Union, _UnionType)


def _made(schema: object) -> Callable[[object], _Failure | None]:  # noqa: PLR0911 - one per kind
    """A check for ``schema``; TypeError for a kind of type it does not know."""
    if schema is object:
        return lambda value: None
    if schema in (str, bool):
        exact = schema
        return lambda value: None if type(value) is exact else _wrong(_words(exact), value)
    if schema is float:
        return lambda value: None if type(value) is float else _wrong("a number", value)
    if schema is int:
        # type(), not isinstance(): a bool is an int to Python, not to the schema.
        return lambda value: None if type(value) is int else _wrong("a whole number", value)
    if schema is type(None) or schema is None:
        return lambda value: None if value is None else _wrong("null", value)
    if isinstance(schema, type) and typing.is_typeddict(schema):
        return _typed_dict(schema)
    origin, args = typing.get_origin(schema), typing.get_args(schema)
    if origin is Annotated:
        return _annotated(schema, args)
    if origin in (typing.Union, _UnionType):
        return _union(schema, args)
    if origin is list:
        return _list(_check(args[0]))
    if origin is dict and args[0] is str:
        return _dict(_check(args[1]))
    raise TypeError(f"cgguard._data.schema cannot check values of {schema!r}")


def _annotated(schema: object, args: tuple[object, ...]) -> Callable[[object], _Failure | None]:
    base = _check(args[0])
    least = next((extra.least for extra in args[1:] if isinstance(extra, AtLeast)), None)
    if least is None:
        return base
    words = _words(schema)

    def check(value: object) -> _Failure | None:
        if base(value) is not None:
            return _wrong(words, value)
        if value < least:  # type: ignore[operator]
            return [], f"{words} expected, found {value}"
        return None

    return check


def _union(schema: object, args: tuple[object, ...]) -> Callable[[object], _Failure | None]:
    members = [(_json_type(member), _check(member)) for member in args]
    if len({kind for kind, _ in members}) < len(members):
        # Told apart by their JSON kind alone: two lists, say, could not be.
        raise TypeError(f"cgguard._data.schema cannot check {schema!r}: two members of one kind")
    words = _words(schema)

    def check(value: object) -> _Failure | None:
        for kind, member in members:
            if type(value) is kind:
                # The member of the value's own kind says what is wrong inside it, and where.
                return member(value)
        return _wrong(words, value)

    return check


def _json_type(schema: object) -> type:
    """The Python type ``json.loads`` gives the values of ``schema``."""
    if typing.get_origin(schema) is Annotated:
        return _json_type(typing.get_args(schema)[0])
    if typing.is_typeddict(schema) or typing.get_origin(schema) is dict:
        return dict
    if typing.get_origin(schema) is list:
        return list
    if isinstance(schema, type) and schema in (str, int, float, bool, type(None)):
        return schema
    # A union inside a union is flattened by typing; object has no place in one.
    raise TypeError(f"cgguard._data.schema cannot check values of {schema!r} in a union")


def _list(item: Callable[[object], _Failure | None]) -> Callable[[object], _Failure | None]:
    def check(value: object) -> _Failure | None:
        if type(value) is not list:
            return _wrong("a list", value)
        for i, each in enumerate(value):
            failure = item(each)
            if failure is not None:
                failure[0].append(f"[{i}]")
                return failure
        return None

    return check


def _dict(item: Callable[[object], _Failure | None]) -> Callable[[object], _Failure | None]:
    def check(value: object) -> _Failure | None:
        if type(value) is not dict:
            return _wrong("an object", value)
        for key, each in value.items():
            failure = item(each)
            if failure is not None:
                failure[0].append(f"[{_key(key)}]")
                return failure
        return None

    return check


def _key(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _typed_dict(schema: type) -> Callable[[object], _Failure | None]:
    hints = typing.get_type_hints(schema, include_extras=True)
    required = frozenset(getattr(schema, "__required_keys__", ()))
    # In the schema's order, each key's check made now: a type it cannot check fails here,
    # not on the first report that holds the key. A key of plain kinds (text, a number, null)
    # is checked here by its type alone, without a call: a report of a million sites has
    # tens of millions of them.
    keys = [(key, key in required, _plain(hint), _check(hint)) for key, hint in hints.items()]

    def check(value: object) -> _Failure | None:
        if type(value) is not dict:
            return _wrong("an object", value)
        get = value.get
        for key, needed, plain, each in keys:
            found = get(key, _MISSING)
            if found is _MISSING:
                if needed:
                    return [], f'no "{key}"'
                continue
            if plain is not None and type(found) in plain:
                continue
            failure = each(found)
            if failure is not None:
                failure[0].append(f".{key}")
                return failure
        return None

    return check


def _plain(schema: object) -> frozenset[type] | None:
    """The JSON types that are all there is to checking ``schema``, or None."""
    members = typing.get_args(schema) if typing.get_origin(schema) in _UNIONS else (schema,)
    if all(member in (str, int, float, bool, type(None)) for member in members):
        return frozenset(member for member in members if isinstance(member, type))
    return None
