"""``cgguard report --format html``: a job's merged reports as one self-contained page.

The page needs nothing from elsewhere: its style is inline, its charts are inline SVG drawn in
Python (cgguard._commands.report_chart), and it holds no script, so it opens offline, from a CI
artifact or a mail attachment, and shows the same with scripts off. Every name from a report
(file, function, rule, message, host, rank, exemption, report path) is text: shown safe as the
text view shows it, then HTML-escaped. The page is ASCII, every other character written as a
character reference, so that it reads right whatever encoding it is stored in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cgguard._commands import report_view as view
from cgguard._commands.report_chart import Bar, bytes_text, chart, escaped, seconds_text
from cgguard._commands.report_merge import ACTIONS, top_processes
from cgguard._data.census_merge import place_text, slowest_text
from cgguard._rules.record import OUTCOMES
from cgguard._support.text import shown
from cgguard._version import __version__

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from cgguard._commands.report_merge import JobRuleSite, Merged

# The most rows a chart draws: past them a chart is a wall, and the tables list every site.
CHART_ROWS = 20
# A capture begun and not ended when its census was read has no outcome yet.
_OPEN = "open"

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f;
  margin: 0 auto; max-width: 1100px; padding: 0 20px 40px; }
h1 { font-size: 22px; margin: 24px 0 4px; }
h2 { font-size: 18px; margin: 32px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 20px 0 6px; }
p.headline { font-size: 16px; margin: 0 0 8px; }
ul.merged { color: #555; margin: 0; padding-left: 20px; }
nav a { margin-right: 14px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f6; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font: 12px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; white-space: pre; }
details { margin: 6px 0; }
summary { cursor: pointer; }
p.more, p.note { color: #555; }
svg.chart { display: block; margin: 8px 0 16px; font-size: 12px; }
svg.chart text { fill: #1d1d1f; }
svg.chart text.value { fill: #555; }
svg.chart g.row:hover text.label { font-weight: bold; }
.part-raised { fill: #c0392b; } .part-logged { fill: #e69f00; } .part-other { fill: #7f7f7f; }
.part-ended { fill: #2e7d32; } .part-failed { fill: #c62828; } .part-refused { fill: #6a1b9a; }
.part-abandoned { fill: #9e9e9e; } .part-open { fill: #90caf9; }
.part-seconds { fill: #1565c0; } .part-bytes { fill: #00838f; } .part-never { fill: #ef6c00; }
g.marked .part-seconds { fill: #c62828; }
"""


def render_html(merged: Merged, top: int = view.TOP) -> Iterator[str]:
    """The page, a piece at a time, each ASCII; ``top`` processes at most in a cell and in the
    processes table, as in the text view."""
    for piece in _page(merged, top):
        yield piece.encode("ascii", "xmlcharrefreplace").decode("ascii")


def _page(merged: Merged, top: int) -> Iterator[str]:
    headline = view.headline(merged)
    yield (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>cgguard report: {escaped(headline)}</title>\n<style>{_STYLE}</style>\n"
        "</head>\n<body>\n<header>\n<h1>cgguard report</h1>\n"
        f'<p class="headline">{escaped(headline)}</p>\n'
    )
    what = view.merged_what(merged)
    if what:
        yield '<ul class="merged">' + "".join(f"<li>{escaped(line)}</li>" for line in what)
        yield "</ul>\n"
    census = bool(merged.census.summary())
    ranks = merged.ranks.summary() is not None
    sections = [
        ("violations", "Violations", bool(merged.violations)),
        ("exempted", "Exempted", bool(merged.exempted)),
        ("ranks", "Ranks", ranks),
        ("captures", "Captures", census),
        ("processes", "Processes", True),
    ]
    links = "".join(f'<a href="#{key}">{name}</a>' for key, name, present in sections if present)
    yield f"<nav>{links}</nav>\n</header>\n<main>\n"
    if merged.violations:
        yield from _violations(merged, top)
    if merged.exempted:
        yield from _exempted(merged.exempted, top)
    if ranks:
        yield from _ranks(merged)
    if census:
        yield from _captures(merged)
    yield from _processes(merged, top)
    yield f'</main>\n<footer><p class="note">cgguard {escaped(__version__)}</p></footer>\n'
    yield "</body>\n</html>\n"


# --- tables ---------------------------------------------------------------------------------


def _cells(values: Iterable[object], numeric: Sequence[bool] = ()) -> str:
    """A table row: numbers right-aligned, everything else as text."""
    cells = []
    for i, value in enumerate(values):
        text = "" if value is None else escaped(value)
        number = numeric[i] if i < len(numeric) else isinstance(value, int | float)
        cells.append(f'<td class="n">{text}</td>' if number else f"<td>{text}</td>")
    return "<tr>" + "".join(cells) + "</tr>\n"


