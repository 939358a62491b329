"""``cgguard report``: the JSON reports of a whole job's processes merged into one view.

The reports are found, read and merged by cgguard._commands.report_merge; this module is the
command, and its text, JSON and Markdown views (the HTML page is cgguard._commands.report_html).
Each view is written a site at a time, so that a report of a million sites is never held as
text whole.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import textwrap
from typing import TYPE_CHECKING, TextIO

from cgguard._commands import report_view as view
from cgguard._commands.report_html import render_html
from cgguard._commands.report_merge import (
    MAX_BYTES,
    ReportError,
    Skipped,
    merge,
    read,
    top_hits,
    top_processes,
)
from cgguard._config.settings import shown as quoted
from cgguard._data.census_merge import place_text, site_text, skip_text, slowest_text
from cgguard._rules.record import OUTCOMES
from cgguard._support.text import markdown, safe, shown

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from cgguard._commands.report_merge import Merged

__all__ = ["main", "merge", "render_json", "render_markdown", "render_text"]

FORMATS = ("text", "json", "markdown", "html")
# The JSON view's encoder: json.dumps's own, except that a NaN or an Infinity stops it (a
# ValueError) rather than be written as text strict JSON parsers refuse. read() lets none
# through; this keeps it so whatever reaches the view.
_encode = json.JSONEncoder(allow_nan=False).encode


def render_text(merged: Merged, top: int = view.TOP) -> Iterator[str]:
    """For a person at a terminal, a piece at a time; ``top`` processes at most under each
    site and in the list of processes."""
    yield f"cgguard report: {view.headline(merged)}\n"
    for line in view.merged_what(merged):
        yield line + "\n"
    for site in merged.violations:
        shown_hits, left, rest = top_hits(site, top)
        lines = ["", view.site_head(site)]
        lines += [f"  {view.who(process)}: {count}" for process, count in shown_hits]
        if left:
            lines.append(f"  {view.more_processes(left, rest)}")
        lines.append(f"  {shown(site.first.get('message', ''))}")
        stacks = view.lines_of(view.stacks(dict(site.first)))
        lines += [f"  {line}" if line else "" for line in stacks]
        yield "\n".join(lines) + "\n"
    if merged.exempted:
        yield "\nexempted:\n"
        for site in merged.exempted:
            yield f"  {view.exempted_line(site, top)}\n"
    yield from _ranks_text(merged)
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
    listed, unlisted = top_processes(merged, top)
    for process in listed:
        yield f"  {view.process_line(process)}\n"
    if unlisted:
        yield f"  {view.rest_line(unlisted)}\n"


def _ranks_text(merged: Merged) -> Iterator[str]:
    """The ranks compared, for the text view: nothing where no report is a rank's."""
    ranks = merged.ranks
    summary = ranks.summary()
    if summary is None:
        return
    yield f"\nranks: {summary}\n"
    for difference in ranks.differences():
        yield f"  {difference.kind}: {shown(difference.detail)}\n"
    left_out = ranks.left_out()
    if left_out is not None:
        yield f"  {left_out}\n"


