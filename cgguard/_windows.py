"""Capture windows: the functions, or the framework state, inside which captures belong.

An entry is ``module:qualname``. What it names decides what kind of window it is, once the
module is imported (cgguard never imports it): a function or method is a window while it runs
(the attribute as found is wrapped, so a decorator's wrapper, ``@torch.inference_mode()``'s,
counts as the function); a ContextVar is true while its value is; a ``threading.local``'s
attribute (``module:local.attr``) and any other attribute are true while their value is, read
on the capturing thread. The state they share, and what it means for a capture, is
cgguard._flags.Windows; this module resolves entries and puts the wrappers on.
"""

from __future__ import annotations

import functools
import sys
import threading
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple

from cgguard import _startup, _state
from cgguard._flags import ENDED, Predicate
from cgguard._patchset import PatchSet
from cgguard._settings import WINDOW_SYNTAX, shown
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType, ModuleType

    from cgguard._flags import Windows

    # A built-in profile's reader: from the module, the kind of state and its read, or None
    # when the module lacks it.
    Reader = Callable[[ModuleType], "tuple[str, Callable[[], object]] | None"]

_MISSING: Any = object()

FUNCTION = "function"


class WindowInfo(NamedTuple):
    """A declared capture window, as status() shows it."""

    entry: str  # as declared: module:qualname
    kind: str | None  # "function", "module attribute", "ContextVar", "thread-local attribute";
    # None while its module is not imported, or when the entry names nothing it can watch
    state: str  # "waiting for import", "not resolved", "watched", "open" (a function running)


class Entry:
    """One declared window: resolved when its module is imported, undone by undo()."""

    def __init__(
        self,
        entry: str,
        windows: Windows | None = None,
        *,
        read: Reader | None = None,
        context: bool = False,
        quiet: bool = False,
    ) -> None:
        self.entry = entry
        self.module_name = entry.partition(":")[0]
        # The windows this entry is one of: the declared ones, or a built-in profile's.
        self.windows = windows if windows is not None else _state.WINDOWS
        # A built-in profile's state that no entry's form can name (a getter's result, a
        # value that is true when not None): read from the module by this, when given.
        self.reader = read
        # The function returns a context manager, and the window is its ``with`` body.
        self.context = context
        # A built-in profile's entry for another release of its framework: what it names may
        # well be missing here, which is no mistake worth a warning.
        self.quiet = quiet
        self.absent = False
        self.kind: str | None = None
        self.resolved = False
        self.calls: list[None] = []  # one per call of this window's function under way
        self.predicate: Predicate | None = None
        self.patches = PatchSet()
        self.undone = False

    def apply(self, module: ModuleType) -> None:
        if self.undone:
            return  # undone while its module was still being imported
        try:
            problem = self._resolve(module)
        except Exception as exc:  # an attribute whose own lookup fails
            problem = f"{exc!r}"
        self.resolved = True
        if problem is not None and self.quiet:
            self.absent = True
        elif problem is not None:
            line = (
                f"ignoring the capture window {shown(self.entry)}: {problem}; an entry is "
                f"{WINDOW_SYNTAX}"
            )
            warn_once(line, line)

    def _resolve(self, module: ModuleType) -> str | None:
        """Watch what the entry names; the reason it cannot be watched, if so."""
        if self.reader is not None:
            return self._read_by(self.reader, module)
        *path, name = self.entry.partition(":")[2].split(".")
        owner: Any = module
        for part in path:
            owner = getattr(owner, part, _MISSING)
            if owner is _MISSING:
                return f"{module.__name__} has no {part!r}"
        if isinstance(owner, threading.local):
            # Per thread: the attribute may be unset on this one, and is read on each.
            self._watch("thread-local attribute", functools.partial(getattr, owner, name, False))
            return None
        in_class = isinstance(owner, type)
        # On a class, the attribute as the class holds it (a staticmethod stays one), its own
        # or the one it inherits: a subclass's override is a window entry of its own.
        raw = (
            next((vars(k)[name] for k in owner.__mro__ if name in vars(k)), _MISSING)
            if in_class
            else _MISSING
        )
        value = getattr(owner, name, _MISSING)
        if value is _MISSING:
            return f"{getattr(owner, '__name__', shown(owner))} has no {name!r}"
        if isinstance(value, ContextVar):
            var: ContextVar[object] = value
            self._watch("ContextVar", functools.partial(var.get, None))
        elif isinstance(value, type):
            return "it names a class; a function window names a function or method"
        elif callable(value):
            found = raw if raw is not _MISSING else value
            self.patches.replace(owner, name, self._wrapped(found, in_class=in_class))
            self.kind = FUNCTION
        else:
            self._watch("module attribute", functools.partial(getattr, owner, name, False))
        return None

    def _read_by(self, reader: Reader, module: ModuleType) -> str | None:
        found = reader(module)
        if found is None:
            return f"{module.__name__} has no {self.entry.partition(':')[2]!r}"
        self._watch(*found)
        return None

    def _watch(self, kind: str, read: Any) -> None:
        self.kind = kind
        self.predicate = Predicate(self.entry, kind, read)
        windows = self.windows
        windows.predicates = (*windows.predicates, self.predicate)
        join(windows)

    def _wrapped(self, found: Any, *, in_class: bool) -> Any:
        """The attribute as found, wrapped so that a call of it opens the window."""
        if isinstance(found, (staticmethod, classmethod)):
            return type(found)(self._wrapped(found.__func__, in_class=False))
        if self.context:
            return self._wrapped_context(found)
        windows, entry = self.windows, self.entry
        # list.append and list.pop are atomic: a counter's += would need a lock on every call.
        calls, mine = windows.calls, self.calls

        # A plain function, not a wrapt wrapper: it binds as the method it replaces, and costs
        # a fraction of wrapt's call protocol on every call (benchmarks/window_overhead.py).
        @functools.wraps(found)
        def window(*args: Any, **kwargs: Any) -> Any:
            mine.append(None)
            calls.append(None)
            if not windows.entered:
                windows.enter_first()
            try:
                return found(*args, **kwargs)
            finally:
                mine.pop()
                calls.pop()
                if not calls:
                    # The last call under way returned: the windows close at its caller.
                    caller = sys._getframe(1)
                    closed = windows.closed
                    # Called in a loop, from the line that closed them last: that stack holds.
                    if (
                        closed is None
                        or closed[0] is not entry
                        or closed[2][0] is not caller.f_code
                        or closed[2][1] != caller.f_lasti
                    ):
                        windows.close(entry, caller)

        if in_class and not hasattr(found, "__get__"):
            # A callable object a class keeps as it is (no method binding): kept unbound.
            return staticmethod(window)
        return window

    def _wrapped_context(self, found: Any) -> Any:
        """A function returning a context manager, wrapped so that its ``with`` body is the
        window: the call itself only builds the manager (``contextlib.contextmanager``'s)."""
        windows, entry, mine = self.windows, self.entry, self.calls

        @functools.wraps(found)
        def window(*args: Any, **kwargs: Any) -> Any:
            return _Opening(found(*args, **kwargs), windows, entry, mine)

        return window

    def undo(self) -> None:
        self.undone = True
        _startup.cancel(self.module_name, self.apply)
        if self.predicate is not None:
            windows = self.windows
            windows.predicates = tuple(p for p in windows.predicates if p is not self.predicate)
            self.predicate = None
        self.patches.restore()

    def info(self) -> WindowInfo:
        if not self.resolved:
            return WindowInfo(self.entry, None, "waiting for import")
        if self.absent:
            return WindowInfo(self.entry, None, "not in this release")
        if self.kind is None:
            return WindowInfo(self.entry, None, "not resolved")
        state = "open" if self.calls else "watched"
        return WindowInfo(self.entry, self.kind, state)


