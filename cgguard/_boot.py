"""Start-up: activation without code changes, in every process the environment asks for, and
the post-import hook it rests on.

``activate()`` (public as ``cgguard.activate``) is called by the ``cgguard.pth`` line that the
package installs into site-packages, and by the bootstrap ``sitecustomize`` (the folder
``cgguard/_sitecustomize``, and sitecustomize_example). Until torch is imported, an activation with
CGGUARD_ENABLED=1 alone loads cgguard's package and this module, nothing else; then the hook
named ``cgguard._activation:on_torch_import`` builds the configuration and patches torch.

The post-import hook (``when_imported``) calls a function once a module has been imported by
someone else. wrapt has one, but importing wrapt costs more than a whole interpreter start-up.
Hooks may be registered by name (``"module:function"``), so that registering one imports
nothing: the name is resolved when it fires. cgguard's layers above use it to patch torch,
follow frameworks' flags, resolve capture windows and count torch.compile's skips, never
importing a module themselves.

One module, not a folder of two: each module on this path costs an idle start-up about 1% of
a bare interpreter's.

This layer imports nothing of cgguard above it: what it calls up, it names (``module:function``),
resolved when there is work for it.
"""

# On the start-up path of every activated process: standard library only, no ``typing`` or
# ``__future__`` at runtime, and cgguard's other modules only when there is work for them.
import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    Hook = Callable[[ModuleType], None] | str

ENABLED = "CGGUARD_ENABLED"
ON_TORCH_IMPORT = "cgguard._activation:on_torch_import"
# CGGUARD_ENABLED parsed, and every other CGGUARD_* value checked, where it is not plainly "1".
CHECK_ENVIRONMENT = "cgguard._config.settings:activation_says_on"

# How this process was activated ("pth", "sitecustomize"; None if not): the one fact activation
# keeps, here rather than on the installation, so that an idle activation loads nothing more.
activated_by: "str | None" = None

# Whether something else has switched cgguard on in this process (install()), or speaks for
# the process itself (the pytest plugin, which reads its options after conftest files may import
# torch, and says so in its summary). While nothing has and nothing activated, set CGGUARD_*
# variables are said to go unheeded at torch's import: a misspelt CGGUARD_ENABLED would
# otherwise leave the program unguarded in silence.
switched_on = False
SAY_IF_OFF = "cgguard._config.settings:say_if_off"


def activate(origin: str, *, default: bool = False) -> bool:
    """Activate cgguard in this process if the environment asks for it; never raises.

    ``origin`` names the caller ("pth", "sitecustomize"). CGGUARD_ENABLED decides; when it is
    unset, ``default`` does. Returns whether cgguard is active. Idempotent: the .pth, a
    sitecustomize and an explicit install() together patch once.
    """
    global activated_by
    try:
        # CGGUARD_ENABLED=1 and nothing else, the production case, is decided without loading
        # the parser; anything else is checked, so that a typo is reported at start even by a
        # process that never imports torch.
        plain = os.environ.get(ENABLED) == "1" and not any(
            name.startswith("CGGUARD_") and name != ENABLED for name in os.environ
        )
        # Resolved by name: this layer imports nothing of cgguard above it, so that the
        # settings can name their variables from here.
        if not plain and not resolve(CHECK_ENVIRONMENT)(default):
            return False
        if activated_by is None:
            activated_by = origin
            if "torch" in sys.modules:
                resolve(ON_TORCH_IMPORT)(sys.modules["torch"])
            else:
                when_imported("torch", ON_TORCH_IMPORT)
        return True
    except Exception as exc:
        from cgguard._support.warn import warn_once

        warn_once("activate", f"could not activate, captures are not guarded: {exc!r}")
        return False


def watch_switch() -> None:
    """Say once, when torch is imported, if CGGUARD_* variables are set and nothing has switched
    cgguard on. The ``cgguard.pth`` line calls it where CGGUARD_ENABLED is unset or empty and
    another CGGUARD_* variable is set; never raises."""
    try:
        when_imported("torch", SAY_IF_OFF)
    except Exception as exc:
        _warn("watch", f"could not watch the on-switch: {exc!r}")


# The post-import hook. The registries are read by whichever thread imports a watched module,
# and written by install(), uninstall() and follow_flag() on any thread: they are kept under a
# lock, and callbacks run outside it, since a callback may import, and so re-enter the finder.

_lock = _thread.allocate_lock()
# Called once, at the module's next import.
_callbacks: "dict[str, list[Hook]]" = {}
# Called after every later execution of the module: importlib.reload(), or an import after it
# left sys.modules. Kept until cancelled.
_reloads: "dict[str, list[Hook]]" = {}
# Called once the import executing the module now has finished: its spec, swapped once for
# one that sees the end, and the hooks waiting for it.
_finishing: "dict[str, tuple[Any, list[Callable[[ModuleType], object]]]]" = {}


class _PostImportFinder:
    """A meta path finder that finds nothing itself: it wraps the spec the others find."""

    def find_spec(
        self,
        fullname: str,
        path: "Sequence[str] | None" = None,
        target: "ModuleType | None" = None,
    ) -> "ModuleSpec | None":
        if not (_callbacks.get(fullname) or _reloads.get(fullname)):
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


def when_imported(name: str, hook: "Hook") -> None:
    """Call ``hook(module)`` once ``name`` has been imported by someone else.

    ``hook`` is a callable or the name of one, ``"package.module:function"``, imported only
    when it fires. Only registers: a caller that wants "now, if already imported" checks
    sys.modules itself.
    """
    _register(_callbacks, name, hook)


