"""Run callbacks right after a module finishes importing, without importing it first.

A small post-import hook of cgguard's own: wrapt has one, but importing wrapt costs more than
a whole interpreter start-up, and this module is on the start-up path. Standard library only.
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

_callbacks: "dict[str, list[Callable[[ModuleType], None]]]" = {}


class _PostImportFinder:
    """A meta path finder that finds nothing itself: it wraps the spec the others find."""

    def find_spec(
        self,
        fullname: str,
        path: "Sequence[str] | None" = None,
        target: "ModuleType | None" = None,
    ) -> "ModuleSpec | None":
        if not _callbacks.get(fullname):
            return None
        spec: ModuleSpec | None = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None:
            return None
        loader: Any = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None or isinstance(loader, type):
            return spec  # no per-import loader object to hook: the import goes on unchanged

        def exec_then_notify(module: "ModuleType") -> None:
            # Undo the instance attribute first: a loader object may be reused.
            loader.__dict__.pop("exec_module", None)
            exec_module(module)
            _notify(fullname, module)

        try:
            loader.exec_module = exec_then_notify
        except (AttributeError, TypeError):
            return spec  # a loader without instance attributes: no hook, import unchanged
        return spec


_finder = _PostImportFinder()


def when_imported(name: str, callback: "Callable[[ModuleType], None]") -> None:
    """Call ``callback(module)`` once ``name`` has been imported by someone else.

    Only registers: a caller that wants "now, if already imported" checks sys.modules itself.
    """
    pending = _callbacks.setdefault(name, [])
    if callback not in pending:
        pending.append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def cancel(name: str, callback: "Callable[[ModuleType], None]") -> None:
    """Forget a callback registered with when_imported(), if it has not run yet."""
    pending = _callbacks.get(name, [])
    if callback in pending:
        pending.remove(callback)
    _retire_finder()


def _notify(name: str, module: "ModuleType") -> None:
    for callback in _callbacks.pop(name, []):
        # A callback's failure must not become the failure of the user's import.
        try:
            callback(module)
        except Exception as exc:
            from cgguard._warn import warn_once

            warn_once(f"hook:{name}", f"error after importing {name}, ignored: {exc!r}")
    _retire_finder()


def _retire_finder() -> None:
    # With nothing left to wait for, every later import skips cgguard entirely.
    if not any(_callbacks.values()) and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
