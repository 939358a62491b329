"""What activation does once torch is imported: configure from the environment, then install.

cgguard._boot calls ``on_torch_import`` by name, so that start-up never imports this module,
or anything it imports, until torch is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cgguard._config.config import Config
from cgguard._install import install, is_installed
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from types import ModuleType


def on_torch_import(_: ModuleType) -> None:
    """Install cgguard as the CGGUARD_* variables say; whatever fails is one line on stderr."""
    # Runs right after torch/__init__.py, inside the user's ``import torch``: torch imports
    # regardless of what happens here.
    try:
        config = Config.from_environ(warn=False)
        if config.simulate_cuda:
            from cgguard.testing._helpers import start_session_simulation

            start_session_simulation()
        # A program that called install() itself, before importing torch, keeps its own
        # configuration: the environment only switches cgguard on.
        install(None if is_installed() else config)
    except Exception as exc:
        warn_once("activate", f"could not activate, captures are not guarded: {exc!r}")
