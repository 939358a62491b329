"""cgguard._support.warn: one stderr line per trouble, once, and never an enormous one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    import pytest


def test_warns_once_per_key(capsys: pytest.CaptureFixture[str]) -> None:
    """The first message of a key is printed with cgguard's prefix; the key's later ones are not."""
    warn_once("k", "first")
    warn_once("k", "second")
    warn_once("other", "third")
    expected = ("", "cgguard: first\ncgguard: third\n")
    assert expected == capsys.readouterr()


def test_a_long_message_is_cut(capsys: pytest.CaptureFixture[str]) -> None:
    """A message of more than 1,000 characters prints its first 1,000 and its length."""
    message = "cannot write the report '" + "x" * 10_000 + "': too long"
    warn_once("k", message)
    expected = f"cgguard: {message[:1000]}... (10036 characters)\n"
    assert ("", expected) == capsys.readouterr()


def test_a_message_of_1000_characters_is_whole(capsys: pytest.CaptureFixture[str]) -> None:
    """A message of exactly 1,000 characters is printed whole."""
    message = "y" * 1000
    warn_once("k", message)
    assert ("", f"cgguard: {message}\n") == capsys.readouterr()
