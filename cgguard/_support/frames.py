"""Cheap stack snapshots on the capture path, rendered to text only when a violation is reported."""

from __future__ import annotations

import bisect
import contextlib
import functools
import inspect
import linecache
import opcode
import os
import sys
import weakref
from types import FrameType
from typing import TYPE_CHECKING, Any, TypedDict, cast

from cgguard._support.text import safe

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from types import CodeType

# A snapshot is a flat tuple (code, lasti, code, lasti, ...), innermost frame first. It keeps
# neither frames (their locals may hold GPU tensors) nor line numbers (computing f_lineno costs a
# line-table walk per frame): the line is recovered from lasti when, rarely, a report is made.
# A stack deeper than MAX_DEPTH ends with the pair (how many outer frames were left out, -1).
Snapshot = tuple["CodeType | int", ...]


# Bound the walk so a capture made from deep recursion still costs a fixed amount.
MAX_DEPTH = 128
# A cache keyed by code object: code made at run time (inductor, exec) would grow it without
# end, so it starts again past this size.
_CACHE_MAX = 4096


class FrameInfo(TypedDict):
    """One rendered frame of an event's stack."""

    file: str
    line: int
    function: str
    code: str | None


def snapshot(depth: int = 1) -> Snapshot:
    """Record the calling stack, starting ``depth`` frames above the caller of this function."""
    return snapshot_from(sys._getframe(depth + 1))


def stack_above(depth: int) -> Snapshot:
    """As ``snapshot(depth)``, but from the outermost frame where the stack is shallower than
    ``depth``: a script's top level, or a thread torch started with no
    Python frames of its own (autograd's device threads) that calls into a dispatch mode.

    torch 2.13 wraps a mode's ``__torch_dispatch__`` in ``torch._disable_dynamo``
    (``TorchDispatchMode.__init_subclass__``, torch/utils/_python_dispatch.py), whose two frames
    sit above it even on such a thread; a release without that wrapper has none."""
    frame = sys._getframe(0)  # this one: the caller may be a thread's first frame
    for _ in range(depth + 1):
        if frame.f_back is None:
            break
        frame = frame.f_back
    return snapshot_from(frame)


def snapshot_from(start: FrameType) -> Snapshot:
    """Record the stack from ``start`` outwards."""
    frame: FrameType | None = start
    out: list[CodeType | int] = []
    push = out.append
    for _ in range(MAX_DEPTH):
        if frame is None:
            break
        push(frame.f_code)
        push(frame.f_lasti)
        frame = frame.f_back
    if frame is not None:
        out += (_count(frame), -1)
    return tuple(out)


def _count(frame: FrameType | None) -> int:
    """How many frames from ``frame`` outwards: those a deep stack leaves out, counted only."""
    count = 0
    while frame is not None:
        count += 1
        frame = frame.f_back
    return count


# The rendered stand-in for the frames a deep stack left out, outermost.
OMITTED = "<frames not kept>"


# Where a ``with torch.cuda.graph`` capture began, cheaply: (the caller's frame, its
# instruction), walked on demand. Walking the stack costs a frame object per level on every
# capture, and most captures are never named in a report. The caller's frame runs for the whole
# ``with`` body, so walked while the capture is active, its callers' lines are exact; it is
# dropped at capture_end. A plain tuple, as the capture path makes one per capture.
LiveStack = tuple["FrameType", int]


# CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR: frames suspended at each yield, without
# callers while they are.
SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
# The instructions that enter a ``with`` block (3.10: SETUP_WITH; 3.11 to 3.13: BEFORE_WITH).
ENTERS_WITH = frozenset(opcode.opmap.get(n, -1) for n in ("SETUP_WITH", "BEFORE_WITH"))


def with_stack(frame: FrameType) -> Snapshot | LiveStack:
    """Where a ``with torch.cuda.graph(...)`` began, from the frame that called __enter__ (the
    capture path's hook on __enter__ does the same, inline).

    A frame stopped at the instruction that enters a ``with`` runs for the whole block, so
    keeping it is enough and cheap. Anything else (a helper that calls ``__enter__()`` and
    returns, ``ExitStack.enter_context``, a generator, wrapt's pure-Python wrapper, Pythons
    whose ``with`` is a plain call) is walked now.
    """
    code, lasti = frame.f_code, frame.f_lasti
    # co_code is cached on the code object, without specialisation or instrumentation; f_lasti
    # is the byte offset of the instruction running. When a ``with`` calls __enter__ that is
    # the with-entry itself, except on 3.10 where an EXTENDED_ARG before it (a body of over
    # 255 instructions) is what f_lasti shows: that case is walked, exactly if less cheaply.
    if code.co_code[lasti] in ENTERS_WITH and not code.co_flags & SUSPENDS:
        return (frame, lasti)
    return snapshot_from(frame)


