"""The syntax of exemptions: ``RULE=PLACE`` entries, as the environment, a file or Config give them.

An exemption lets a capture that breaks RULE go ahead when PLACE is on the offending call's
stack. PLACE is one of three kinds, told apart by its characters alone:

- a file glob, which holds a ``/``: ``*/vllm_plugin/kernels.py``;
- a function, ``module:qualname``, which holds a ``:`` and no ``/``:
  ``torch._inductor.runtime.benchmarking:Benchmarker.benchmark_gpu_with_cuda_graph``;
- a module, dotted names only, optionally ending in a dot: ``torch._inductor.``, which is that
  module and every module below it.

Entries are separated by ``;``. Matching them against a stack is cgguard._rules.exempt_match's work.
"""

# Read on the start-up path whenever CGGUARD_EXEMPT or CGGUARD_EXEMPT_FILE is set, before torch:
# standard library only, no ``typing``, and no ``re`` (fnmatch brings it): a glob is only
# compiled when a violation is matched against it.
import os
import stat

from cgguard._rules.table import NAMES
from cgguard._support.text import plain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    Pair = tuple[str, str]  # (rule, place), as a Config keeps an exemption

SEPARATOR = ";"
_RULES = frozenset(NAMES)
FILE, FUNCTION, MODULE = "file", "function", "module"
_GLOB = frozenset("*?[")

# What an entry looks like, for the messages that refuse one.
SYNTAX = (
    "RULE=PLACE, PLACE a module (torch._inductor.), a file glob with a '/' (*/kernels.py) "
    "or a function (module:qualname)"
)

# An exemptions file is a short list written by hand: anything longer is the wrong file (a
# path to a log, a device), and is refused rather than read into memory.
LONGEST_FILE = 1 << 20


class EntryError(ValueError):
    """An exemption refused: the entry, or the value that holds it, and why."""

    def __init__(self, entry: object, reason: str) -> None:
        super().__init__(entry, reason)
        self.entry = entry
        self.reason = reason


def text(pair: "Pair") -> str:
    """An exemption as it is written: ``rule=place``."""
    return f"{pair[0]}={pair[1]}"


def kind(place: str) -> str:
    """FILE, FUNCTION or MODULE: which kind of place ``place`` is, from its characters."""
    if "/" in place:
        return FILE
    if ":" in place:
        return FUNCTION
    return MODULE


def problem(place: str) -> "str | None":
    """Why ``place`` is not a place, or None when it is one."""
    found = kind(place)
    if not place:
        reason: str | None = "no PLACE after '='"
    elif found == FILE:
        reason = None
    elif found == FUNCTION:
        module, _, qualname = place.partition(":")
        valid = is_module(module) and _is_qualname(qualname)
        reason = None if valid else "a function is module:qualname (vllm_plugin.kernels:Kernel.run)"
    elif _GLOB & set(place) or place.endswith(".py"):
        # The likeliest mistake of all: a file named without its folder.
        reason = f"a file glob holds a '/': write */{place}"
    elif not is_module(place.removesuffix(".")):
        reason = "not a module name, a file glob with a '/' nor module:qualname"
    else:
        reason = None
    return reason


def is_catch_all(place: str) -> bool:
    """Whether ``place`` matches every frame that has a file: a file glob that matches every
    absolute path, which every imported module's frames have, torch's own among them.

    Only a glob made of ``*``, ``?`` and ``/`` alone can: any other character, or a ``[...]``
    class, asks for something a path may lack. It matches every absolute path, ``/a`` the
    shortest, exactly when it has one ``/``, nothing but ``*`` before it, and after it at least
    one ``*`` and at most one ``?``. A module or a function names one module's frames only.
    """
    if "/" not in place or place.strip("*?/"):  # not a file glob, or another character in it
        return False
    before, _, after = place.partition("/")
    return not before.strip("*") and "/" not in after and "*" in after and after.count("?") <= 1


def is_module(name: str) -> bool:
    """Whether ``name`` is a dotted module name (``torch._inductor``)."""
    # map() over the method rather than a generator; "" splits into [""], no identifier.
    return all(map(str.isidentifier, name.split(".")))


def _is_qualname(qualname: str) -> bool:
    parts = qualname.split(".")
    return all(map(str.isidentifier, parts)) or all(map(_is_name_part, parts))


def _is_name_part(part: str) -> bool:
    # A qualname names nested functions through "<locals>", and lambdas as "<lambda>".
    if part.startswith("<") and part.endswith(">"):
        part = part[1:-1]
    return part.isidentifier()


def parse_entry(entry: str) -> "Pair":
    """One ``RULE=PLACE`` entry as its (rule, place); ValueError with the reason otherwise.

    The rule is read in any case, as every CGGUARD_* value is; the place is kept as written,
    since module names and files are case-sensitive.
    """
    rule, equals, place = entry.partition("=")
    rule, place = rule.strip().lower(), place.strip()
    if not equals:
        raise ValueError("not RULE=PLACE")
    if rule not in _RULES:
        raise ValueError(f"no rule {rule!r}; the rules are {', '.join(NAMES)}")
    reason = problem(place)
    if reason is not None:
        raise ValueError(reason)
    return rule, place


