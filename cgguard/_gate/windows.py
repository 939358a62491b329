"""Capture windows: the functions, or the framework state, inside which captures belong.

An entry is ``module:qualname``. What it names decides what kind of window it is, once the
module is imported (cgguard never imports it): a function or method is a window while it runs
(the attribute as found is wrapped, so a decorator's wrapper, ``@torch.inference_mode()``'s,
counts as the function; one wrapper per function, however many entries, declared or profiles',
name it); a ContextVar is true while its value is; a ``threading.local``'s
attribute (``module:local.attr``) and any other attribute are true while their value is, read
on the capturing thread. The state they share, and what it means for a capture, is
cgguard._gate.flags.Windows; this module resolves entries and puts the wrappers on.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from _thread import get_ident
from contextvars import ContextVar
from types import AsyncGeneratorType, CoroutineType, GeneratorType
from typing import TYPE_CHECKING, Any, NamedTuple

from cgguard import _boot
from cgguard._config.settings import WINDOW_SYNTAX, shown
from cgguard._gate.flags import RETURNED, SUSPENDED, WITH_ENDED, Predicate, Windows
from cgguard._support.patchset import PatchSet
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Generator
    from types import FrameType, ModuleType

    from cgguard._gate.flags import FlagSource

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
        registry: WindowRegistry,
        windows: Windows,
        *,
        read: Reader | None = None,
        context: bool = False,
        quiet: bool = False,
    ) -> None:
        self.entry = entry
        self.module_name = entry.partition(":")[0]
        self.registry = registry
        # The windows this entry is one of: the declared ones, or a built-in profile's.
        self.windows = windows
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
        # The calling thread's id per call of this window's function under way.
        self.calls: list[int] = []
        self.predicate: Predicate | None = None
        # The wrappers that open it: one, or after a reload of its module also those on the
        # functions the reload replaced, which objects made before it still call.
        self.hooks: list[_Hook] = []
        self.undone = False

    def apply(self, module: ModuleType) -> None:
        """Resolve the entry in ``module``, now imported; again after each reload of it, whose
        names are new (a new class, a new function) in the module object that was."""
        if self.undone:
            return  # undone while its module was still being imported
        if self.resolved:
            self._unwatch()
            self.kind, self.absent = None, False
        else:
            _boot.when_reloaded(self.module_name, self.apply)
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
        found = owner_of(module, self.entry.partition(":")[2])
        if isinstance(found, str):
            return found
        owner, name = found
        if isinstance(owner, threading.local):
            # Per thread: the attribute may be unset on this one, and is read on each.
            self._watch("thread-local attribute", functools.partial(getattr, owner, name, False))
            return None
        value = getattr(owner, name, _MISSING)
        if value is _MISSING:
            return f"{getattr(owner, '__name__', shown(owner))} has no {name!r}"
        problem = _unwatchable(value, in_class=isinstance(owner, type))
        if problem is not None:
            return problem
        if isinstance(value, ContextVar):
            var: ContextVar[object] = value
            self._watch("ContextVar", functools.partial(var.get, None))
        elif callable(value):
            self._wrap(owner, name, value)
        else:
            self._watch("module attribute", functools.partial(getattr, owner, name, False))
        return None

    def _wrap(self, owner: Any, name: str, value: object) -> None:
        """Make ``owner.name``, a callable, a window function, through its one wrapper."""
        in_class = isinstance(owner, type)
        found = as_held(owner, name, value)
        hooks = self.registry.hooks
        hook = hooks.get((id(owner), name))
        if hook is None or not hook.patches.holds(owner, name):
            hook = _Hook(hooks, owner, name, found, in_class=in_class)
            hooks[(id(owner), name)] = hook
        hook.add(self)
        if hook not in self.hooks:
            self.hooks.append(hook)
        self.kind = FUNCTION

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
        self.registry.join(windows)

    def opened(self, me: int) -> None:
        """A call of this window's function began on the thread ``me``."""
        windows = self.windows
        self.calls.append(me)
        windows.calls.append(me)
        if not windows.entered:
            windows.enter_first()

    def returned(self, me: int, caller: FrameType, what: str = "") -> None:
        """That call returned to ``caller``, or raised; or (``what`` WITH_ENDED) the ``with`` body
        of a context window ended there; or (``what`` SUSPENDED) the generator or coroutine
        running it gave way to ``caller``."""
        windows = self.windows
        try:
            self.calls.remove(me)
            windows.calls.remove(me)
        except ValueError:  # a call a forked child forgot: the parent's thread made it
            return
        if not windows.calls:
            self.closed_at(caller, what)
            if what is not SUSPENDED and windows.on_closed:
                windows.ended(self.entry)

    def closed_at(self, caller: FrameType, what: str = "") -> None:
        """The last call under way of these windows returned: they close at its caller."""
        windows = self.windows
        closed = windows.closed
        what = what or RETURNED
        # Called in a loop, closed the same way from the line that closed them last: that
        # stack holds.
        if (
            closed is None
            or closed[0] is not self.entry
            or closed[1] is not what
            or closed[2][0] is not caller.f_code
            or closed[2][1] != caller.f_lasti
        ):
            windows.close(self.entry, caller, what)

    def undo(self) -> None:
        self.undone = True
        _boot.cancel(self.module_name, self.apply)
        self._unwatch()
        for hook in self.hooks:
            hook.drop(self)
        self.hooks.clear()

    def _unwatch(self) -> None:
        if self.predicate is not None:
            windows = self.windows
            windows.predicates = tuple(p for p in windows.predicates if p is not self.predicate)
            self.predicate = None

    def info(self) -> WindowInfo:
        if not self.resolved:
            return WindowInfo(self.entry, None, "waiting for import")
        if self.absent:
            return WindowInfo(self.entry, None, "not in this release")
        if self.kind is None:
            return WindowInfo(self.entry, None, "not resolved")
        state = "open" if self.calls else "watched"
        return WindowInfo(self.entry, self.kind, state)