def walk(stack: LiveStack) -> Snapshot:
    """The snapshot a live stack stands for."""
    frame, lasti = stack
    out: list[CodeType | int] = [frame.f_code, lasti]
    caller = frame.f_back
    for _ in range(MAX_DEPTH - 1):
        if caller is None:
            break
        out += (caller.f_code, caller.f_lasti)
        caller = caller.f_back
    if caller is not None:
        out += (_count(caller), -1)
    return tuple(out)


def resolve(stack: Snapshot | LiveStack) -> Snapshot:
    """A snapshot, whichever form the stack was kept in."""
    if len(stack) == 2 and isinstance(stack[0], FrameType):
        return walk(stack)
    return stack


# By id(), the code object held weakly, its entry gone with it (before its id() can be
# another's): where each range of a code object's instructions starts, and its line. co_lines()
# is walked once per code object, since a walk from the start for every frame rendered makes a
# generated function of thousands of lines (inductor's output code, a templated kernel) cost in
# proportion to its size per violation, or per census site.
_lines: dict[int, tuple[weakref.ref[CodeType], list[int], list[int | None]]] = {}


def _forget(
    cache: dict[int, tuple[Any, ...]],
    ident: int,
    then: Callable[[tuple[Any, ...]], object] | None,
    ref: weakref.ref[CodeType],
) -> None:
    """A code object held weakly by ``cache`` is gone: its entry goes, and ``then`` is told of
    it. The garbage collector's, on any thread: one dict operation each, no lock."""
    held = cache.get(ident)
    if held is not None and held[0] is ref:
        cache.pop(ident, None)
        if then is not None:
            then(held)


def held_weakly(
    cache: dict[int, tuple[Any, ...]],
    code: CodeType,
    then: Callable[[tuple[Any, ...]], object] | None = None,
) -> weakref.ref[CodeType]:
    """A weak reference to ``code``, for the first item of its entry in ``cache`` (keyed by
    ``id(code)``), that takes the entry out with the code, before its id() can be another's,
    then calls ``then`` with the entry."""
    return weakref.ref(code, functools.partial(_forget, cache, id(code), then))


def _line_of(code: CodeType, lasti: int) -> int:
    """The line of the instruction at byte offset ``lasti``; the first line where it has none."""
    if lasti < 0:
        return code.co_firstlineno
    cached = _lines.get(id(code))
    if cached is None:
        if len(_lines) >= _CACHE_MAX:
            _lines.clear()
        starts, lines = _line_table(code)
        _lines[id(code)] = (held_weakly(_lines, code), starts, lines)
    else:
        starts, lines = cached[1], cached[2]
    # starts[0] is 0, so a lasti of 0 or more lies in one of the ranges.
    line = lines[bisect.bisect_right(starts, lasti) - 1]
    return code.co_firstlineno if line is None else line


def _line_table(code: CodeType) -> tuple[list[int], list[int | None]]:
    """(the offset where each range starts, its line): a range runs to the next one's start.

    co_lines() yields consecutive (start, end, line) ranges in order of offset. An empty range
    (3.10 yields some) holds no instruction and is left out; a range whose line is None, a gap
    before or between ranges, and every offset past the last range have no line. Ranges of one
    line that follow each other are one entry; starts[0] is always 0.
    """
    starts: list[int] = []
    lines: list[int | None] = []
    reached = 0  # where the ranges seen so far end
    for begins, end, line in code.co_lines():
        start = max(begins, reached)  # were ranges to overlap, the first would hold
        if end <= start:
            continue
        if start > reached:
            starts.append(reached)
            lines.append(None)
        elif starts and lines[-1] == line:
            reached = end
            continue
        starts.append(start)
        lines.append(line)
        reached = end
    starts.append(reached)
    lines.append(None)
    return starts, lines


# The packages whose frames say nothing to the user, besides cgguard's own: their folders are
# known once they are imported.
_HIDDEN_PACKAGES = ("torch", "wrapt")