class _Opening:
    """The context manager a context window's function returned: open while it is entered."""

    __slots__ = ("_entry", "_manager", "_mine", "_windows")

    def __init__(self, manager: Any, windows: Windows, entry: str, mine: list[None]) -> None:
        self._manager = manager
        self._windows = windows
        self._entry = entry
        self._mine = mine

    def __enter__(self) -> Any:
        windows = self._windows
        self._mine.append(None)
        windows.calls.append(None)
        if not windows.entered:
            windows.enter_first()
        try:
            return self._manager.__enter__()
        except BaseException:
            self._leave(sys._getframe(1))
            raise

    def __exit__(self, *exc_info: object) -> Any:
        try:
            return self._manager.__exit__(*exc_info)
        finally:
            self._leave(sys._getframe(1))

    def _leave(self, caller: FrameType) -> None:
        windows = self._windows
        self._mine.pop()
        windows.calls.pop()
        if not windows.calls:
            windows.close(self._entry, caller, ENDED)


# The windows declared, by entry, in the order declared.
_declared: dict[str, Entry] = {}


def join(windows: Windows) -> None:
    """Put ``windows`` among what may disable capture: from now on every capture asks them."""
    if windows not in _state.FOLLOWED:
        _state.FOLLOWED.append(windows)


def leave(windows: Windows) -> None:
    """Take ``windows`` out of what may disable capture."""
    if windows in _state.FOLLOWED:
        _state.FOLLOWED.remove(windows)


def watch(declared: Entry) -> None:
    """Resolve ``declared`` now if its module is imported, else once it is (never importing it)."""
    module = sys.modules.get(declared.module_name)
    if module is not None and _startup.is_initializing(module):
        # Being imported now (its own import of torch activated cgguard, say): resolved
        # once it has run to its end, with every name it defines.
        _startup.when_initialized(module, declared.apply)
    elif module is not None:
        declared.apply(module)
    else:
        _startup.when_imported(declared.module_name, declared.apply)


def declare(entries: tuple[str, ...]) -> None:
    """Watch exactly these windows: the others are undone, the ones kept keep their state."""
    if tuple(_declared) == entries:
        return
    for entry in [e for e in _declared if e not in entries]:
        _declared.pop(entry).undo()
    # A different set of windows starts afresh: none entered, none closed.
    windows = _state.WINDOWS
    leave(windows)
    windows.forget()
    windows.on_entered = functools.partial(join, windows)
    for entry in entries:
        if entry in _declared:
            continue
        declared = _declared[entry] = Entry(entry)
        watch(declared)
    if windows.predicates:
        join(windows)


def forget_all() -> None:
    """Stop watching every window: each function put back, each pending import hook gone."""
    declare(())


def windows() -> list[WindowInfo]:
    """The windows declared, in order, and what each is now."""
    return [declared.info() for declared in list(_declared.values())]
