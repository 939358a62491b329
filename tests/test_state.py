"""cgguard._gate.state: the process's own state, and the one reset that puts it back."""

from __future__ import annotations

import types

import cgguard
from cgguard._gate import state as _state
from cgguard._gate.flags import FlagSource


def test_reset_puts_the_process_back_as_it_starts() -> None:
    """Capture enabled again with no origin, no flag followed, no listener."""
    listeners = list(_state.LISTENERS)
    try:
        cgguard.set_capture_enabled(False)
        _state.FOLLOWED.append(FlagSource(types.ModuleType("cgg_framework"), "capturing"))
        _state.LISTENERS.append(print)
        _state.reset()
        assert (
            _state.FLAG.enabled,
            _state.FLAG.changed_at,
            _state.FOLLOWED,
            _state.LISTENERS,
            cgguard.is_capture_enabled(),
        ) == (True, None, [], [], True)
    finally:
        _state.LISTENERS[:] = listeners


def test_a_followed_flag_that_is_off_disables_capture_until_it_is_on() -> None:
    """Whether capture is enabled is cgguard's flag and every followed one, read now."""
    framework = types.ModuleType("cgg_framework")
    framework.capturing = False  # type: ignore[attr-defined]
    _state.FOLLOWED.append(FlagSource(framework, "capturing"))
    before = cgguard.is_capture_enabled()
    framework.capturing = True  # type: ignore[attr-defined]
    assert (before, cgguard.is_capture_enabled()) == (False, True)