def owner_of(module: ModuleType, qualname: str) -> tuple[Any, str] | str:
    """What holds the last name of ``qualname`` in ``module``, and that name; or why nothing
    does (``pkg.runner has no 'Runner'``)."""
    *path, name = qualname.split(".")
    owner: Any = module
    for part in path:
        owner = getattr(owner, part, _MISSING)
        if owner is _MISSING:
            return f"{module.__name__} has no {part!r}"
    return owner, name


def as_held(owner: Any, name: str, default: Any) -> Any:
    """``owner.name`` as ``owner`` holds it: on a class, its own or inherited attribute before
    binding (a staticmethod stays one; a subclass's override is an attribute of its own);
    ``default`` where a class has none or ``owner`` is no class."""
    if not isinstance(owner, type):
        return default
    return next((vars(k)[name] for k in owner.__mro__ if name in vars(k)), default)


def _unwatchable(value: object, *, in_class: bool) -> str | None:
    """Why ``value``, what an entry names, is no window of any kind, or None."""
    if isinstance(value, type):
        return "it names a class; a function window names a function or method"
    if in_class and not callable(value) and hasattr(type(value), "__get__"):
        # A property, a cached_property, a slot: each instance's value, where the class holds
        # only the descriptor, an object that is always true.
        return (
            f"it names a {type(value).__name__} of a class, a value each instance has, not one "
            "cgguard can read"
        )
    if not callable(value) and not isinstance(value, ContextVar) and _always_true(value):
        return (
            f"its value, {_a(type(value).__name__)}, is true whatever its state, so the window "
            "would never close; a module attribute window names a value that is true while "
            "captures belong (a bool, a number, a container, or None while not)"
        )
    return None


def _always_true(value: object) -> bool:
    """Whether ``value``'s truth can never change: an object whose type defines neither
    __bool__ nor __len__ is true, whatever becomes of it (a module, a threading.Event)."""
    kind = type(value)
    return value is not None and not hasattr(kind, "__bool__") and not hasattr(kind, "__len__")


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


