"""The capture flag: one process-wide switch saying whether a CUDA-graph capture may begin now."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cgguard._gate import state as _state
from cgguard._gate.state import FLAG
from cgguard._support.frames import snapshot

if TYPE_CHECKING:
    from types import TracebackType

    from cgguard._support.frames import Snapshot


def set_capture_enabled(enabled: bool) -> None:
    """Allow (True) or forbid (False) CUDA-graph captures in the whole process from now on.

    The call's stack is kept, so that a refused capture can say where capture was disabled.
    """
    if not isinstance(enabled, bool):
        raise TypeError(
            f"set_capture_enabled(enabled={enabled!r}): accepted values are True, False"
        )
    FLAG.set(enabled, snapshot(1))


def is_capture_enabled() -> bool:
    """Whether a CUDA-graph capture may begin now: cgguard's flag and every flag it follows."""
    return _state.is_capture_enabled()


class _FlagSetting:
    """Sets the flag on entry and puts back the previous value and its origin on exit."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._saved: list[tuple[bool, Snapshot | None]] = []

    def __enter__(self) -> None:
        # A stack of saved values, so that one object entered twice still nests.
        self._saved.append((FLAG.enabled, FLAG.changed_at))
        FLAG.set(self._enabled, snapshot(1))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        FLAG.set(*self._saved.pop())


def capture_disabled() -> _FlagSetting:
    """Context manager: no capture may begin inside it; the previous setting returns after it."""
    return _FlagSetting(False)


def capture_enabled() -> _FlagSetting:
    """Context manager: captures may begin inside it; the previous setting returns after it."""
    return _FlagSetting(True)