def _head(names: Sequence[str]) -> str:
    return "<table>\n<thead><tr>" + "".join(f"<th>{n}</th>" for n in names) + "</tr></thead>\n"


def _parts(actions: Mapping[str, int]) -> list[tuple[str, float]]:
    """A count by action (as in_order() gives it) as a bar's parts: raised, logged, then any
    other as one part."""
    other = sum(count for action, count in actions.items() if action not in ACTIONS)
    return [*((action, float(actions[action])) for action in ACTIONS), ("other", float(other))]


def _legend(parts: Sequence[tuple[str, float]], names: Sequence[str]) -> list[str]:
    return [name for name in names if any(part == name and value for part, value in parts)]


def _violations(merged: Merged, top: int) -> Iterator[str]:
    sites = merged.violations
    yield '<section id="violations">\n<h2>Violations</h2>\n'
    yield from _titled_chart(
        "site-violations",
        "Violations by site",
        [
            Bar(
                f"{site.rule} at {view.site_line(site.top)}",
                _parts(site.actions()),
                view.actions_text(site.actions(), site.count),
            )
            for site in sites[:CHART_ROWS]
        ],
        _action_legend([_parts(site.actions()) for site in sites[:CHART_ROWS]]),
        total=len(sites),
        of="sites",
    )
    violating = [p for p in top_processes(merged, len(merged.processes))[0] if p["violations"]]
    yield from _titled_chart(
        "process-violations",
        "Violations by process",
        [
            Bar(
                view.who(p),
                _parts(p["actions"]),
                f"{p['violations']} ({view.actions_text(p['actions'], p['violations'])})",
            )
            for p in violating[:CHART_ROWS]
        ],
        _action_legend([_parts(p["actions"]) for p in violating[:CHART_ROWS]]),
        total=len(violating),
        of="processes with a violation",
    )
    yield _head(view.SITE_COLUMNS)
    for site in sites:
        yield _cells(view.site_row(site, top), (False, False, True, True, True, False))
    yield "</table>\n<h3>First event at each site</h3>\n"
    for site in sites:
        yield _first_event(site)
    yield "</section>\n"


def _action_legend(bars: Sequence[Sequence[tuple[str, float]]]) -> list[str]:
    every = [part for parts in bars for part in parts]
    return _legend(every, (*ACTIONS, "other"))


def _first_event(site: JobRuleSite) -> str:
    """A site's first event, its message and stacks as the text view shows them, folded under
    the site's line."""
    message = shown(site.first.get("message", ""))
    stacks = view.lines_of(view.stacks(dict(site.first)))
    body = "\n".join(escaped(line) for line in (message, *stacks))
    return (
        f"<details><summary>{escaped(view.site_head(site))}</summary><pre>{body}</pre></details>\n"
    )


def _exempted(sites: Sequence[JobRuleSite], top: int) -> Iterator[str]:
    yield '<section id="exempted">\n<h2>Exempted</h2>\n'
    yield _head(view.EXEMPTED_COLUMNS)
    for site in sites:
        yield _cells(view.exempted_row(site, top), (False, False, False, True, False))
    yield "</table>\n</section>\n"


def _ranks(merged: Merged) -> Iterator[str]:
    """The job's ranks compared by their capture manifests (docs/ranks.md)."""
    ranks = merged.ranks
    yield f'<section id="ranks">\n<h2>Ranks</h2>\n<p>{escaped(ranks.summary())}</p>\n'
    found = ranks.differences()
    if found:
        yield _head(view.DIFFERENCE_COLUMNS)
        for difference in found:
            yield _cells(view.difference_row(difference), (False, False, False, True))
        yield "</table>\n"
    left_out = ranks.left_out()
    if left_out is not None:
        yield f'<p class="note">{escaped(left_out)}</p>\n'
    yield "</section>\n"


def _titled_chart(
    name: str, title: str, bars: Sequence[Bar], legend: Sequence[str], *, total: int, of: str
) -> Iterator[str]:
    """A chart under its heading, and how many of how many rows it draws."""
    if not bars:
        return
    yield f"<h3>{escaped(title)}</h3>\n"
    yield from chart(name, title, bars, legend)
    if total > len(bars):
        yield f'<p class="more">The {len(bars)} largest of {total} {of}.</p>\n'


# --- the census -------------------------------------------------------------------------------


