"""Horizontal bar charts as inline SVG, drawn here: what ``cgguard report``'s HTML page shows
of a job's census and violations.

Drawn in Python, not by a script in the page: the chart is in the page as written, so it shows
with scripts off, in a mail client's viewer or a CI artifact's preview, and a test reads it in
the page's markup. One bar per row, its label at the left, split into parts (raised and
logged, or a capture's outcomes) that are stacked and told apart by a legend.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, NamedTuple

from cgguard._support.text import shown

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

# The chart's geometry, in SVG user units (CSS pixels at the page's scale).
WIDTH = 760
LABEL_WIDTH = 300  # the labels' column, right-aligned against the bars
VALUE_WIDTH = 130  # room for the value written after the longest bar
ROW = 22
BAR = 14
LEGEND = 24
# A label longer than this is cut at its start, which holds the least of a path: its file
# and line are at the end. The whole label is the row's tooltip.
LABEL_CHARACTERS = 46


class Bar(NamedTuple):
    """One row of a chart."""

    label: str  # as the report has it: made safe and escaped when drawn
    parts: Sequence[tuple[str, float]]  # (part, value), drawn in this order, stacked
    value: str  # the row's value in words, written after the bar
    marked: bool = False  # drawn as the row to notice (the slowest process)


def escaped(value: object) -> str:
    """Any value from a report as HTML text: made safe (no control character, no bidi
    override), then escaped, quotes included, so that it is text in an element or an
    attribute alike."""
    return html.escape(shown(value), quote=True)


def _cut(label: str) -> str:
    if len(label) <= LABEL_CHARACTERS:
        return label
    return "\u2026" + label[-(LABEL_CHARACTERS - 1) :]


def chart(name: str, title: str, bars: Sequence[Bar], legend: Sequence[str] = ()) -> Iterator[str]:
    """An SVG bar chart of ``bars``, one row each, scaled to the largest; ``legend`` names the
    parts a bar is split into, in their order (none for bars of one part).

    ``name`` is the chart's id (``chart-NAME``) and each part's class (``part-PART``): both
    are the page's own words, never a report's.
    """
    top = LEGEND if legend else 0
    height = top + ROW * len(bars) + 4
    scale_width = WIDTH - LABEL_WIDTH - VALUE_WIDTH - 16
    largest = max((sum(value for _, value in bar.parts) for bar in bars), default=0.0)
    yield (
        f'<svg class="chart" id="chart-{name}" data-bars="{len(bars)}" role="img" '
        f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}">'
        f"<title>{escaped(title)}</title>\n"
    )
    x = float(LABEL_WIDTH + 8)
    for part in legend:
        yield (
            f'<rect class="key part-{part}" x="{x:.0f}" y="4" width="12" height="12"/>'
            f'<text class="key" x="{x + 16:.0f}" y="14">{escaped(part)}</text>\n'
        )
        x += 24 + 8 * len(part)
    for row, bar in enumerate(bars):
        y = top + ROW * row
        label = shown(bar.label)
        marked = " marked" if bar.marked else ""
        yield (
            f'<g class="row{marked}"><title>{escaped(label)}: {escaped(bar.value)}</title>'
            f'<text class="label" x="{LABEL_WIDTH}" y="{y + BAR}" text-anchor="end">'
            f"{escaped(_cut(label))}</text>"
        )
        x = LABEL_WIDTH + 8.0
        for part, value in bar.parts:
            if value <= 0:
                continue
            # At least a pixel: a bar of something is never drawn as a bar of nothing.
            width = max(1.0, value / largest * scale_width) if largest else 0.0
            yield (
                f'<rect class="bar part-{part}" x="{x:.1f}" y="{y + 3}" width="{width:.1f}" '
                f'height="{BAR}"/>'
            )
            x += width
        yield f'<text class="value" x="{x + 6:.1f}" y="{y + BAR}">{escaped(bar.value)}</text></g>\n'
    yield "</svg>\n"


def seconds_text(seconds: float) -> str:
    """A time in the unit that reads best: "1.23 s", "12.3 ms", "45.6 us"."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} us"


def bytes_text(count: float) -> str:
    """A number of bytes in the binary unit that reads best: "512 B", "1.5 MiB"."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
