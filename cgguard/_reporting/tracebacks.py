"""How a violation's traceback is shown: ending at the user's line that broke the rule.

A traceback gains an entry for every Python function an exception passes through: between the
user's call and the raise lie cgguard's hooks, and torch's wrappers around them (``torch/
_compile.py``, ``torch/_dynamo/eval_frame.py`` around a dispatch mode). Those trailing entries
are left out of what is shown, never out of the exception: the display gets a shortened copy
for as long as it runs, and ``sys.last_traceback`` (``pdb.pm()``) keeps every frame. Other
exceptions are shown exactly as they would be.

While cgguard is installed, ``sys.excepthook`` and ``threading.excepthook`` show uncaught
violations so, then call the hook that was in place before; the pytest plugin does the same for
a test's failure.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from cgguard._errors import CaptureViolation
from cgguard._support.frames import visible
from cgguard._support.patchset import PatchSet
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]
    ThreadHook = Callable[[threading.ExceptHookArgs], Any]


def trimmed(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` up to its innermost frame of the user's, as a violation's stack counts them
    (``cgguard._support.frames.visible``: not cgguard's, torch's, wrapt's or contextlib's).

    A new chain where entries were left out; ``tb`` itself where none trails the user's frame,
    or where no frame is the user's (a thread torch started): there is nothing better to end at.
    """
    entries: list[TracebackType] = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    last = len(entries) - 1
    while last >= 0 and not visible(entries[last].tb_frame.f_code):
        last -= 1
    if last < 0 or last == len(entries) - 1:
        return entries[0] if entries else None
    shown: TracebackType | None = None
    for entry in reversed(entries[: last + 1]):
        # tb_lasti keeps the instruction, from which Python 3.11+ draws its ^^^ markers.
        shown = TracebackType(shown, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return shown


def violations(exc: BaseException) -> list[CaptureViolation]:
    """``exc`` and every exception shown with it (causes, contexts, members of a group) that
    is a violation, each once."""
    found: list[CaptureViolation] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, CaptureViolation):
            found.append(current)
        todo += (current.__cause__, current.__context__)
        # A builtin from Python 3.11 on, where groups are shown member by member.
        if sys.version_info >= (3, 11) and isinstance(current, BaseExceptionGroup):  # noqa: F821
            todo += current.exceptions
    return found


@contextlib.contextmanager
def shown_trimmed(exc: BaseException) -> Iterator[None]:
    """Within: each violation shown with ``exc`` carries its trimmed traceback; after it, its
    own again. Displays read ``__traceback__`` (Python's own hook prints the exception's, not
    the one it is handed), so this is how a display sees the short one.

    cgguard's own failure here leaves the tracebacks whole, said once on stderr: the display
    must go on.
    """
    saved: list[tuple[CaptureViolation, TracebackType | None]] = []
    try:
        for violation in violations(exc):
            whole = violation.__traceback__
            short = trimmed(whole)
            if short is not whole:
                saved.append((violation, whole))
                violation.__traceback__ = short
    except Exception as error:
        warn_once("traceback", f"could not shorten a violation's traceback: {error!r}")
    try:
        yield
    finally:
        for violation, whole in saved:
            violation.__traceback__ = whole


class _SysHook:
    """``sys.excepthook`` while cgguard is installed: an uncaught violation shown trimmed, by
    the hook that was there before."""

    def __init__(self, previous: ExceptHook) -> None:
        self.previous = previous
        self.active = True  # False once uninstalled: a hook chained to this one still works

    def __call__(
        self, kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> object:
        if not self.active or not isinstance(value, BaseException):
            return self.previous(kind, value, tb)
        whole = value.__traceback__
        with shown_trimmed(value):
            # Handed the trimmed one where it was handed the exception's own (a traceback
            # passed by hand, unlike the exception's, is passed on as it came).
            return self.previous(kind, value, value.__traceback__ if tb is whole else tb)


class _ThreadHook:
    """``threading.excepthook`` while cgguard is installed: as _SysHook, for a thread's
    uncaught exception."""

    def __init__(self, previous: ThreadHook) -> None:
        self.previous = previous
        self.active = True

    def __call__(self, args: threading.ExceptHookArgs) -> object:
        value = args.exc_value
        if not self.active or value is None:
            return self.previous(args)
        whole = value.__traceback__
        with shown_trimmed(value):
            if args.exc_traceback is whole and value.__traceback__ is not whole:
                args = threading.ExceptHookArgs(
                    [args.exc_type, value, value.__traceback__, args.thread]
                )
            return self.previous(args)


class ExceptHooks:
    """The process's hooks for uncaught exceptions while cgguard is installed (one owner,
    cgguard._process)."""

    def __init__(self) -> None:
        # cgguard's hooks in effect; None while cgguard is not installed. Put on and taken off
        # as every patch is: a hook the program sets after cgguard's is left as it is.
        self.hooks: tuple[_SysHook, _ThreadHook] | None = None
        self._patches = PatchSet(keep_newer=True)

    def install(self) -> None:
        """Show uncaught violations trimmed, in every thread. Idempotent: a hook the program
        sets after this one replaces it, and runs as it was set, even when cgguard is
        reconfigured."""
        if self.hooks is not None:
            return
        patches = self._patches
        sys_hook = cast("_SysHook", patches.wrap(sys, "excepthook", _SysHook))
        thread_hook = cast("_ThreadHook", patches.wrap(threading, "excepthook", _ThreadHook))
        self.hooks = (sys_hook, thread_hook)

    def uninstall(self) -> None:
        """Put back the hooks that were there before install(), where cgguard's are still in
        place; a hook set since stays, and cgguard's, if it calls them, passes everything on
        as is."""
        if self.hooks is None:
            return
        for hook in self.hooks:
            hook.active = False
        self.hooks = None
        self._patches.restore()
