"""install() and uninstall(): configuration in, patches on torch now or when torch is imported."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

from cgguard import _importhook, _state
from cgguard._config import Config
from cgguard._errors import ConfigError
from cgguard._report import Reporter
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from types import ModuleType

_lock = threading.RLock()


def install(config: Config | None = None) -> None:
    """Guard every CUDA-graph capture in this process.

    Idempotent: patches torch once. Called again with a ``config``, it switches to that
    configuration. Works before torch is imported (the patches go on when it is; cgguard never
    imports torch itself) and after.
    """
    if config is not None and not isinstance(config, Config):
        raise ConfigError(
            f"install(config={config!r}): accepted values are None or a cgguard.Config"
        )
    with _lock:
        if _state.config is not None and config is None:
            return
        _configure(config if config is not None else Config())
        if _state.patches:
            return
        if "torch" in sys.modules:
            _patch()
        else:
            _importhook.when_imported("torch", _patch_on_import)


def uninstall() -> None:
    """Put torch's attributes back exactly as they were and stop reporting. Idempotent."""
    from cgguard._patches import unpatch_torch

    with _lock:
        _importhook.cancel("torch", _patch_on_import)
        if _state.patches:
            unpatch_torch()
        if _state.reporter is not None:
            _state.reporter.close()
        _state.reporter = None
        _state.config = None
        _state.active.clear()


def is_installed() -> bool:
    """Whether install() is in effect (the patches may still be waiting for torch's import)."""
    return _state.config is not None


def _configure(config: Config) -> None:
    if _state.reporter is not None:
        _state.reporter.close()
    _state.config = config
    _state.reporter = Reporter(config.log_format, config.log_file)
    if config.capture is not None:
        _state.set_flag(config.capture == "enabled", None)


def _patch() -> None:
    """Patch torch now; a failure is reported once and the program goes on, unguarded."""
    try:
        from cgguard._patches import patch_torch

        patch_torch()
    except Exception as exc:
        warn_once("patch", f"could not patch torch, captures are not guarded: {exc!r}")


def _patch_on_import(_: ModuleType) -> None:
    # Runs inside torch's import, right after torch/__init__.py finished. It takes the same
    # path as an install() made after the import: asking sys.modules here would mislead, since
    # torch is already listed there while its import is still finishing.
    with _lock:
        if _state.config is not None:
            _patch()