class _Hook:
    """The one wrapper on a window function, whatever entries name it: a declared window and
    a profile's on the same method each open their own windows through it, and the function
    is put back once the last of them is undone."""

    def __init__(
        self,
        hooks: dict[tuple[int, str], _Hook],
        owner: Any,
        name: str,
        found: Any,
        *,
        in_class: bool,
    ) -> None:
        self.hooks = hooks  # the registry's: every window function's wrapper, by owner and name
        self.key = (id(owner), name)
        self.calling: tuple[Entry, ...] = ()  # open while the function runs
        self.opening: tuple[Entry, ...] = ()  # open in the ``with`` body of what it returns
        # Put back only while still in place: a reload of the module may have replaced the
        # wrapper since, with a function of its own that another wrapper now opens.
        self.patches = PatchSet(keep_newer=True)
        self.patches.replace(owner, name, self._wrapped(found, in_class=in_class))

    def add(self, entry: Entry) -> None:
        if entry in self.entries():
            return  # resolved again, its module reloaded: the function as it was
        if entry.context:
            self.opening = (*self.opening, entry)
        else:
            self.calling = (*self.calling, entry)

    def drop(self, entry: Entry) -> None:
        self.calling = tuple(e for e in self.calling if e is not entry)
        self.opening = tuple(e for e in self.opening if e is not entry)
        if not self.calling and not self.opening:
            self.patches.restore()
            if self.hooks.get(self.key) is self:
                del self.hooks[self.key]

    def entries(self) -> tuple[Entry, ...]:
        return (*self.calling, *self.opening)

    def _wrapped(self, found: Any, *, in_class: bool) -> Any:
        """The attribute as found, wrapped so that a call of it opens the windows naming it."""
        return rewrapped(found, self._window, in_class=in_class)

    def _window(self, found: Any) -> Any:
        # A generator's, a coroutine's or an async generator's body runs after the call has
        # returned it, a step at a time: their wrappers are of the same kind, so that inspect
        # and asyncio take them for what they wrap, and open the windows at each step.
        if inspect.isasyncgenfunction(found):
            return _async_generator_window(self, found)
        if inspect.iscoroutinefunction(found):
            return _coroutine_window(self, found)
        if inspect.isgeneratorfunction(found):
            return _generator_window(self, found)
        return _function_window(self, found)


def rewrapped(found: Any, make: Callable[[Any], Any], *, in_class: bool) -> Any:
    """An attribute as found (``as_held``), its function wrapped by ``make``, held as it was:
    a staticmethod or classmethod stays one around the wrapper, and a callable object a class
    keeps without binding (no ``__get__``) stays unbound."""
    if isinstance(found, (staticmethod, classmethod)):
        return type(found)(rewrapped(found.__func__, make, in_class=False))
    wrapper = make(found)
    if in_class and not hasattr(found, "__get__"):
        return staticmethod(wrapper)
    return wrapper


def _function_window(hook: _Hook, found: Any) -> Callable[..., Any]:
    """The wrapper of a plain function: the windows are open while the call runs."""

    # A plain function, not a wrapt wrapper: it binds as the method it replaces, and costs
    # a fraction of wrapt's call protocol on every call (benchmarks/window_overhead.py).
    @functools.wraps(found)
    def window(*args: Any, **kwargs: Any) -> Any:
        calling, opening = hook.calling, hook.opening
        if calling:
            # Entry.opened and Entry.returned inline: this runs on every call.
            me = get_ident()
            for entry in calling:
                entry.calls.append(me)
                windows = entry.windows
                windows.calls.append(me)
                if not windows.entered:
                    windows.enter_first()
            try:
                result = found(*args, **kwargs)
            finally:
                for entry in calling:
                    windows = entry.windows
                    calls = windows.calls
                    try:
                        entry.calls.remove(me)
                        calls.remove(me)
                    except ValueError:  # a call a forked child forgot
                        continue
                    if calls:
                        continue
                    caller = sys._getframe(1)
                    closed = windows.closed
                    # Called in a loop, from the line that closed them last: that holds.
                    if (
                        closed is None
                        or closed[0] is not entry.entry
                        or closed[1] is not RETURNED
                        or closed[2][0] is not caller.f_code
                        or closed[2][1] != caller.f_lasti
                    ):
                        windows.close(entry.entry, caller)
                    if windows.on_closed:
                        windows.ended(entry.entry)
            # What only runs once returned: a generator or coroutine made by a function
            # inspect cannot tell (a wrapper without __wrapped__, a compiled one).
            if type(result) in _STEPPED:
                return _stepped(hook, result)
        else:
            result = found(*args, **kwargs)
        # A function returning a context manager: its ``with`` body is the window (the
        # call itself only builds the manager, ``contextlib.contextmanager``'s).
        return _Opening(result, opening) if opening else result

    return window


# What a call returns that runs the function's body later, a step at a time.
_STEPPED = frozenset((GeneratorType, CoroutineType, AsyncGeneratorType))


