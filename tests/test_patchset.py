"""cgguard._support.patchset: each attribute cgguard replaces is put back exactly, one way."""

from __future__ import annotations

import types

import pytest

from cgguard._support.patchset import PatchSet


class Base:
    def method(self) -> str:
        return "base"


def make_classes() -> tuple[type[Base], type[Base]]:
    """A fresh subclass that inherits ``method`` and one that defines its own."""

    class Inherits(Base):
        pass

    class Owns(Base):
        def method(self) -> str:
            return "own"

    return Inherits, Owns


def test_an_own_attribute_comes_back_as_the_very_object() -> None:
    """Replaced and restored, a class's own attribute is the same object as before."""
    _, owns = make_classes()
    original = vars(owns)["method"]
    patches = PatchSet()
    patches.wrap(owns, "method", lambda f: lambda self: "patched " + f(self))
    assert owns().method() == "patched own"
    patches.restore()
    assert (vars(owns)["method"], owns().method()) == (original, "own")


def test_an_inherited_attribute_is_inherited_again() -> None:
    """An inherited method is wrapped on the subclass, and deleted there again on restore."""
    inherits, _ = make_classes()
    patches = PatchSet()
    patches.wrap(inherits, "method", lambda f: lambda self: "patched " + f(self))
    assert (inherits().method(), "method" in vars(inherits)) == ("patched base", True)
    patches.restore()
    assert ("method" in vars(inherits), inherits().method()) == (False, "base")


def test_a_failure_half_way_rolls_back_what_was_done() -> None:
    """apply() that fails on its third change leaves the first two undone, and raises."""
    module = types.ModuleType("m")
    module.a, module.b = 1, 2  # type: ignore[attr-defined]

    def fail(_: object) -> object:
        raise TypeError("cannot wrap")

    patches = PatchSet()
    with pytest.raises(TypeError, match="cannot wrap"):
        patches.apply(
            [(module, "a", lambda v: v + 10), (module, "b", lambda v: v + 10), (module, "a", fail)]
        )
    assert (module.a, module.b, bool(patches)) == (1, 2, False)  # type: ignore[attr-defined]


def test_restore_is_newest_first_and_idempotent() -> None:
    """Two changes to one attribute come off in reverse order; a second restore changes nothing."""
    module = types.ModuleType("m")
    module.f = "original"  # type: ignore[attr-defined]
    patches = PatchSet()
    patches.replace(module, "f", "first")
    patches.replace(module, "f", "second")
    patches.restore()
    patches.restore()
    assert module.f == "original"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("keep_newer", "expected"), [(False, "original"), (True, "theirs")])
def test_a_value_changed_since(keep_newer: bool, expected: str) -> None:
    """Changed by someone else since: put back, or with keep_newer left as they set it."""
    module = types.ModuleType("m")
    module.f = "original"  # type: ignore[attr-defined]
    patches = PatchSet(keep_newer=keep_newer)
    patches.replace(module, "f", "ours")
    module.f = "theirs"  # type: ignore[attr-defined]
    patches.restore()
    assert module.f == expected  # type: ignore[attr-defined]


def test_holds_and_targets_describe_what_is_in_place() -> None:
    """holds() says whether our value is still there; targets() names each attribute replaced."""
    inherits, _ = make_classes()
    module = types.ModuleType("pkg.mod")
    module.f = 1  # type: ignore[attr-defined]
    patches = PatchSet()
    patches.replace(inherits, "method", "ours")
    patches.replace(module, "f", 2)
    assert patches.targets() == [f"{__name__}.make_classes.<locals>.Inherits.method", "pkg.mod.f"]
    assert (patches.holds(module, "f"), patches.holds(module, "g")) == (True, False)
    module.f = 3  # type: ignore[attr-defined]
    assert patches.holds(module, "f") is False