def _hidden_prefixes() -> tuple[str, ...]:
    """What frames say nothing to the user: cgguard's, torch's, wrapt's and contextlib's.

    contextlib's, because a capture entered by ``ExitStack.enter_context`` or a
    ``@contextmanager`` was begun at the user's line that called it, not in contextlib.
    Folders end with a separator; contextlib is one file.
    """
    prefixes = [os.path.join(os.path.dirname(os.path.dirname(__file__)), "")]  # cgguard/
    for name in _HIDDEN_PACKAGES:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            prefixes.append(os.path.join(os.path.dirname(path), ""))
    prefixes.append(contextlib.__file__)
    return tuple(prefixes)


# A test runner's frames, cut from every rendered stack while set, with the frames outside them:
# (the runner's folders, the folders of its part that calls tests and fixtures). The pytest
# plugin sets pytest's and pluggy's, so that a stack starts at the test function or fixture
# pytest called. Empty: stacks are kept whole.
_runner: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


@contextlib.contextmanager
def started_by(runner: Iterable[str], dispatcher: Iterable[str]) -> Iterator[None]:
    """Within: rendered stacks start below the runner that called the program's function.

    ``runner`` are the runner's folders, ``dispatcher`` those of its part that calls the
    program (for pytest: pluggy, which calls the hook that calls the test). A stack is cut at
    the innermost run of runner frames that holds a dispatcher frame: a runner's helper the
    program calls itself (``pytest.raises(Error, function)``) is kept, as any library is.
    The previous setting returns on exit, so that it nests.
    """
    global _runner
    saved = _runner
    _runner = (_folders(runner), _folders(dispatcher))
    try:
        yield
    finally:
        _runner = saved


