"""Activation without code changes: switch cgguard on from the environment, free until torch.

Called by the ``cgguard.pth`` line that the package installs into site-packages, and by the
bootstrap ``sitecustomize`` (the runner's, and sitecustomize_example). Until torch is imported,
an activation with CGGUARD_ENABLED=1 alone loads this module and the import hook, nothing else;
then the hook builds the configuration and patches torch.
"""

# On the start-up path of every activated process: standard library only, no ``typing`` or
# ``__future__`` at runtime, and cgguard's other modules only when there is work for them.
import os
import sys

from cgguard import _importhook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

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
                _importhook.when_imported("torch", _on_torch_import)
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
