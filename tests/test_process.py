"""cgguard._process: the process's own state in one owner, a fresh one on reset."""

from __future__ import annotations

import types

import pytest

import cgguard
from cgguard import _process
from cgguard._gate.flags import FlagSource


def test_reset_makes_every_part_anew() -> None:
    """A reset is a new owner, each of its parts new: none is carried over or forgotten."""
    before = _process.PROCESS
    listeners = list(before.listeners)
    try:
        _process.reset()
        after = _process.PROCESS
        parts = [name for name, value in vars(before).items() if value is not None]
        assert after is not before
        assert [name for name in parts if getattr(after, name) is getattr(before, name)] == []
        assert sorted(vars(after)) == sorted(vars(before))
    finally:
        _process.PROCESS.listeners[:] = listeners


def test_reset_puts_the_process_back_as_it_starts() -> None:
    """Capture enabled again with no origin, no flag followed, no listener."""
    listeners = list(_process.PROCESS.listeners)
    try:
        cgguard.set_capture_enabled(False)
        _process.PROCESS.gate.follows.append(
            FlagSource(types.ModuleType("cgg_framework"), "capturing")
        )
        _process.PROCESS.listeners.append(print)
        _process.reset()
        gate = _process.PROCESS.gate
        assert (
            gate.flag.enabled,
            gate.flag.changed_at,
            gate.follows,
            _process.PROCESS.listeners,
            cgguard.is_capture_enabled(),
        ) == (True, None, [], [], True)
    finally:
        _process.PROCESS.listeners[:] = listeners


def test_reset_while_installed_is_refused() -> None:
    """The installation's hooks belong to the owner that made them: uninstall first."""
    cgguard.install(cgguard.Config(log_file="/dev/null"))
    owner = _process.PROCESS
    with pytest.raises(RuntimeError, match=r"uninstall\(\) first"):
        _process.reset()
    assert (_process.PROCESS, cgguard.is_installed()) == (owner, True)


def test_a_followed_flag_that_is_off_disables_capture_until_it_is_on() -> None:
    """Whether capture is enabled is cgguard's flag and every followed one, read now."""
    framework = types.ModuleType("cgg_framework")
    framework.capturing = False  # type: ignore[attr-defined]
    _process.PROCESS.gate.follows.append(FlagSource(framework, "capturing"))
    before = cgguard.is_capture_enabled()
    framework.capturing = True  # type: ignore[attr-defined]
    assert (before, cgguard.is_capture_enabled()) == (False, True)
