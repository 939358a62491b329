"""One way to replace attributes and to put them back exactly: torch's entry points, torch's
device synchronize, followed flags' setters, window functions and cgguard.testing all use it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

_ABSENT: Any = object()  # the attribute was inherited or missing, not in the owner's own dict


def describe(owner: object, name: str) -> str:
    """``torch.cuda.graphs.CUDAGraph.capture_begin``: where an attribute lives, for people."""
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}.{name}"
    return f"{getattr(owner, '__name__', repr(owner))}.{name}"


class PatchSet:
    """Attributes replaced on classes or modules, each with what to put back.

    An attribute a class inherits is replaced on that class and deleted again on restore, so
    the class inherits it once more; one its own dict held is put back, the very object.
    With ``keep_newer``, an attribute changed again since (by its owner, or removed) is left
    as it is now; otherwise restore() puts the original back whatever happened in between.
    """

    def __init__(self, *, keep_newer: bool = False) -> None:
        self._keep_newer = keep_newer
        # (owner, name, the owner's own value before or _ABSENT, the replacement), in order.
        self._applied: list[tuple[Any, str, Any, Any]] = []

    def __bool__(self) -> bool:
        return bool(self._applied)

    def replace(self, owner: Any, name: str, value: object) -> None:
        """Set ``owner.name`` to ``value``, remembering what was there."""
        original = vars(owner).get(name, _ABSENT)
        setattr(owner, name, value)
        self._applied.append((owner, name, original, value))

    def wrap(self, owner: Any, name: str, make: Callable[[Any], object]) -> object:
        """Replace ``owner.name`` (its own or inherited) with ``make(current)``; return that."""
        value = make(getattr(owner, name))
        self.replace(owner, name, value)
        return value

    def apply(self, changes: Iterable[tuple[Any, str, Callable[[Any], object]]]) -> None:
        """Wrap each (owner, name, make) in turn; on any failure, undo them all and re-raise."""
        done = len(self._applied)
        try:
            for owner, name, make in changes:
                self.wrap(owner, name, make)
        except BaseException:
            self._restore_from(done)
            raise

    def restore(self) -> None:
        """Put back everything, newest first; idempotent."""
        self._restore_from(0)

    def holds(self, owner: object, name: str) -> bool:
        """Whether this set's replacement is what ``owner.name`` is now."""
        return any(
            o is owner and n == name and vars(o).get(n, _ABSENT) is value
            for o, n, _, value in self._applied
        )

    def targets(self) -> list[str]:
        """Each replaced attribute, described, in the order replaced."""
        return [describe(owner, name) for owner, name, _, _ in self._applied]

    def _restore_from(self, start: int) -> None:
        while len(self._applied) > start:
            owner, name, original, value = self._applied.pop()
            if self._keep_newer and vars(owner).get(name, _ABSENT) is not value:
                continue
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