def render_json(merged: Merged, top: int = view.TOP) -> Iterator[str]:
    """For a machine: the merged view as one JSON document, a site or process to a line, every
    process included whatever ``top`` says.

    json.dumps without ``indent``, a piece at a time: with ``indent`` the encoder is the pure
    Python one, many times slower, and one call would hold the whole document as text.
    """
    del top  # a machine reads every process
    dumps = _encode
    first, last = merged.written or (None, None)
    yield (
        f'{{"reports": {len(merged.processes)}, "hosts": {dumps(merged.hosts)}, '
        f'"jobs": {dumps(merged.jobs)}, '
        f'"written": {dumps({"first": first, "last": last})}, '
        f'"totals": {dumps(merged.totals)}, "actions": {dumps(merged.actions)},\n"violations": ['
    )
    yield from _json_items(
        {
            "rule": site.rule,
            "api": site.api,
            "site": site.top,
            "count": site.count,
            "actions": site.actions(),
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
    yield f'],\n"slowest_capturing": {dumps(merged.census.slowest_json())},'
    yield f'\n"ranks": {dumps(merged.ranks.json())},\n"processes": ['
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


def render_markdown(merged: Merged, top: int = view.TOP) -> Iterator[str]:
    """For a CI summary or a pull request: tables, and each site's message and stacks in a
    code block, a piece at a time; ``top`` processes at most in a cell and in the processes
    table."""
    yield f"# cgguard report\n\n{_cell(view.headline(merged))}.\n"
    what = view.merged_what(merged)
    if what:
        yield "\n" + "".join(f"- {_cell(line)}\n" for line in what)
    if merged.violations:
        yield "\n## Violations\n\n" + _header(view.SITE_COLUMNS)
        for site in merged.violations:
            yield _row(view.site_row(site, top))
        for site in merged.violations:
            heading = f"{_cell(site.rule)} at {_cell(view.site_line(site.top))}"
            # The message with the stacks, as the terminal shows them: in a code block, where
            # nothing it holds is read as Markdown.
            message = shown(site.first.get("message", ""))
            stacks = view.lines_of(view.stacks(dict(site.first)))
            yield f"\n### {heading}\n\n{_fence([message, *stacks])}\n"
    if merged.exempted:
        yield "\n## Exempted\n\n" + _header(view.EXEMPTED_COLUMNS)
        for site in merged.exempted:
            yield _row(view.exempted_row(site, top))
    yield from _ranks_markdown(merged)
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
                    place_text(entry),
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
                yield _row([skip["reason"], place_text(skip), skip["count"]])
    yield "\n## Processes\n\n" + _header(view.PROCESS_COLUMNS)
    listed, rest = top_processes(merged, top)
    for p in listed:
        yield _row(view.process_row(p))
    if rest:
        yield f"\n{_cell(view.rest_line(rest))}.\n"


def _ranks_markdown(merged: Merged) -> Iterator[str]:
    """The ranks compared, for the Markdown view: nothing where no report is a rank's."""
    ranks = merged.ranks
    summary = ranks.summary()
    if summary is None:
        return
    yield f"\n## Ranks\n\n{_cell(summary)}.\n"
    found = ranks.differences()
    if found:
        yield "\n" + _header(view.DIFFERENCE_COLUMNS)
        for difference in found:
            yield _row(view.difference_row(difference))
    left_out = ranks.left_out()
    if left_out is not None:
        yield f"\n{_cell(left_out)}.\n"


_RENDERERS: dict[str, Callable[[Merged, int], Iterator[str]]] = {
    "text": render_text,
    "json": render_json,
    "markdown": render_markdown,
    "html": render_html,
}


def _whole_above_zero(unit: str) -> Callable[[str], int]:
    """An option's value: a whole number of ``unit`` above 0 (--max-bytes, --top)."""

    def value(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            number = 0
        if number < 1:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {unit} above 0")
        return number

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


_DESCRIPTION = """\
Merge the JSON reports of a job's processes (one per process: give CGGUARD_REPORT or
`cgguard run --report` a {pid}) into one view: per rule and site, how often it was hit, raised
or logged, and by which processes; the census of captures, where the reports hold one; the
ranks of the job compared by their capture manifests; and the processes guarded.

exit status: 1 when any violation is present or the job's ranks captured differently, 0 when
neither, 2 when a path is not a readable cgguard report or the output cannot be written.
"""

_EPILOG = """\
examples:
  cgguard report reports/
  cgguard report --format markdown 'node-*/r-*.json' >> "$GITHUB_STEP_SUMMARY"
  cgguard report --format html -o job.html reports/
  cgguard report --format json reports/ | jq '.actions'
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help, the description and examples as written, except that an option in an
    example is never cut at a hyphen (``--max-`` ending one line and ``bytes`` the next)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _parser() -> argparse.ArgumentParser:
    from cgguard._commands.run import Parser

    parser = Parser(
        prog="cgguard report",
        usage="cgguard report [--format {text,json,markdown,html}] [-o FILE] [--top N] "
        "[--max-bytes N] PATH [PATH ...]",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--format",
        type=str.lower,
        choices=FORMATS,
        default="text",
        help="what to write, in any case: text for a terminal (the default); markdown for a "
        "CI job summary or a pull request; json for a machine, every process listed; html for "
        "one self-contained page with charts, to open in a browser (--format html -o job.html)",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the view to FILE instead of standard output, once every report has been "
        "read: a path that is not a report leaves FILE as it was (-o summary.md)",
    )
    parser.add_argument(
        "--top",
        type=_whole_above_zero("processes"),
        default=view.TOP,
        metavar="N",
        help=f"name at most N processes under each site and in the list of processes, those "
        f"with the most violations first, and say how many more there are (default {view.TOP}; "
        "the JSON view lists every one): --top 16 names every rank of a two-node job",
    )
    parser.add_argument(
        "--max-bytes",
        type=_whole_above_zero("bytes"),
        default=MAX_BYTES,
        metavar="N",
        help=f"refuse a report larger than N bytes without reading it (default {MAX_BYTES}, "
        "1 GiB; a report of a million sites is about 400 MB): --max-bytes 2000000000",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a report file, a folder (its *.json files, not its subfolders') or a quoted glob "
        "pattern, where ** matches any depth of folders: reports/ or 'node-*/**/r-*.json'",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """``cgguard report``: 1 when any violation is present or the ranks differ, 0 when neither,
    2 on a bad path."""
    options = _parser().parse_args(argv)
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
        pieces = _RENDERERS[options.format](merged, options.top)
        if options.output is not None:
            if not _write_file(options.output, pieces):
                return 2
        else:
            _write_stdout(pieces)
    # Any count: a report's totals are at least its sites' counts (read() checked). Ranks
    # that captured differently are a finding too.
    return 1 if any(merged.totals.values()) or merged.ranks.differences() else 0


def _write_stdout(pieces: Iterable[str]) -> None:
    write = sys.stdout.write
    try:
        for piece in pieces:
            write(piece)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`cgguard report ... | head`), as a pager does: no
        # traceback, and none at exit when Python flushes stdout again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _write_file(path: str, pieces: Iterable[str]) -> bool:
    """Write the view to ``path`` (UTF-8); False, said in one line, where it cannot be.

    Written in place, as a shell's ``>`` does, so that a device or a pipe named is written to,
    never replaced.
    """
    try:
        with open(path, "w", encoding="utf-8", errors="backslashreplace") as file:
            for piece in pieces:
                file.write(piece)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        sys.stderr.write(f"cgguard report: {quoted(path)}: cannot be written: {safe(reason)}\n")
        return False
    return True
