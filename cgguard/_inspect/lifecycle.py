"""A framework's lifecycle functions (a weight reload, a LoRA load, a wake from sleep): after
each returns, every live graph's bindings are checked (cgguard._inspect.bindings), so that a
stale one is named at the update, not at the garbage output that follows.

The built-in profiles name the functions, as data (cgguard._gate.profiles, ``lifecycle``);
each is wrapped once its module is imported (cgguard never imports it), as a capture window's
function is found: the attribute as its class holds it. The check logs what it finds and never
raises into the framework's call; the next replay of a stale graph is refused under the mode.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import TYPE_CHECKING, Any

from cgguard import _boot
from cgguard._gate.windows import as_held, owner_of, rewrapped
from cgguard._support.patchset import PatchSet
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

_MISSING: Any = object()


class Lifecycle:
    """The lifecycle functions wrapped, and the import hooks still waiting for their modules."""

    def __init__(self, check: Callable[[str], object]) -> None:
        self.check = check  # called with the entry after each call of its function returns
        # keep_newer: a module reloaded since has functions of its own, left as they are.
        self.patches = PatchSet(keep_newer=True)
        self.waiting: list[tuple[str, Callable[[ModuleType], None]]] = []

    def watch(self, entries: tuple[str, ...]) -> None:
        """Wrap each ``module:qualname`` of ``entries`` now if its module is imported, else
        once it is."""
        for entry in entries:
            name = entry.partition(":")[0]
            hook = functools.partial(self._resolve, entry)
            self.waiting.append((name, hook))  # cancel() of one no longer waiting does nothing
            _boot.when_ready(name, hook)

    def undo(self) -> None:
        """Put every function back, and stop waiting for the modules not imported yet."""
        for name, hook in self.waiting:
            _boot.cancel(name, hook)
        self.waiting.clear()
        self.patches.restore()

    def _resolve(self, entry: str, module: ModuleType) -> None:
        # Found as a capture window's function is. A name a release lacks is no mistake: the
        # profiles name several releases' functions.
        held = owner_of(module, entry.partition(":")[2])
        if isinstance(held, str):
            return
        owner, name = held
        found = as_held(owner, name, vars(owner).get(name, _MISSING))
        function = found.__func__ if isinstance(found, (staticmethod, classmethod)) else found
        if not callable(function):
            return
        checked = functools.partial(self._checked, entry)
        wrapper = rewrapped(
            found, functools.partial(after, then=checked), in_class=isinstance(owner, type)
        )
        self.patches.replace(owner, name, wrapper)

    def _checked(self, entry: str) -> None:
        try:
            self.check(entry)
        except Exception as exc:  # the framework's call is never failed by the check
            warn_once(
                f"lifecycle:{entry}",
                f"internal error while checking bindings after {entry}: {exc!r}",
            )


def after(function: Any, then: Callable[[], object]) -> Any:
    """``function``, then ``then()`` once it has returned or raised (a reload that failed half
    way may have rebound some names); an ``async def`` one once its coroutine has."""
    if _is_coroutine_function(function):

        @functools.wraps(function)
        async def awaited(*args: Any, **kwargs: Any) -> Any:
            try:
                return await function(*args, **kwargs)
            finally:
                then()

        return awaited

    @functools.wraps(function)
    def called(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        finally:
            then()

    return called


def _is_coroutine_function(function: Any) -> bool:
    with contextlib.suppress(Exception):
        return inspect.iscoroutinefunction(function)
    return False
