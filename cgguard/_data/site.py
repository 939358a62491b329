"""A site: a place in the user's code where cgguard counts something, as the capture path found
it, its frame rendered once, when first shown."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cgguard._support.frames import frame_at

if TYPE_CHECKING:
    from types import CodeType

    from cgguard._support.frames import FrameInfo

_UNRENDERED: FrameInfo | None = {"file": "", "line": 0, "function": "", "code": None}


class Site:
    """The base of every count kept per site (cgguard._data.ledger's rules, cgguard._data.census's
    captures and skipped compiled graphs): where, and the user's frame there."""

    __slots__ = ("_frame", "code", "lasti")

    def __init__(self, code: CodeType | None, lasti: int) -> None:
        # Held: a site is keyed by the code object's id(), which is not reused while it stands.
        self.code = code
        self.lasti = lasti
        self._frame = _UNRENDERED

    def frame(self) -> FrameInfo | None:
        """The site's user frame (None: none of the stack's frames is the user's), rendered at
        the first call: a site's place never changes, and a repeated report reads it again."""
        frame = self._frame
        if frame is _UNRENDERED:
            frame = self._frame = self._render()
        return frame

    def _render(self) -> FrameInfo | None:
        return frame_at(self.code, self.lasti)