def parse(value: str) -> "tuple[list[Pair], list[tuple[str, str]]]":
    """The exemptions of ``;``-separated entries: those accepted, and (entry, reason) for the
    rest, which do not stop the others from applying. Empty entries are nothing."""
    pairs: dict[Pair, None] = {}
    refused: list[tuple[str, str]] = []
    _parse_into(pairs, refused, value)
    return list(pairs), refused


def _parse_into(pairs: "dict[Pair, None]", refused: "list[tuple[str, str]]", value: str) -> None:
    """Add the entries of ``value`` to ``pairs``, a dict for its keys' order: each is looked up
    once, where a list would compare it with every entry before it."""
    for entry in value.split(SEPARATOR):
        if not entry.strip():
            continue
        try:
            pair = parse_entry(entry)
        except ValueError as exc:
            refused.append((entry.strip(), str(exc)))
            continue
        pairs.setdefault(pair, None)


# The last parse of each exemptions file, by path: the bytes read and what they gave. Activation
# parses the file at start-up to warn, and install() again to apply it: a file that reads the
# same is not parsed twice. Compared by content, not by a stat of it: a file rewritten in place
# may keep its size and, within the clock's resolution, its modification time.
_parsed: "dict[str, tuple[bytes, tuple[Pair, ...], tuple[tuple[int, str, str], ...]]]" = {}


def parse_file(
    path: str,
) -> "tuple[list[Pair], list[tuple[int, str, str]], str | None]":
    """An exemptions file: one entry a line (or several, ``;``-separated), ``#`` comments.

    Returns the exemptions accepted, (line, entry, reason) for each refused, and why the file
    could not be read at all, if it could not (nothing of it applies then). The file is read
    at every call, and parsed again only when what it holds changed.
    """
    try:
        # O_NONBLOCK: a FIFO at the path would block a plain open until a writer came, and
        # start-up with it. What the open file is decides, not a stat of the path before.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return [], [], "not a regular file"
            data = handle.read(LONGEST_FILE + 1)
    except OSError as exc:
        return [], [], exc.strerror or str(exc)
    if len(data) > LONGEST_FILE:
        return [], [], f"longer than {LONGEST_FILE} bytes"
    cached = _parsed.get(path)
    if cached is not None and cached[0] == data:
        return list(cached[1]), list(cached[2]), None
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError:
        return [], [], "not UTF-8 text"
    pairs: dict[Pair, None] = {}
    refused: list[tuple[int, str, str]] = []
    bad: list[tuple[str, str]] = []
    for number, line in enumerate(content.splitlines(), 1):
        _parse_into(pairs, bad, _uncommented(line))
        if bad:
            refused += [(number, entry, reason) for entry, reason in bad]
            bad.clear()
    _parsed[path] = (data, tuple(pairs), tuple(refused))
    return list(pairs), refused, None


def _uncommented(line: str) -> str:
    """``line`` without its comment: from a ``#`` that starts the line or follows a blank.

    A ``#`` inside a word stays: a file glob may hold one.
    """
    # By find(), not character by character: a file may hold a million of them.
    at = line.find("#")
    while at > 0 and not line[at - 1].isspace():
        at = line.find("#", at + 1)
    return line if at < 0 else line[:at]


def normalize(value: object) -> "tuple[Pair, ...]":
    """``Config(exempt=...)`` as a Config keeps it: (rule, place) pairs, in order, once each.

    Accepts None (none), a str of ``;``-separated entries, an iterable of such strs and of
    (rule, place) pairs, or a mapping of rule to a place or an iterable of places. EntryError,
    naming the entry, for anything else.
    """
    if value is None:
        return ()
    # A dict for its keys' order: each pair is looked up once, not compared with every other.
    pairs = dict.fromkeys(_checked_pair(rule, place) for rule, place in _candidates(value))
    return tuple(pairs)


def _candidates(value: object) -> "Iterable[tuple[object, object]]":
    """The (rule, place) candidates ``value`` gives, not yet checked."""
    if plain(value) is not None:
        yield from _entries(str.__str__(value))  # a str, just checked
        return
    from collections.abc import Iterable, Mapping  # not at start-up: Config only

    if isinstance(value, Mapping):
        for rule, places in value.items():
            if plain(places) is not None or not isinstance(places, Iterable):
                yield rule, places
            else:
                yield from ((rule, place) for place in places)
        return
    if not isinstance(value, Iterable) or isinstance(value, (bytes, bytearray)):
        raise EntryError(value, "not a str, a sequence of entries or a mapping")
    for item in value:
        if plain(item) is not None:
            yield from _entries(str.__str__(item))
        elif isinstance(item, tuple) and len(item) == 2:
            yield item[0], item[1]
        else:
            raise EntryError(item, "neither an entry nor a (rule, place) pair")


def _entries(value: str) -> "Iterable[tuple[object, object]]":
    for entry in value.split(SEPARATOR):
        if not entry.strip():
            continue
        rule, equals, place = entry.partition("=")
        if not equals:
            raise EntryError(entry.strip(), "not RULE=PLACE")
        yield rule, place


def _checked_pair(rule: object, place: object) -> "Pair":
    if plain(rule) is None or plain(place) is None:
        raise EntryError((rule, place), "a rule and a place are each a str")
    entry = f"{str.__str__(rule).strip()}={str.__str__(place).strip()}"
    try:
        return parse_entry(entry)
    except ValueError as exc:
        raise EntryError(entry, str(exc)) from None
