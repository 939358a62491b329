"""install() and uninstall(): configuration in, patches on torch now or when torch is imported."""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
from typing import TYPE_CHECKING

from cgguard import _bootstrap, _bridge, _state, _summary
from cgguard._config import Config
from cgguard._errors import ConfigError
from cgguard._ledger import Ledger
from cgguard._report import Reporter
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

_lock = threading.RLock()
_exit_registered = False


def install(config: Config | None = None) -> None:
    """Guard every CUDA-graph capture in this process.

    Idempotent: patches torch once. Called again with a ``config``, it switches to that
    configuration. Works before torch is imported (the patches go on when it is; cgguard never
    imports torch itself) and after.
    """
    global _exit_registered
    if config is not None and not isinstance(config, Config):
        raise ConfigError(
            f"install(config={config!r}): accepted values are None or a cgguard.Config"
        )
    with _lock:
        if _state.config is not None and config is None:
            return
        _configure(config if config is not None else Config())
        if not _exit_registered:
            atexit.register(_at_exit)
            os.register_at_fork(after_in_child=_forget_parent)
            _exit_registered = True
        if _state.patches:
            return
        if "torch" not in sys.modules:
            _bootstrap.when_imported("torch", _patch_on_import)
            return
    # torch is imported, or being imported: perhaps by another thread, whose import the hook
    # missed. Wait for it to finish (at once if this thread is the importer), outside the
    # lock, which that import's own hook may be waiting for, then patch.
    importlib.import_module("torch")
    with _lock:
        if _state.config is not None:
            _patch()


def uninstall() -> None:
    """Put torch's attributes back exactly as they were and stop reporting. Idempotent."""
    from cgguard._patches import unpatch_torch

    with _lock:
        _bootstrap.cancel("torch", _patch_on_import)
        _bridge.unfollow_all()
        if _state.patches:
            unpatch_torch()
        if _state.config is not None and _state.ledger is not None:
            _summary.write(_state.config, _state.ledger)
        if _state.reporter is not None:
            _state.reporter.close()
        _state.reporter = None
        _state.config = None
        _state.ledger = None
        _state.on_new_site = None
        _state.active.clear()


def is_installed() -> bool:
    """Whether install() is in effect (the patches may still be waiting for torch's import)."""
    return _state.config is not None


def _configure(config: Config) -> None:
    if _state.reporter is not None:
        _state.reporter.close()
    ledger = _state.ledger if _state.ledger is not None else Ledger()
    _state.config = config
    _state.ledger = ledger
    _state.reporter = Reporter(config.log_format, config.log_file, target=config.target())
    _state.on_new_site = _report_writer(config, ledger)
    if config.capture is not None:
        _state.set_flag(config.capture == "enabled", None)
    _bridge.follow_vllm(config.vllm_bridge)


def _forget_parent() -> None:
    # A forked worker reports its own violations: {pid} reports summed across a job must not
    # count the parent's twice. The parent's captures belong to threads the child lacks, and
    # so may the locks: one held by a parent thread at the fork would never be released.
    global _lock
    _lock = threading.RLock()
    _summary.reset_lock()
    config = _state.config
    if config is None:
        return
    ledger = _state.ledger = Ledger()
    _state.on_new_site = _report_writer(config, ledger)
    _state.active.clear()
    _state.entering.clear()


def _report_writer(config: Config, ledger: Ledger) -> Callable[[], None] | None:
    """What keeps the JSON report current as new sites appear, if there is a report."""
    if config.report is None:
        return None
    return lambda: _summary.write(config, ledger)


def _at_exit() -> None:
    """The run's summary, if anything was seen, and the final report."""
    config, ledger, reporter = _state.config, _state.ledger, _state.reporter
    if config is None or ledger is None:
        return
    try:
        if ledger.sites() and reporter is not None:
            reporter.emit(_summary.summary_event(ledger))
        _summary.write(config, ledger)
    except Exception as exc:
        warn_once("exit", f"could not write the exit summary: {exc!r}")


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
