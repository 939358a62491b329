"""The capture flag: its value, where it was changed, and the context managers that nest."""

from __future__ import annotations

import sys

import pytest
from helpers import SourceFile

import cgguard
from cgguard import _process
from cgguard._support.frames import render

line_of = SourceFile(__file__).line_of


def changed_at() -> tuple[str, int] | None:
    """(function, line) of the innermost frame where the flag got its current value."""
    origin = _process.PROCESS.gate.flag.changed_at
    if origin is None:
        return None
    last = render(origin)[-1]
    assert last["file"] == __file__
    return last["function"], last["line"]


def test_enabled_at_start_with_no_origin() -> None:
    """A fresh process allows captures and has no record of a change."""
    assert (cgguard.is_capture_enabled(), _process.PROCESS.gate.flag.changed_at) == (True, None)


def test_set_capture_enabled_records_where() -> None:
    """set_capture_enabled changes the value and remembers the line that changed it."""
    cgguard.set_capture_enabled(False)  # @set-false
    assert cgguard.is_capture_enabled() is False
    assert changed_at() == ("test_set_capture_enabled_records_where", line_of("@set-false"))
    cgguard.set_capture_enabled(True)  # @set-true
    assert cgguard.is_capture_enabled() is True
    assert changed_at() == ("test_set_capture_enabled_records_where", line_of("@set-true"))


@pytest.mark.parametrize("value", [0, 1, "false", None])
def test_set_capture_enabled_rejects_non_bool(value: object) -> None:
    """Only True and False are accepted, with a one-line message naming the value."""
    with pytest.raises(TypeError) as raised:
        cgguard.set_capture_enabled(value)  # type: ignore[arg-type]
    expected = f"set_capture_enabled(enabled={value!r}): accepted values are True, False"
    assert str(raised.value) == expected
    assert cgguard.is_capture_enabled() is True


def test_capture_disabled_restores_value_and_origin() -> None:
    """Leaving capture_disabled() brings back the previous value and where it was set."""
    cgguard.set_capture_enabled(True)  # @before-block
    with cgguard.capture_disabled():  # @disabled-block
        assert cgguard.is_capture_enabled() is False
        assert changed_at() == (
            "test_capture_disabled_restores_value_and_origin",
            line_of("@disabled-block"),
        )
    assert cgguard.is_capture_enabled() is True
    assert changed_at() == (
        "test_capture_disabled_restores_value_and_origin",
        line_of("@before-block"),
    )


def test_context_managers_nest() -> None:
    """capture_enabled() inside capture_disabled() inside capture_enabled() unwinds in order."""
    seen = []
    with cgguard.capture_enabled():
        seen.append(cgguard.is_capture_enabled())
        with cgguard.capture_disabled():  # @outer-disabled
            seen.append(cgguard.is_capture_enabled())
            with cgguard.capture_enabled():
                seen.append(cgguard.is_capture_enabled())
            seen.append(cgguard.is_capture_enabled())
            assert changed_at() == ("test_context_managers_nest", line_of("@outer-disabled"))
        seen.append(cgguard.is_capture_enabled())
    assert seen == [True, False, True, False, True]
    assert _process.PROCESS.gate.flag.changed_at is None


def test_restores_on_exception() -> None:
    """An exception leaving capture_disabled() still restores the previous value."""
    with pytest.raises(ZeroDivisionError), cgguard.capture_disabled():
        _ = 1 / 0
    assert cgguard.is_capture_enabled() is True


def test_one_object_entered_twice_nests() -> None:
    """Reusing one context manager object, re-entered inside itself, still unwinds correctly."""
    disabled = cgguard.capture_disabled()
    cgguard.set_capture_enabled(True)
    with disabled:
        cgguard.set_capture_enabled(True)
        with disabled:
            assert cgguard.is_capture_enabled() is False
        assert cgguard.is_capture_enabled() is True
    assert cgguard.is_capture_enabled() is True


@pytest.mark.subprocess
def test_flag_needs_no_torch() -> None:
    """The flag works without torch: importing cgguard's flag module does not import it."""
    import subprocess

    code = "import sys, cgguard; cgguard.set_capture_enabled(False); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "False\n"