def _steps(
    calling: tuple[Entry, ...], inner: Any, done: str = RETURNED
) -> Generator[Any, Any, Any]:
    """``yield from inner`` (PEP 380's expansion), with the windows ``calling`` open while each
    step of ``inner`` runs, and closed at each of its yields: a suspended generator or
    coroutine runs on no thread, and one never run to its end would hold them open for good.

    Run by a generator, a coroutine or an async generator of its own (the window function's
    wrapper): the frame that resumed that one is where the windows close. ``done`` is what
    the end of ``inner`` is: its return, or (an async generator's ``asend``) its next yield.
    """
    send, throw = inner.send, inner.throw
    value: Any = None
    error: BaseException | None = None
    while True:
        me = get_ident()
        for entry in calling:
            entry.opened(me)
        what = SUSPENDED
        try:
            yielded = send(value) if error is None else throw(error)
        except StopIteration as stop:
            what = done
            return stop.value
        except BaseException:
            what = RETURNED
            raise
        finally:
            error = None
            _left(calling, me, what)
        try:
            value = yield yielded
        except GeneratorExit:
            # Closed before its end: what runs now (its finally blocks) runs inside too.
            me = get_ident()
            for entry in calling:
                entry.opened(me)
            try:
                inner.close()
            finally:
                _left(calling, me, RETURNED)
            raise
        except BaseException as exc:  # thrown in: on into ``inner``, as ``yield from`` does
            error = exc


def _left(calling: tuple[Entry, ...], me: int, what: str) -> None:
    """A step of ``_steps`` ended: the windows close where its wrapper was resumed from."""
    wrapper = sys._getframe(2)  # _left, _steps, then the wrapper that runs _steps
    caller = wrapper.f_back or wrapper  # none: resumed by C code alone (a thread's target)
    for entry in calling:
        entry.returned(me, caller, what)


