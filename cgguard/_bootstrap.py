"""Activation without code changes, and the post-import hook it rests on.

``activate()`` is called by the ``cgguard.pth`` line that the package installs into
site-packages, and by the bootstrap ``sitecustomize`` (the runner's, and sitecustomize_example).
Until torch is imported, an activation with CGGUARD_ENABLED=1 alone loads this module and
cgguard's package, nothing else; then the hook builds the configuration and patches torch.

``when_imported()`` is cgguard's own post-import hook, used by activation and by install():
wrapt has one, but importing wrapt costs more than a whole interpreter start-up. Both live in
one module because every module file on this path costs a start-up a measurable share.
"""

# On the start-up path of every activated process: standard library only, no ``typing`` or
# ``__future__`` at runtime, and cgguard's other modules only when there is work for them.
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

ENABLED = "CGGUARD_ENABLED"

# Activation's own state, kept here rather than in cgguard._state so that an idle activation
# loads nothing more: how this process was activated ("pth", "sitecustomize"; None if not),
# and the simulated CUDA runtime it put in place (CGGUARD_SIMULATE_CUDA), kept open.
activated_by: "str | None" = None
simulation: "object | None" = None


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
        if not plain and not _environment_says_on(default):
            return False
        if activated_by is None:
            activated_by = origin
            if "torch" in sys.modules:
                _on_torch_import(sys.modules["torch"])
            else:
                when_imported("torch", _on_torch_import)
        return True
    except Exception as exc:
        _warn(f"could not activate, captures are not guarded: {exc!r}")
        return False


def _environment_says_on(default: bool) -> bool:
    """Parse CGGUARD_ENABLED (``default`` when unset); if on, report every bad CGGUARD_* value."""
    from cgguard import _environ
    from cgguard._warn import warn_once

    enabled = _environ.is_enabled(os.environ)
    raw = os.environ.get(ENABLED, "")
    if enabled is None and raw.strip():
        line = f"ignoring {ENABLED}={raw!r}: accepted values are {_environ.accepted(_environ.BOOL)}"
        warn_once(line, line)
    on = default if enabled is None else enabled
    if on:
        for line in _environ.read(os.environ)[2]:
            warn_once(line, line)
    return on


def _on_torch_import(_: "ModuleType") -> None:
    # Runs right after torch/__init__.py, inside the user's ``import torch``: whatever fails
    # here is one line on stderr, and torch imports regardless.
    global simulation
    try:
        from cgguard._config import Config
        from cgguard._install import install, is_installed

        config = Config.from_environ(warn=False)
        if config.simulate_cuda and simulation is None:
            simulation = _start_simulation()
        # A program that called install() itself, before importing torch, keeps its own
        # configuration: the environment only switches cgguard on.
        install(None if is_installed() else config)
    except Exception as exc:
        _warn(f"could not activate, captures are not guarded: {exc!r}")


def _start_simulation() -> object | None:
    import atexit

    from cgguard._warn import warn_once
    from cgguard.testing import simulated_cuda

    runtime = simulated_cuda()
    try:
        runtime.__enter__()
    except Exception as exc:  # e.g. a torch built with CUDA: guard it all the same, unsimulated
        warn_once("simulation", f"CGGUARD_SIMULATE_CUDA: no simulated CUDA runtime: {exc}")
        return None
    # Left at exit while the interpreter is still whole; a generator closed by the garbage
    # collector at shutdown would run its clean-up with its module's globals already gone.
    atexit.register(runtime.__exit__, None, None, None)
    warn_once(
        "simulation",
        "CGGUARD_SIMULATE_CUDA: torch.cuda runs on cgguard's simulated CUDA runtime "
        "(no GPU work; results are not GPU results)",
    )
    return runtime


def _warn(message: str) -> None:
    from cgguard._warn import warn_once

    warn_once("activate", message)


# The post-import hook.

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