def _folders(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(os.path.join(path, "") for path in paths)


def render(stack: Snapshot) -> list[FrameInfo]:
    """The user's frames of ``stack``, outermost first, each with its source line."""
    hidden = _hidden_prefixes()
    # Innermost first: (code, lasti) of each frame kept, or (None, the count left out).
    pairs: list[tuple[CodeType | None, int]] = []
    for i in range(0, len(stack), 2):
        item = stack[i]
        if isinstance(item, int):
            pairs.append((None, item))
        elif not item.co_filename.startswith(hidden):
            pairs.append((item, cast("int", stack[i + 1])))
    frames: list[FrameInfo] = []
    for code, lasti in reversed(_below_runner(pairs)):
        if code is None:
            frames.append(
                {"file": OMITTED, "line": 0, "function": f"{lasti} outer frames", "code": None}
            )
            continue
        frames.append(_frame(code.co_filename, _line_of(code, lasti), code.co_name))
    return frames


def frame_at(code: CodeType | None, lasti: int) -> FrameInfo | None:
    """The user's frame at instruction ``lasti`` of ``code``, rendered; None if hidden."""
    if code is None:
        return None
    frames = render((code, lasti))
    return frames[-1] if frames else None


# A place in the user's code, as a report names it: (file, line, function).
Place = tuple[str, int, str]


def place_of(code: CodeType | None, lasti: int) -> Place | None:
    """Where instruction ``lasti`` of ``code`` is, by value (the code is not kept); None if
    hidden. Code compiled again from one file (a reload, an ``exec`` per request) is at the
    same place."""
    if code is None or not visible(code):
        return None
    return code.co_filename, _line_of(code, lasti), code.co_name


def frame_of(place: Place | None) -> FrameInfo | None:
    """The user's frame at ``place``, with its source line as frame_at() renders it."""
    return _frame(*place) if place is not None else None


def _frame(filename: str, line: int, function: str) -> FrameInfo:
    """A frame as a report holds it, with its source line where the file can be read."""
    text = linecache.getline(filename, line).strip()
    return {"file": filename, "line": line, "function": function, "code": text or None}


def _below_runner(
    pairs: list[tuple[CodeType | None, int]],
) -> list[tuple[CodeType | None, int]]:
    """``pairs`` (innermost first) up to the runner that called them, where one is set."""
    runner, dispatcher = _runner
    if not runner:
        return pairs
    start = None  # where the run of runner frames being walked began
    for i, (code, _) in enumerate(pairs):
        filename = code.co_filename if code is not None else ""
        if not filename.startswith(runner):
            start = None
            continue
        if start is None:
            start = i
        # Not at the innermost frame: a stack all runner's (pytest's own) is kept whole.
        if filename.startswith(dispatcher) and start > 0:
            return pairs[:start]
    return pairs


def where(frames: list[FrameInfo]) -> str:
    """The innermost frame as ``file:line (in function)``, for one-line messages."""
    if not frames:
        return "<unknown>"
    last = frames[-1]
    return place_text((last["file"], last["line"], last["function"]))


def place_text(place: Place | None) -> str:
    """A place as ``file:line (in function)``; "an unknown site" for none (code cgguard could
    not see)."""
    if place is None:
        return "an unknown site"
    return f"{place[0]}:{place[1]} (in {place[2]})"


def format_frames(frames: list[FrameInfo]) -> str:
    """Frames as Python prints a traceback's body, for people reading a console.

    File and function names and source lines are shown safe (cgguard._support.text): code made
    by ``exec`` or ``compile`` names its own, and a terminal must not act on them.
    """
    lines = []
    for f in frames:
        if f["file"] == OMITTED:
            lines.append(f"  ... {safe(f['function'])} not kept")
            continue
        lines.append(f'  File "{safe(f["file"])}", line {f["line"]}, in {safe(f["function"])}')
        if f["code"]:
            lines.append(f"    {safe(f['code'])}")
    return "\n".join(lines)


# By id(): a code object's own hash walks its names and constants on every call. Each entry
# holds its code object weakly and goes with it, before its id() can be another's.
_visible: dict[int, tuple[weakref.ref[CodeType], bool]] = {}
_prefixes: tuple[str, ...] = ()


def visible(code: CodeType) -> bool:
    """Whether render() keeps a frame running ``code``: cgguard's, torch's, wrapt's and
    contextlib's say nothing to the user. Cheap enough for storms: once per code object."""
    cached = _visible.get(id(code))
    if cached is not None:
        return cached[1]
    global _prefixes
    if len(_prefixes) < 2 + len(_HIDDEN_PACKAGES):  # until all are imported, look again
        _prefixes = _hidden_prefixes()
    if len(_visible) >= _CACHE_MAX:
        _visible.clear()
    shown = not code.co_filename.startswith(_prefixes)
    if len(_prefixes) == 2 + len(_HIDDEN_PACKAGES):  # a verdict made with every prefix known
        _visible[id(code)] = (held_weakly(_visible, code), shown)
    return shown


def innermost_visible(stack: Snapshot) -> tuple[CodeType | None, int]:
    """(code, lasti) of the innermost frame that render() would keep."""
    for i in range(0, len(stack), 2):
        code = stack[i]
        if isinstance(code, int):
            break  # the count of frames left out, outermost: no code of its own
        if visible(code):
            return code, cast("int", stack[i + 1])
    return None, -1


def site_of(stack: Snapshot | LiveStack) -> tuple[CodeType | None, int]:
    """The user's innermost frame of a stack as the capture path kept it: (code, instruction).

    A ``with`` statement's frame is the user's, as a rule: then nothing is walked. One in
    hidden code (torch's own ``with torch.cuda.graph``) is walked outwards, while it runs.
    """
    if len(stack) == 2 and type(stack[0]) is FrameType:
        code = stack[0].f_code
        if visible(code):
            return code, stack[1]
        return innermost_visible(walk(stack))
    return innermost_visible(stack)


class Stack:
    """A stack as the capture path kept it, resolved as a report needs it, each part once.

    Its site (the user's innermost frame: where a violation is counted), its snapshot (a live
    ``with`` frame walked, during the call that reports it, while the frame still runs), its
    frames rendered, and where it is in one line. Made once per violation and handed alike to
    the exemptions, the ledger and the event builder: a repeated violation at one site needs
    its site alone, and a ``with`` statement's site needs no walk at all.
    """

    __slots__ = ("_frames", "_site", "_snapshot", "kept")

    def __init__(self, kept: Snapshot | LiveStack) -> None:
        self.kept = kept
        self._snapshot: Snapshot | None = None
        self._site: tuple[CodeType | None, int] | None = None
        self._frames: list[FrameInfo] | None = None

    @property
    def snapshot(self) -> Snapshot:
        """The whole stack, innermost frame first (see Snapshot)."""
        snapshot = self._snapshot
        if snapshot is None:
            snapshot = self._snapshot = resolve(self.kept)
        return snapshot

    @property
    def site(self) -> tuple[CodeType | None, int]:
        """(code, instruction) of the user's innermost frame; (None, -1) if none is."""
        site = self._site
        if site is None:
            known = self._snapshot
            site = self._site = site_of(self.kept if known is None else known)
        return site

    @property
    def frames(self) -> list[FrameInfo]:
        """The user's frames, outermost first, each with its source line."""
        frames = self._frames
        if frames is None:
            frames = self._frames = render(self.snapshot)
        return frames

    @property
    def where(self) -> str:
        """The innermost user frame as ``file:line (in function)``."""
        return where(self.frames)