def _captures(merged: Merged) -> Iterator[str]:
    census = merged.census
    entries = census.captures()  # the most seconds first
    yield f'<section id="captures">\n<h2>Captures</h2>\n<p>{escaped(census.summary())}</p>\n'
    shown_entries = entries[:CHART_ROWS]
    yield from _titled_chart(
        "site-seconds",
        "Capture time per site",
        [
            Bar(place_text(e), [("seconds", e["seconds"])], seconds_text(e["seconds"]))
            for e in shown_entries
        ],
        (),
        total=len(entries),
        of="sites",
    )
    by_count = sorted(entries, key=lambda e: -e["count"])[:CHART_ROWS]
    outcomes = [_outcomes(e) for e in by_count]
    yield from _titled_chart(
        "site-captures",
        "Captures per site, by outcome",
        [
            Bar(place_text(e), parts, f"{e['count']}")
            for e, parts in zip(by_count, outcomes, strict=True)
        ],
        _legend([part for parts in outcomes for part in parts], (*OUTCOMES, _OPEN)),
        total=len(entries),
        of="sites",
    )
    measured = [e for e in entries if e["bytes_reserved"] is not None]
    if measured:
        by_bytes = sorted(measured, key=lambda e: -e["bytes_reserved"])[:CHART_ROWS]
        yield from _titled_chart(
            "site-bytes",
            "Memory reserved per site",
            [
                Bar(place_text(e), [("bytes", grown)], bytes_text(grown))
                for e in by_bytes
                for grown in (e["bytes_reserved"],)
            ],
            (),
            total=len(measured),
            of="sites measured",
        )
    else:
        yield '<p class="note">No capture\'s memory was measured.</p>\n'
    if census.replays:
        never = sorted(
            (e for e in entries if e.get("never_replayed")), key=lambda e: -e["never_replayed"]
        )
        yield from _titled_chart(
            "site-never-replayed",
            "Graphs never replayed, per site",
            [
                Bar(place_text(e), [("never", e["never_replayed"])], f"{e['never_replayed']}")
                for e in never[:CHART_ROWS]
            ],
            (),
            total=len(never),
            of="sites",
        )
        if not never:
            yield '<p class="note">Every graph captured was replayed.</p>\n'
    yield from _ranks_chart(merged)
    yield from _captures_table(entries, replays=census.replays)
    skips = census.cudagraph_skips()
    if skips:
        yield "<h3>torch.compile's skipped cudagraphs</h3>\n" + _head(["reason", "site", "count"])
        for skip in skips:
            yield _cells([skip["reason"], place_text(skip), skip["count"]])
        yield "</table>\n"
    yield "</section>\n"


def _outcomes(entry: Mapping[str, Any]) -> list[tuple[str, float]]:
    counts = entry["outcomes"]
    parts = [(outcome, float(counts.get(outcome, 0))) for outcome in OUTCOMES]
    still = entry["count"] - sum(counts.values())
    return [*parts, (_OPEN, float(max(still, 0)))]


def _ranks_chart(merged: Merged) -> Iterator[str]:
    """Each process's capture time, the slowest first and marked: which rank held the job."""
    processes = sorted(merged.census.processes, key=lambda p: -p.seconds)
    if not processes:
        return
    yield from _titled_chart(
        "process-seconds",
        "Capture time per process",
        [
            Bar(
                p.who(),
                [("seconds", p.seconds)],
                f"{seconds_text(p.seconds)}, {p.captures} captures",
                marked=i == 0 and len(processes) > 1,
            )
            for i, p in enumerate(processes[:CHART_ROWS])
        ],
        (),
        total=len(processes),
        of="processes that captured",
    )


def _captures_table(entries: Sequence[Mapping[str, Any]], *, replays: bool) -> Iterator[str]:
    names = ["site", "captures", *OUTCOMES, "seconds", "max seconds", "bytes reserved"]
    if replays:
        names += ["replays", "never replayed"]
    yield _head([*names, "processes", "slowest"])
    for e in entries:
        grown = e["bytes_reserved"]
        row: list[object] = [
            place_text(e),
            e["count"],
            *(e["outcomes"].get(outcome, 0) for outcome in OUTCOMES),
            f"{e['seconds']:.6f}",
            f"{e['max_seconds']:.6f}",
            "not measured" if grown is None else grown,
        ]
        if replays:
            row += [e.get("replays", 0), e.get("never_replayed", 0)]
        slowest = e["slowest"]
        row += [e["processes"], slowest_text(slowest) if slowest else ""]
        yield _cells(row, [i not in (0, len(row) - 1) for i in range(len(row))])
    yield "</table>\n"


# --- the processes ----------------------------------------------------------------------------


# Which of a process row's cells are numbers: pid, ranks and counts.
_PROCESS_NUMBERS = (False, True, True, True, True, True, True, True, True, False)


def _processes(merged: Merged, top: int) -> Iterator[str]:
    listed, rest = top_processes(merged, top)
    yield '<section id="processes">\n<h2>Processes</h2>\n'
    yield _head(view.PROCESS_COLUMNS)
    for p in listed:
        yield _cells(view.process_row(p), _PROCESS_NUMBERS)
    yield "</table>\n"
    if rest:
        yield f'<p class="more">{escaped(view.rest_line(rest))}.</p>\n'
    yield "</section>\n"