def when_reloaded(name: str, hook: "Hook") -> None:
    """Call ``hook(module)`` after every later execution of ``name``'s code: an
    ``importlib.reload()`` (the module object stays, its names are new), or an import after
    the module left sys.modules. Until cancel()."""
    _register(_reloads, name, hook)


def _register(registry: "dict[str, list[Hook]]", name: str, hook: "Hook") -> None:
    with _lock:
        pending = registry.setdefault(name, [])
        if hook not in pending:
            pending.append(hook)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def is_initializing(module: "ModuleType") -> bool:
    """Whether ``module`` is still being executed by its import: listed in sys.modules, its
    names not all defined yet (a post-import hook on torch can fire inside it)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def when_ready(name: str, hook: "Callable[[ModuleType], None]") -> None:
    """Call ``hook(module)`` as soon as ``name`` is a whole module: now if it is imported, once
    the import executing it finishes if one is under way (its own import of torch may have
    activated cgguard, before it defines its names), else once someone imports it. Never
    imports it; cancel() takes a waiting hook back."""
    module = sys.modules.get(name)
    if module is None:
        when_imported(name, hook)
    elif is_initializing(module):
        when_initialized(module, hook)
    else:
        hook(module)


def when_initialized(module: "ModuleType", hook: "Callable[[ModuleType], object]") -> None:
    """Call ``hook(module)`` once the import executing ``module`` now has finished; a hook
    already waiting for it is not added twice.

    The import system marks the end on the module's spec (``spec._initializing = False``, in
    a ``finally``), so the spec's class is swapped, once however many hooks wait, for one that
    sees that assignment: nothing else is changed, and the spec is its own class again at
    once. A failed import calls no hook: the module is no longer in sys.modules then.
    """
    name = module.__name__
    spec: Any = module.__spec__
    with _lock:
        waiting = _finishing.get(name)
        if waiting is not None and waiting[0] is spec:
            if hook not in waiting[1]:
                waiting[1].append(hook)
            return
        _finishing[name] = (spec, [hook])
        spec.__class__ = _finishing_class(type(spec))
    if not getattr(spec, "_initializing", False):
        # The import finished before the swap took: the end is marked again, for the hooks.
        spec._initializing = False


def _finishing_class(base: "Any") -> "Any":
    """A subclass of the spec's class that, at the end of the import, restores the spec's
    own class and calls the hooks waiting for it."""

    class _Finishing(base):  # type: ignore[misc]  # importlib's ModuleSpec, whatever it is
        def __setattr__(self, attr: str, value: object) -> None:
            base.__setattr__(self, attr, value)
            if attr == "_initializing" and not value:
                self.__class__ = base
                _finished(self)

    return _Finishing


def _finished(spec: "Any") -> None:
    name = spec.name
    with _lock:
        waiting = _finishing.get(name)
        hooks = waiting[1] if waiting is not None and waiting[0] is spec else []
        if hooks:
            del _finishing[name]
    module = sys.modules.get(name)
    if module is None or getattr(module, "__spec__", None) is not spec:
        return  # a failed import: no module to call back with
    for hook in hooks:
        try:
            hook(module)
        except Exception as exc:
            _warn(f"hook:{name}", f"error after importing {name}, ignored: {exc!r}")


def cancel(name: str, hook: "Hook") -> None:
    """Forget a hook registered with when_imported(), when_reloaded() or when_initialized(),
    if it is still waiting."""
    with _lock:
        for registry in (_callbacks, _reloads):
            pending = registry.get(name, [])
            if hook in pending:
                pending.remove(hook)
        waiting = _finishing.get(name)
        if waiting is not None and hook in waiting[1]:
            waiting[1].remove(hook)
        _retire_finder()


def pending(name: str) -> "list[object]":
    """The hooks still waiting for ``name``'s import, or for the import executing it now to
    finish."""
    with _lock:
        waiting = _finishing.get(name)
        return [*_callbacks.get(name, []), *(waiting[1] if waiting is not None else [])]


def _notify(name: str, module: "ModuleType") -> None:
    with _lock:
        hooks = [*_callbacks.pop(name, []), *_reloads.get(name, [])]
        _retire_finder()
    for hook in hooks:
        # A hook's failure must not become the failure of the user's import.
        try:
            (resolve(hook) if isinstance(hook, str) else hook)(module)
        except Exception as exc:
            _warn(f"hook:{name}", f"error after importing {name}, ignored: {exc!r}")


def resolve(hook: str) -> "Callable[..., Any]":
    """The function ``hook`` names as ``"package.module:function"``, its module imported."""
    module, _, function = hook.partition(":")
    # The import statement's own machinery: importlib's package would cost an idle start-up.
    __import__(module)
    found: Callable[..., Any] = getattr(sys.modules[module], function)
    return found


def _retire_finder() -> None:
    # With nothing left to wait for, every later import skips cgguard entirely. Under _lock.
    if not any(_callbacks.values()) and not any(_reloads.values()) and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def _new_lock() -> None:
    # A forked child has only the forking thread: a lock another thread held stays held.
    global _lock
    _lock = _thread.allocate_lock()


if hasattr(os, "register_at_fork"):  # POSIX, where CUDA graphs run
    os.register_at_fork(after_in_child=_new_lock)


def _warn(key: str, message: str) -> None:
    from cgguard._support.warn import warn_once

    warn_once(key, message)
