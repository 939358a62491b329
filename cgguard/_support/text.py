"""Text from elsewhere: what counts as text in a value a caller hands cgguard, and names made
safe to show, on a terminal or a Markdown page, as they are.

File and function names, source lines, messages, host names and ranks come from the program,
from code made by ``exec``, or from a report written on another machine. Printed raw, one of
them could set a terminal's window title, clear its screen, hide text or reorder it with a
bidirectional override. Standard library only, and no ``typing``: exemptions are checked on
the start-up path.
"""

# Escapes already made, by character: a hostile name repeats the same few.
_ESCAPES: dict[str, str] = {}

# What CommonMark and GitHub's Markdown give a meaning to inside a line: escapes, code spans,
# emphasis, links and images, raw HTML and autolinks, entities, table cells, strikethrough,
# math, and the closing sequence of a heading.
_MARKDOWN = frozenset("\\`*_[]<>&|~!$#")
_MARKDOWN_ESCAPES = str.maketrans({char: "\\" + char for char in _MARKDOWN})


def safe(text: str) -> str:
    """``text`` with each character that is not printable written as ``repr()`` writes it.

    Control characters (C0, DEL and C1, line breaks and tabs included), bidirectional
    overrides and other format characters, separators other than the space, lone surrogates
    and unassigned code points become ``\\x1b``, ``\\n``, ``\\u202e``, ``\\udcff``... Printable
    text, other languages' included, is kept, and so are backslashes, which file names and
    source lines hold: the result is printable, one line, and ``safe()`` of it is itself.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    escaped = _ESCAPES.get(char)
    if escaped is None:
        # repr() of one character that is not printable is its escape, quoted.
        escaped = _ESCAPES[char] = repr(char)[1:-1]
    return escaped


def shown(value: object) -> str:
    """Any value as ``str()`` gives it, made safe; "" for None."""
    return "" if value is None else safe(str(value))


def markdown(text: str) -> str:
    """``text`` safe, and as literal text inside a Markdown line (a table cell, a heading).

    Each character Markdown would read as syntax there gets a backslash (CommonMark lets any
    ASCII punctuation be escaped so), and the line breaks that would end a cell, ``\\r``
    included, are already escapes: nothing in it can end the cell, make a link, an image, raw
    HTML, emphasis or a code span.
    """
    return safe(text).translate(_MARKDOWN_ESCAPES)


def plain(value: object) -> str | None:
    """``value`` as a plain str if it is a str (a subclass, a str-valued Enum), else None."""
    # type(), not isinstance(): an object's __class__ may claim str without it being one.
    if not issubclass(type(value), str):
        return None
    return str.__str__(value)  # the plain copy of a subclass's text
