"""Cheap stack snapshots on the capture path, rendered to text only when a violation is reported."""

from __future__ import annotations

import inspect
import linecache
import opcode
import os
import sys
from types import FrameType
from typing import TYPE_CHECKING, TypedDict, cast

if TYPE_CHECKING:
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
_SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
# The instructions that enter a ``with`` block (3.10: SETUP_WITH; 3.11 to 3.13: BEFORE_WITH).
_ENTERS_WITH = frozenset(opcode.opmap.get(n, -1) for n in ("SETUP_WITH", "BEFORE_WITH"))


def with_stack(frame: FrameType) -> Snapshot | LiveStack:
    """Where a ``with torch.cuda.graph(...)`` began, from the frame that called __enter__.

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
    if code.co_code[lasti] in _ENTERS_WITH and not code.co_flags & _SUSPENDS:
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


def _line_of(code: CodeType, lasti: int) -> int:
    if lasti >= 0:
        for start, end, line in code.co_lines():
            if start <= lasti < end and line is not None:
                return line
    return code.co_firstlineno


def _hidden_prefixes() -> tuple[str, ...]:
    """Folders whose frames say nothing to the user: cgguard's own, torch's and wrapt's."""
    prefixes = [os.path.dirname(__file__)]
    for name in ("torch", "wrapt"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            prefixes.append(os.path.dirname(path))
    return tuple(os.path.join(p, "") for p in prefixes)


def render(stack: Snapshot) -> list[FrameInfo]:
    """The user's frames of ``stack``, outermost first, each with its source line."""
    hidden = _hidden_prefixes()
    frames: list[FrameInfo] = []
    for i in range(len(stack) - 2, -1, -2):
        if isinstance(stack[i], int):
            left = stack[i]
            frames.append(
                {"file": OMITTED, "line": 0, "function": f"{left} outer frames", "code": None}
            )
            continue
        code, lasti = cast("CodeType", stack[i]), cast("int", stack[i + 1])
        filename = code.co_filename
        if filename.startswith(hidden):
            continue
        line = _line_of(code, lasti)
        text = linecache.getline(filename, line).strip()
        frames.append(
            {"file": filename, "line": line, "function": code.co_name, "code": text or None}
        )
    return frames


def where(frames: list[FrameInfo]) -> str:
    """The innermost frame as ``file:line (in function)``, for one-line messages."""
    if not frames:
        return "<unknown>"
    last = frames[-1]
    return f"{last['file']}:{last['line']} (in {last['function']})"


def format_frames(frames: list[FrameInfo]) -> str:
    """Frames as Python prints a traceback's body, for people reading a console."""
    lines = []
    for f in frames:
        if f["file"] == OMITTED:
            lines.append(f"  ... {f['function']} not kept")
            continue
        lines.append(f'  File "{f["file"]}", line {f["line"]}, in {f["function"]}')
        if f["code"]:
            lines.append(f"    {f['code']}")
    return "\n".join(lines)


# By id(): a code object's own hash walks its names and constants on every call. Each entry
# holds its code object, so that id() cannot be reused while the entry stands.
_visible: dict[int, tuple[CodeType, bool]] = {}
_prefixes: tuple[str, ...] = ()


def innermost_visible(stack: Snapshot) -> tuple[CodeType | None, int]:
    """(code, lasti) of the innermost frame that render() would keep; cheap enough for storms."""
    global _prefixes
    if len(_prefixes) < 3:  # until torch and wrapt are both imported, look again
        _prefixes = _hidden_prefixes()
    for i in range(0, len(stack), 2):
        if isinstance(stack[i], int):
            break  # the count of frames left out, outermost: no code of its own
        code = cast("CodeType", stack[i])
        cached = _visible.get(id(code))
        if cached is not None:
            visible = cached[1]
        else:
            if len(_visible) >= _CACHE_MAX:
                _visible.clear()
            visible = not code.co_filename.startswith(_prefixes)
            _visible[id(code)] = (code, visible)
        if visible:
            return code, cast("int", stack[i + 1])
    return None, -1
