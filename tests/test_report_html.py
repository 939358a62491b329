"""``cgguard report --format html``: one self-contained page of a job, its charts drawn in inline
SVG, every name from a report shown as text; read with html.parser, and in a real headless
Chromium where one is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any

import pytest
from test_report_merge import (
    census_entry,
    disabled_event,
    document,
    exempted_entry,
    frame,
    nested_event,
    write,
)

from cgguard._commands.main import main

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

CHART_ROWS = 20  # the most rows a chart draws (docs/jobs.md, "The HTML page")
# The elements the page is made of: anything else in it came from a report.
PAGE_ELEMENTS = {
    "html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "p", "ul", "li",
    "nav", "a", "main", "section", "footer", "table", "thead", "tr", "th", "td", "details",
    "summary", "pre", "svg", "g", "rect", "text", "tbody",
}  # fmt: skip
# Elements with no end tag in HTML; SVG's own are closed by "/>".
VOID = {"meta", "link", "img", "br", "hr", "input", "source", "area", "base", "col", "embed"}


@dataclass
class Node:
    """An element of a parsed page: its tag, attributes, and children (elements and text)."""

    tag: str
    attrs: dict[str, str | None]
    children: list[Node | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.walk()

    def find(self, tag: str, cls: str | None = None) -> list[Node]:
        """The elements below (and including) this one of ``tag``, and of class ``cls``."""
        return [
            node
            for node in self.walk()
            if node.tag == tag and (cls is None or cls in (node.attrs.get("class") or "").split())
        ]


class Tree(HTMLParser):
    """A page parsed into Nodes, as the markup says (a browser's repairs aside)."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.open = [self.root]
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs))
        self.open[-1].children.append(node)
        if tag not in VOID:
            self.open.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.open[-1].children.append(Node(tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.open) - 1, 0, -1):
            if self.open[i].tag == tag:
                del self.open[i:]
                return

    def handle_data(self, data: str) -> None:
        self.open[-1].children.append(data)


def charts(root: Node) -> dict[str, Any]:
    """Each chart by id: its legend, and its rows as (label, parts, value, marked)."""
    found = {}
    for svg in root.find("svg", "chart"):
        rows = [
            (
                row.find("text", "label")[0].text(),
                [
                    (rect.attrs["class"] or "").removeprefix("bar part-")
                    for rect in row.find("rect", "bar")
                ],
                row.find("text", "value")[0].text(),
                "marked" in (row.attrs["class"] or ""),
            )
            for row in svg.find("g", "row")
        ]
        legend = [key.text() for key in svg.find("text", "key")]
        found[svg.attrs["id"]] = {"legend": legend, "rows": rows}
    return found


def table(section: Node) -> list[list[str]]:
    """The rows of the first table of a section, header included, as text."""
    (first, *_) = section.find("table")
    return [
        [cell.text() for cell in row.walk() if cell.tag in ("th", "td")] for row in first.find("tr")
    ]


def section(root: Node, key: str) -> Node:
    (found,) = [node for node in root.find("section") if node.attrs.get("id") == key]
    return found


def raised(event: dict[str, Any]) -> dict[str, Any]:
    """A violation's first event as raise mode writes it."""
    return {**event, "action": "raised", "level": "error"}


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """Three processes on two hosts: one site logged in rank 0 and raised in rank 1, a nested
    capture raised in rank 0; ranks 0 and 1 captured at one site, rank 1 three times slower."""
    folder = tmp_path / "reports"
    folder.mkdir()
    mine = {**census_entry(1.0), "bytes_reserved": 1 << 20, "bytes_allocated": 1 << 19}
    write(
        folder,
        "r-101.json",
        document(
            101,
            [
                {
                    "rule": "capture_disabled",
                    "count": 3,
                    "first": disabled_event(101, 0, "2026-12-01T05:00:02.000000Z"),
                },
                {
                    "rule": "nested_capture",
                    "count": 1,
                    "first": nested_event(101, 0, "2026-12-01T05:00:03.000000Z"),
                },
            ],
            rank=0,
            schema=2,
            captures=[mine],
        ),
    )
    theirs = {**census_entry(3.0), "bytes_reserved": 3 << 20, "bytes_allocated": 1 << 19}
    write(
        folder,
        "r-201.json",
        document(
            201,
            [
                {
                    "rule": "capture_disabled",
                    "count": 2,
                    "first": raised(disabled_event(201, 1, "2026-12-01T05:00:01.000000Z")),
                }
            ],
            host="node-b",
            rank=1,
            schema=2,
            captures=[theirs],
        ),
    )
    write(folder, "r-202.json", document(202, [], host="node-b", rank=2))
    return folder


