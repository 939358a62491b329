"""The process's own state, which outlives any installation: the capture flag, the flags followed,
the violation listeners, and the installation in effect.

A program disables capture, follows a framework's flag or subscribes to violations whether or
not, and before or after, cgguard is installed; so these belong to the process, not to an
installation. Everything that reads or changes them goes through this module, and ``reset()``
puts all of them back as a process starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cgguard._gate.flags import CaptureFlag, FlagSource, Windows, disabled_by

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._core.installation import Installation
    from cgguard._data.schema import ViolationEvent


FLAG = CaptureFlag()

# Other frameworks' capture flags followed (cgguard._gate.follow): part of what "capture enabled"
# means, so process-wide like cgguard's own flag.
FOLLOWED: list[FlagSource | Windows] = []

# The capture windows (cgguard._gate.windows): in FOLLOWED once one has been entered, or a predicate
# window is declared.
WINDOWS = Windows()

# Called with every violation's full event, whatever the logging (cgguard.testing, the pytest
# plugin): a test subscribes before it installs.
LISTENERS: list[Callable[[ViolationEvent], None]] = []

# The installation in effect: set by install(), dropped by uninstall(). The capture path never
# reads it; the hooks on torch are bound to their own installation's capture path.
current: Installation | None = None


def is_capture_enabled() -> bool:
    """cgguard's flag and every followed flag allow a capture now. A refusal a built-in
    profile's windows alone would make, and only log (Config(profiles="log")), does not count."""
    disabler = disabled_by(FLAG, FOLLOWED)
    return disabler is None or disabler.log_only


def reset() -> None:
    """The process's state as it starts: capture enabled, no flag followed, no listener.

    The installation, if any, is cgguard.uninstall()'s to end, which also stops following flags.
    """
    FLAG.set(True, None)
    FOLLOWED.clear()
    WINDOWS.forget()
    LISTENERS.clear()
