"""cgguard._support.text: text from elsewhere shown escaped, as repr() escapes it, to a terminal and
in Markdown."""

from __future__ import annotations

import pytest

from cgguard._support.text import markdown, safe, shown


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("\x1b]0;owned\x07", "\\x1b]0;owned\\x07", id="window title"),
        pytest.param("\x1b[2J\x1b[8mhidden", "\\x1b[2J\\x1b[8mhidden", id="clear and hide"),
        pytest.param("a\nb\rc\td\x0be\x0cf", "a\\nb\\rc\\td\\x0be\\x0cf", id="line breaks, tab"),
        pytest.param("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b", id="NUL, DEL, C1"),
        pytest.param("admin\u202etxt.py", "admin\\u202etxt.py", id="bidi override"),
        pytest.param("\u2066x\u2069\u200f", "\\u2066x\\u2069\\u200f", id="bidi isolates, mark"),
        pytest.param("\u2028\u2029", "\\u2028\\u2029", id="line and paragraph separators"),
        pytest.param("r-\udcff.json", "r-\\udcff.json", id="lone surrogate"),
        pytest.param("\U000e0041", "\\U000e0041", id="tag character"),
    ],
)
def test_characters_a_terminal_acts_on_are_escaped(text: str, expected: str) -> None:
    """Control, C1, bidi, separator and surrogate characters come out as repr() writes them."""
    assert safe(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "/job/train.py",
        "C:\\job\\train.py",  # a backslash is printable: paths and source lines keep theirs
        'print("a\\n")',
        "Grüße 模型 ελληνικά",
        "",
    ],
)
def test_printable_text_is_kept(text: str) -> None:
    """Printable text, other scripts and backslashes included, is shown as it is."""
    assert safe(text) == text


def test_text_is_safe_again_unchanged() -> None:
    """What safe() returns is printable, so escaping twice changes nothing."""
    once = safe("\x1b[31mred\u202e\n")
    assert (once, safe(once), once.isprintable()) == (
        "\\x1b[31mred\\u202e\\n",
        "\\x1b[31mred\\u202e\\n",
        True,
    )


def test_shown_takes_any_value() -> None:
    """Numbers as str() gives them, None as nothing, text made safe."""
    assert [shown(3), shown(None), shown("\x1b")] == ["3", "", "\\x1b"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("a|b", "a\\|b", id="cell bar"),
        pytest.param("[all clear](https://x)", "\\[all clear\\](https://x)", id="link"),
        pytest.param("![i](x)", "\\!\\[i\\](x)", id="image"),
        pytest.param("<img src=x onerror=y>", "\\<img src=x onerror=y\\>", id="raw HTML"),
        pytest.param("`c` *em* _em_ ~s~", "\\`c\\` \\*em\\* \\_em\\_ \\~s\\~", id="inline"),
        pytest.param("&#124; &amp;", "\\&\\#124; \\&amp;", id="entities"),
        pytest.param("$x$ ## h", "\\$x\\$ \\#\\# h", id="math, heading close"),
        pytest.param("a\\b", "a\\\\b", id="backslash"),
        pytest.param("a\rb\nc", "a\\\\rb\\\\nc", id="line breaks end no cell"),
        pytest.param("/job/train.py:40 (in step)", "/job/train.py:40 (in step)", id="plain"),
    ],
)
def test_markdown_text_is_literal(text: str, expected: str) -> None:
    """In Markdown, syntax characters are backslash-escaped and line breaks never reach it."""
    assert markdown(text) == expected