def page_of(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["report", "--format", "html", *args])
    out, err = capsys.readouterr()
    assert err == ""
    return status, out


HEADLINE = "3 processes on 2 hosts: 6 violations at 2 sites (3 raised, 3 logged)"
TRAIN_AT = "/job/train.py:40 (in step)"


def test_the_page_draws_the_census_and_violations_per_site_and_process(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Charts of violations by site and by process (raised and logged apart), and of the
    census per site (time, captures by outcome, memory) and per process, the slowest marked."""
    status, page = page_of(capsys, str(job))
    root = Tree(page).root
    assert (status, root.find("title")[0].text()) == (1, f"cgguard report: {HEADLINE}")
    assert charts(root) == {
        "chart-site-violations": {
            "legend": ["raised", "logged"],
            "rows": [
                (
                    f"capture_disabled at {TRAIN_AT}",
                    ["raised", "logged"],
                    "2 raised, 3 logged",
                    False,
                ),
                ("nested_capture at /job/fused.py:7 (in fuse)", ["raised"], "1 raised", False),
            ],
        },
        "chart-process-violations": {
            "legend": ["raised", "logged"],
            "rows": [
                ("node-a pid 101 rank 0", ["raised", "logged"], "4 (1 raised, 3 logged)", False),
                ("node-b pid 201 rank 1", ["raised"], "2 (2 raised)", False),
            ],
        },
        "chart-site-seconds": {"legend": [], "rows": [(TRAIN_AT, ["seconds"], "4.00 s", False)]},
        "chart-site-captures": {"legend": ["ended"], "rows": [(TRAIN_AT, ["ended"], "4", False)]},
        "chart-site-bytes": {"legend": [], "rows": [(TRAIN_AT, ["bytes"], "4.0 MiB", False)]},
        "chart-process-seconds": {
            "legend": [],
            "rows": [
                ("node-b pid 201 rank 1", ["seconds"], "3.00 s, 2 captures", True),
                ("node-a pid 101 rank 0", ["seconds"], "1.00 s, 2 captures", False),
            ],
        },
    }


def test_the_page_tables_violations_by_site_and_processes(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table of violations by site with raised and logged counts, each site's first event
    folded, and a table of processes, the most violations first."""
    _, page = page_of(capsys, str(job))
    root = Tree(page).root
    violations = section(root, "violations")
    assert table(violations) == [
        ["rule", "site", "count", "raised", "logged", "processes"],
        ["capture_disabled", TRAIN_AT, "5", "2", "3",
         "node-a pid 101 rank 0 (3), node-b pid 201 rank 1 (2)"],
        ["nested_capture", "/job/fused.py:7 (in fuse)", "1", "1", "0", "node-a pid 101 rank 0 (1)"],
    ]  # fmt: skip
    summaries = [node.text() for node in violations.find("summary")]
    assert summaries == [
        f"capture_disabled at {TRAIN_AT}: 5 in 2 processes (2 raised, 3 logged)",
        "nested_capture at /job/fused.py:7 (in fuse): 1 in 1 process (1 raised)",
    ]
    # The earliest first event's message and stacks, as the text view shows them.
    assert violations.find("pre")[0].text().splitlines()[1:5] == [
        "The capture was attempted at (most recent call last):",
        '  File "/job/train.py", line 90, in <module>',
        "    main()",
        '  File "/job/train.py", line 40, in step',
    ]
    assert table(section(root, "processes")) == [
        ["host", "pid", "rank", "local_rank", "world_size", "violations", "raised", "logged",
         "exempted", "report"],
        ["node-a", "101", "0", "", "", "4", "1", "3", "0", str(job / "r-101.json")],
        ["node-b", "201", "1", "", "", "2", "2", "0", "0", str(job / "r-201.json")],
        ["node-b", "202", "2", "", "", "0", "0", "0", "0", str(job / "r-202.json")],
    ]  # fmt: skip


def test_nothing_on_the_page_comes_from_elsewhere(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No script, stylesheet, image, frame or font fetched: no src, every link to the page's
    own sections, nothing imported by the style; and the page is ASCII."""
    _, page = page_of(capsys, str(job))
    root = Tree(page).root
    fetched = [
        (node.tag, name, value)
        for node in root.walk()
        for name, value in node.attrs.items()
        if name in ("src", "srcset", "data", "action", "poster", "background")
        or (name in ("href", "xlink:href") and not (value or "").startswith("#"))
    ]
    style = "".join(node.text() for node in root.find("style"))
    assert (
        fetched,
        sorted({node.tag for node in root.walk()} - PAGE_ELEMENTS - {"#document"}),
        "url(" in style or "@import" in style,
        page.isascii(),
        "http://" in page or "https://" in page,
    ) == ([], [], False, True, False)


# Names a report may hold, made to break out of the page: markup, a handler, a script, the
# title's end, an attribute's end, a bidi override.
MARK = "document.body.setAttribute('data-injected', '{}')"
HOSTILE = {
    "host": f'<img src=x onerror="{MARK.format("host")}">',
    "function": f"</script><script>{MARK.format('function')}</script>",
    "file": f'/job/"><svg onload="{MARK.format("file")}">.py',
    "rule": "</title><h1>owned</h1>",
    "exemption": "capture_disabled='><iframe srcdoc=x>",
    "rank": "<b>0</b>\u202e",
    "code": "<!-- <style>body{display:none}</style>",
}


def hostile_job(folder: Path) -> Path:
    """A report of one process whose every name is one of HOSTILE, in a file named so too."""
    folder.mkdir()
    site = frame(HOSTILE["file"], 3, HOSTILE["function"], HOSTILE["code"])
    event = disabled_event(7, 0, "2026-12-01T05:00:01.000000Z")
    event.update(rule=HOSTILE["rule"], message=HOSTILE["host"], stack=[site])
    del event["disabled_stack"]
    report = document(7, [{"rule": HOSTILE["rule"], "count": 2, "first": event}])
    entry = exempted_entry(1)
    entry["exemption"] = entry["first"]["exemption"] = HOSTILE["exemption"]
    entry["first"]["stack"] = [site]
    place = {**census_entry(1.0), "file": HOSTILE["file"], "function": HOSTILE["function"]}
    report.update(
        host=HOSTILE["host"],
        rank=HOSTILE["rank"],
        exempted_totals={"capture_disabled": 1},
        exempted=[entry],
        schema=2,
        captures=[place],
        cudagraph_skips=[
            {
                "reason": HOSTILE["rule"],
                "count": 1,
                "example": "x",
                "file": HOSTILE["file"],
                "line": 1,
                "function": HOSTILE["function"],
            }
        ],
    )
    write(folder, "r-<img src=x>.json", report)
    return folder


def shown_hostile() -> list[str]:
    """The hostile names as the page's text shows them: as written, a bidi override escaped."""
    return [name.replace("\u202e", "\\u202e") for name in HOSTILE.values()]


def test_names_from_a_report_are_text_on_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Markup, handlers and scripts in names are escaped: the page holds only its own elements
    and no handler, and its text holds each name literally."""
    _, page = page_of(capsys, str(hostile_job(tmp_path / "reports")))
    root = Tree(page).root
    text = root.text()
    handlers = [name for node in root.walk() for name in node.attrs if name.startswith("on")]
    assert (
        sorted({node.tag for node in root.walk()} - PAGE_ELEMENTS - {"#document"}),
        handlers,
        [name for name in shown_hostile() if name not in text],
        "\u202e" in text,
    ) == ([], [], [], False)


def test_a_chart_draws_its_largest_rows_and_says_how_many_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past CHART_ROWS sites a chart draws the largest and says of how many; the table lists
    every site."""
    sites = CHART_ROWS + 3
    violations = []
    for line in range(1, sites + 1):
        event = disabled_event(7, 0, "2026-12-01T05:00:01.000000Z")
        event["stack"] = [frame("/job/many.py", line, "f", "g()")]
        violations.append({"rule": "capture_disabled", "count": line, "first": event})
    write(tmp_path, "r.json", document(7, violations))
    _, page = page_of(capsys, str(tmp_path))
    root = Tree(page).root
    drawn = charts(root)["chart-site-violations"]["rows"]
    notes = [node.text() for node in section(root, "violations").find("p", "more")]
    assert (
        [row[0] for row in drawn],
        notes,
        len(table(section(root, "violations"))),
    ) == (
        [f"capture_disabled at /job/many.py:{line} (in f)" for line in range(sites, 3, -1)],
        [f"The {CHART_ROWS} largest of {sites} sites."],
        sites + 1,
    )


def test_the_page_is_written_to_the_file_named(
    job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o FILE holds what standard output would have, and standard output stays empty."""
    _, page = page_of(capsys, str(job))
    out = tmp_path / "job.html"
    status = main(["report", "--format", "HTML", "-o", str(out), str(job)])
    assert (status, capsys.readouterr(), out.read_text()) == (1, ("", ""), page)


# --- in a real browser ------------------------------------------------------------------------

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def browser() -> str:
    """A headless Chromium's path; the test skips, saying why, where there is none."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip(
        f"no Chromium on PATH (looked for {', '.join(BROWSERS)}): as root, "
        "`apt-get install -y chromium-headless-shell` installs one"
    )


def rendered(page: Path, profile: Path) -> Node:
    """The DOM Chromium builds of ``page``, scripts run and images tried, parsed."""
    result = subprocess.run(
        [
            browser(),
            "--headless",
            "--no-sandbox",  # as root in a container, Chromium's sandbox cannot start
            "--disable-gpu",
            f"--user-data-dir={profile}",
            # Time for an image's error and a script to run before the DOM is taken.
            "--virtual-time-budget=3000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, "<html" in result.stdout) == (0, True), result.stderr[-2000:]
    return Tree(result.stdout).root


# Run in the browser after the page, added to a copy of it: what each chart's layout gave.
MEASURE = """<script>
const out = {};
for (const svg of document.querySelectorAll("svg.chart")) {
  const size = (node) => node.getBoundingClientRect();
  const bars = [...svg.querySelectorAll("rect.bar")];
  out[svg.id] = {
    svg: svg instanceof SVGSVGElement && size(svg).width > 0 && size(svg).height > 0,
    drawn: bars.filter((bar) => bar instanceof SVGRectElement
      && size(bar).width > 0 && size(bar).height > 0).length,
    labels: [...svg.querySelectorAll("text.label")].map((label) => label.textContent),
  };
}
const pre = document.createElement("pre");
pre.id = "measured";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def measured(root: Node) -> dict[str, Any]:
    (pre,) = [node for node in root.find("pre") if node.attrs.get("id") == "measured"]
    return json.loads(pre.text())  # type: ignore[no-any-return]


def test_the_page_renders_in_a_browser_with_its_charts_drawn(
    job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Chromium lays out each chart as SVG: every bar drawn with a size, every label there."""
    _, page = page_of(capsys, str(job))
    copy = tmp_path / "measured.html"
    copy.write_text(page.replace("</body>", MEASURE + "</body>"))
    processes = ["node-a pid 101 rank 0", "node-b pid 201 rank 1"]
    assert measured(rendered(copy, tmp_path / "profile")) == {
        "chart-site-violations": {
            "svg": True,
            "drawn": 3,
            "labels": [
                f"capture_disabled at {TRAIN_AT}", "nested_capture at /job/fused.py:7 (in fuse)"
            ],
        },
        "chart-process-violations": {"svg": True, "drawn": 3, "labels": processes},
        "chart-site-seconds": {"svg": True, "drawn": 1, "labels": [TRAIN_AT]},
        "chart-site-captures": {"svg": True, "drawn": 1, "labels": [TRAIN_AT]},
        "chart-site-bytes": {"svg": True, "drawn": 1, "labels": [TRAIN_AT]},
        "chart-process-seconds": {"svg": True, "drawn": 2, "labels": processes[::-1]},
    }  # fmt: skip


def injected(root: Node) -> list[str]:
    """What an injection left in a rendered page: the marks its handlers set, and elements
    the page does not make."""
    marks = [
        node.attrs["data-injected"] or "" for node in root.walk() if "data-injected" in node.attrs
    ]
    strangers = sorted({node.tag for node in root.walk()} - PAGE_ELEMENTS - {"#document"})
    return marks + strangers


def test_a_hostile_name_is_text_in_a_browser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In Chromium, no name from a report makes an element or runs a handler or a script: the
    page's title and text show each name as written."""
    _, page = page_of(capsys, str(hostile_job(tmp_path / "reports")))
    path = tmp_path / "job.html"
    path.write_text(page)
    root = rendered(path, tmp_path / "profile")
    text = root.find("body")[0].text()
    assert (
        injected(root),
        [name for name in shown_hostile() if name not in text],
        root.find("title")[0].text(),
    ) == (
        [],
        [],
        "cgguard report: 1 process on 1 host: 2 violations at 1 site (2 logged); 1 exempted",
    )


def test_the_browser_check_sees_an_injection(tmp_path: Path) -> None:
    """The check above can fail: a name left unescaped runs its handler and leaves its mark."""
    path = tmp_path / "raw.html"
    path.write_text(
        "<!DOCTYPE html><html><head><title>t</title></head>"
        f"<body><p>{HOSTILE['host']}</p></body></html>"
    )
    assert injected(rendered(path, tmp_path / "profile")) == ["host", "img"]
