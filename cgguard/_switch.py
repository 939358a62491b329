"""The capture flag and the flags followed, as the program sets them: cgguard's public switch."""

from __future__ import annotations

from cgguard import _process
from cgguard._gate.gate import FlagSetting
from cgguard._support.frames import snapshot


def set_capture_enabled(enabled: bool) -> None:
    """Allow (True) or forbid (False) CUDA-graph captures in the whole process from now on.

    The call's stack is kept, so that a refused capture can say where capture was disabled.
    """
    if not isinstance(enabled, bool):
        raise TypeError(
            f"set_capture_enabled(enabled={enabled!r}): accepted values are True, False"
        )
    _process.PROCESS.gate.flag.set(enabled, snapshot(1))


def is_capture_enabled() -> bool:
    """Whether a CUDA-graph capture may begin now: cgguard's flag and every flag it follows."""
    return _process.PROCESS.gate.is_capture_enabled()


def capture_disabled() -> FlagSetting:
    """Context manager: no capture may begin inside it; the previous setting returns after it."""
    return FlagSetting(_process.PROCESS.gate.flag, False)


def capture_enabled() -> FlagSetting:
    """Context manager: captures may begin inside it; the previous setting returns after it."""
    return FlagSetting(_process.PROCESS.gate.flag, True)


def follow_flag(module: str, attribute: str, setter: str | None = None) -> None:
    """Follow a framework's capture flag: captures are refused while ``module.attribute`` is false.

    ``setter``, if given, names the module's function that changes the flag; cgguard wraps it to
    report where capture was disabled. Works before or after the module is imported. Undone by
    uninstall().
    """
    _process.PROCESS.gate.flags.follow(module, attribute, setter)
