"""cgguard._data.schema: the events' and the report's TypedDicts, and the one check of a parsed
JSON value against them."""

from __future__ import annotations

import subprocess
import sys
from typing import Annotated, Any, TypedDict

import pytest

from cgguard._data import schema as _schema
from cgguard._support.frames import FrameInfo  # noqa: TC001 - Sample's annotations are read at run time
from cgguard._support.typecheck import AtLeast, problem


class _Optional(TypedDict, total=False):
    note: str
    frames: list[FrameInfo]


class Sample(_Optional):
    """A schema of every kind the check knows, written for this test."""

    name: str
    count: Annotated[int, AtLeast(1)]
    rank: int | str | None
    counts: dict[str, int]
    top: FrameInfo | None
    anything: object


GOOD: dict[str, Any] = {
    "name": "n",
    "count": 1,
    "rank": None,
    "counts": {"a": 0},
    "top": {"file": "f.py", "line": 1, "function": "g", "code": None},
    "anything": [{"x": 1}],
}


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(GOOD, id="required keys only"),
        pytest.param({**GOOD, "note": "x", "frames": []}, id="optional keys"),
        pytest.param({**GOOD, "added_later": {"x": [1]}}, id="an unknown key"),
        pytest.param({**GOOD, "rank": "r0", "top": None}, id="other members of unions"),
    ],
)
def test_a_value_of_the_schema_passes(value: dict[str, Any]) -> None:
    """Required keys present, optional ones absent or right, unknown keys let through."""
    assert problem(value, Sample) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param([], "an object expected, found a list", id="not an object"),
        pytest.param({k: v for k, v in GOOD.items() if k != "name"}, 'no "name"', id="missing"),
        pytest.param({**GOOD, "name": 1}, "name: text expected, found a whole number", id="str"),
        pytest.param(
            {**GOOD, "count": True},
            "count: a whole number of 1 or more expected, found true",
            id="bool",
        ),
        pytest.param(
            {**GOOD, "count": 0}, "count: a whole number of 1 or more expected, found 0", id="min"
        ),
        pytest.param(
            {**GOOD, "rank": 1.5},
            "rank: a whole number, text or null expected, found a number",
            id="union",
        ),
        pytest.param(
            {**GOOD, "counts": {"a": "1"}},
            "counts['a']: a whole number expected, found text",
            id="dict value",
        ),
        pytest.param(
            {**GOOD, "top": {"file": "f.py", "line": 1, "function": "g"}},
            'top: no "code"',
            id="nested TypedDict in a union",
        ),
        pytest.param(
            {**GOOD, "frames": [GOOD["top"], 3]},
            "frames[1]: an object expected, found a whole number",
            id="list item",
        ),
        pytest.param({**GOOD, "note": None}, "note: text expected, found null", id="optional"),
    ],
)
def test_a_value_off_the_schema_says_where_and_what(value: object, expected: str) -> None:
    """The first thing wrong, by its path, with what was expected and what was found."""
    assert problem(value, Sample) == expected


def test_every_schema_type_is_one_the_check_knows() -> None:
    """Each TypedDict of cgguard._data.schema can be checked: a change to one is a change to what
    cgguard report accepts, with no second description to keep in step."""
    schemas = [
        value
        for value in vars(_schema).values()
        if isinstance(value, type)
        and issubclass(value, dict)
        and value.__module__ == _schema.__name__
    ]
    assert sorted(schema.__name__ for schema in schemas if not schema.__name__.startswith("_")) == [
        "CaptureEntry",
        "CensusEvent",
        "CensusReport",
        "ExemptedEvent",
        "ExemptedSiteCount",
        "ManifestCapture",
        "ManifestCollective",
        "ManifestDocument",
        "ReportDocument",
        "ReportExempted",
        "ReportViolation",
        "SiteCount",
        "SkipEntry",
        "SlowestProcess",
        "SummaryEvent",
        "ViolationEvent",
    ]
    # A value no schema accepts: each check runs, and none stops on a type it does not know.
    assert all(
        problem(0, schema) == "an object expected, found a whole number" for schema in schemas
    )


def test_the_report_s_keys_required_and_optional() -> None:
    """What every report holds, and what reports written before a key existed may lack."""
    assert (
        _schema.ReportDocument.__required_keys__,
        _schema.ReportDocument.__optional_keys__,
    ) == (
        frozenset(
            {"cgguard", "python", "torch", "pid", "written_at", "config", "totals", "violations"}
        ),
        frozenset(
            {"host", "rank", "local_rank", "world_size", "exempted_totals", "exempted", "job"}
            | {"schema"}
            | {"captures", "cudagraph_skips"}
            | {"manifest"}
        ),
    )


@pytest.mark.subprocess
def test_the_schema_is_read_without_typing_extensions() -> None:
    """The check needs only the standard library: with typing_extensions unimportable, a
    report is still checked."""
    code = (
        "import sys; sys.modules['typing_extensions'] = None\n"
        "from cgguard._data.schema import ReportDocument\n"
        "from cgguard._support.typecheck import problem\n"
        "print(problem({'cgguard': '0.1.0'}, ReportDocument))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, 'no "python"\n', "")
