"""Capture flags: cgguard's own and other frameworks', and which of them disables capture."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from cgguard._warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import ModuleType

    from cgguard._frames import Snapshot


class CaptureFlag:
    """cgguard's capture flag, and where it was last changed (None: by configuration)."""

    __slots__ = ("changed_at", "enabled")

    def __init__(self) -> None:
        self.enabled = True
        self.changed_at: Snapshot | None = None

    def set(self, enabled: bool, changed_at: Snapshot | None) -> None:
        # Origin first: a reader that sees the new value must not see the old origin.
        self.changed_at = changed_at
        self.enabled = enabled


class FlagSource:
    """Another framework's capture flag: a module attribute, and where its setter last set it."""

    def __init__(self, module: ModuleType, attribute: str) -> None:
        self.module = module
        self.attribute = attribute
        self.label = f"{module.__name__}.{attribute}"
        self.changed_at: Snapshot | None = None

    def enabled(self) -> bool:
        """The flag's value; a flag that cannot be read allows, with one warning naming it."""
        try:
            return bool(getattr(self.module, self.attribute, True))
        except Exception as exc:
            warn_once(f"flag:{self.label}", f"cannot read {self.label}, not followed: {exc!r}")
            return True


class Disabler(NamedTuple):
    """Which flag disables capture, and where it was set: the cause of a refused capture."""

    label: str | None  # a followed flag's module.attribute; None for cgguard's own
    changed_at: Snapshot | None  # None: by configuration, or by a setter cgguard never saw


def disabled_by(flag: CaptureFlag, follows: Iterable[FlagSource]) -> Disabler | None:
    """What disables capture now, cgguard's flag first; None when every flag allows it."""
    if not flag.enabled:
        return Disabler(None, flag.changed_at)
    for source in list(follows):
        if not source.enabled():
            return Disabler(source.label, source.changed_at)
    return None