def _generator_window(hook: _Hook, found: Any) -> Callable[..., Generator[Any, Any, Any]]:
    """The wrapper of a generator function: the windows are open while its body runs."""

    @functools.wraps(found)
    def window(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        inner = found(*args, **kwargs)
        calling = hook.calling
        if not calling:
            return (yield from inner)
        return (yield from _steps(calling, inner))

    return window


def _coroutine_window(hook: _Hook, found: Any) -> Callable[..., Any]:
    """The wrapper of an ``async def`` function: the windows are open while its body runs."""

    @functools.wraps(found)
    async def window(*args: Any, **kwargs: Any) -> Any:
        inner = found(*args, **kwargs)
        calling = hook.calling
        if not calling:
            return await inner
        return await _Awaited(calling, inner)

    return window


def _async_generator_window(hook: _Hook, found: Any) -> Callable[..., AsyncGenerator[Any, Any]]:
    """The wrapper of an async generator function: the windows are open while its body runs,
    a step (``asend``, ``athrow``, ``aclose``) at a time."""

    @functools.wraps(found)
    async def window(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        inner = found(*args, **kwargs)
        calling = hook.calling
        value: Any = None
        error: BaseException | None = None
        while True:
            step = inner.asend(value) if error is None else inner.athrow(error)
            error = None
            try:
                yielded = await _Awaited(calling, step, SUSPENDED)
            except StopAsyncIteration:
                return
            try:
                value = yield yielded
            except GeneratorExit:
                await _Awaited(calling, inner.aclose())
                raise
            except BaseException as exc:  # thrown in (athrow): on into ``inner``
                error = exc

    return window


def _stepped(hook: _Hook, made: Any) -> Any:
    """A generator, coroutine or async generator ``made`` by a window function that inspect
    could not tell for one: the same kind, stepped inside the windows."""
    kind = type(made)
    if kind is GeneratorType:
        return _generator_window(hook, lambda: made)()
    if kind is CoroutineType:
        return _coroutine_window(hook, lambda: made)()
    return _async_generator_window(hook, lambda: made)()


class _Awaited:
    """``await inner`` with the windows open while each of its steps runs."""

    __slots__ = ("_calling", "_done", "_inner")

    def __init__(self, calling: tuple[Entry, ...], inner: Any, done: str = RETURNED) -> None:
        self._calling = calling
        self._inner = inner
        self._done = done

    def __await__(self) -> Generator[Any, Any, Any]:
        # An asend/athrow/aclose awaitable is its own iterator; a coroutine's is its
        # __await__(): either has send, throw and close, all _steps asks.
        return _steps(self._calling, type(self._inner).__await__(self._inner), self._done)


class _Opening:
    """The context manager a context window's function returned: open while it is entered."""

    __slots__ = ("_entries", "_manager", "_me")

    def __init__(self, manager: Any, entries: tuple[Entry, ...]) -> None:
        self._manager = manager
        self._entries = entries
        self._me = 0

    def __enter__(self) -> Any:
        me = self._me = get_ident()
        for entry in self._entries:
            entry.opened(me)
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

    # An async context manager's ``async with`` body is the window too, open on its thread
    # from __aenter__ to __aexit__ (what the thread runs at the body's awaits included, as
    # anything a ``with`` body calls is).
    async def __aenter__(self) -> Any:
        me = self._me = get_ident()
        for entry in self._entries:
            entry.opened(me)
        try:
            return await self._manager.__aenter__()
        except BaseException:
            self._leave(sys._getframe(1))
            raise

    async def __aexit__(self, *exc_info: object) -> Any:
        try:
            return await self._manager.__aexit__(*exc_info)
        finally:
            self._leave(sys._getframe(1))

    def _leave(self, caller: FrameType) -> None:
        for entry in self._entries:
            entry.returned(self._me, caller, WITH_ENDED)


class WindowRegistry:
    """The process's capture windows: the declared ones, with the one wrapper on each window
    function however many entries, declared or a profile's, name it.

    ``follows`` is what may disable capture besides cgguard's flag (cgguard._gate.gate.Gate):
    a set of windows joins it once one of its windows has been entered or a predicate window
    is resolved, so that until then the capture path pays nothing for it.
    """

    def __init__(self, follows: list[FlagSource | Windows]) -> None:
        self.follows = follows
        # The wrapper on each window function, by its owner's id and the attribute's name.
        self.hooks: dict[tuple[int, str], _Hook] = {}
        # The windows declared (Config(windows=...), CGGUARD_WINDOW), by entry, in order, and
        # the one set they make.
        self.declared: dict[str, Entry] = {}
        self.windows = Windows()
        # What is told each time a set of windows closes, declared or a profile's.
        self.closing: list[Callable[[str], None]] = []
        self.windows.on_closed = self.closing

    def join(self, windows: Windows) -> None:
        """Put ``windows`` among what may disable capture: from now on every capture asks them."""
        if windows not in self.follows:
            self.follows.append(windows)

    def leave(self, windows: Windows) -> None:
        """Take ``windows`` out of what may disable capture."""
        if windows in self.follows:
            self.follows.remove(windows)

    def entry(self, entry: str, windows: Windows, **how: Any) -> Entry:
        """``entry``, one of ``windows``, resolved now if its module is imported, else once it
        is (never importing it)."""
        made = Entry(entry, self, windows, **how)
        # A module being imported now is resolved once it has run to its end, with every
        # name it defines.
        _boot.when_ready(made.module_name, made.apply)
        return made

    def declare(self, entries: tuple[str, ...]) -> None:
        """Watch exactly these windows: the others are undone, the ones kept keep their state."""
        if tuple(self.declared) == entries:
            return
        for entry in [e for e in self.declared if e not in entries]:
            self.declared.pop(entry).undo()
        # A different set of windows starts afresh: none entered, none closed.
        windows = self.windows
        self.leave(windows)
        windows.forget()
        windows.on_entered = functools.partial(self.join, windows)
        for entry in entries:
            if entry not in self.declared:
                self.declared[entry] = self.entry(entry, windows)
        if windows.predicates:
            self.join(windows)

    def forget_all(self) -> None:
        """Stop watching every declared window: each function put back, each pending import
        hook gone."""
        self.declare(())

    def infos(self) -> list[WindowInfo]:
        """The windows declared, in order, and what each is now."""
        return [declared.info() for declared in list(self.declared.values())]

    def after_fork(self) -> None:
        """In a forked child only the forking thread runs on: the calls under way of every
        other thread never return there, so they are forgotten."""
        me = get_ident()
        every = {id(self.windows): self.windows}
        for source in self.follows:
            if isinstance(source, Windows):
                every[id(source)] = source
        for hook in list(self.hooks.values()):
            for entry in hook.entries():
                entry.calls[:] = [c for c in entry.calls if c == me]
                every[id(entry.windows)] = entry.windows
        for windows in every.values():
            windows.calls[:] = [c for c in windows.calls if c == me]
