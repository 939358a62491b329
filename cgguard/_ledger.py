"""What has been seen: each distinct violation site, how often, and what was first reported there.

A site is a rule at one place in the user's code. The ledger decides what the log stream says
(everything the first time; a brief repeat count at 2, 4, 8, 16, ...), and feeds the exit
summary and the JSON report. A storm of violations at one site costs a counter, not a stack.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from cgguard._frames import render

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType

    from cgguard._frames import FrameInfo
    from cgguard._schema import ViolationEvent


class _Counted(Protocol):
    rule: str
    count: int


S = TypeVar("S", bound=_Counted)


class Site:
    """One rule at one place: its count, and the full event first reported there."""

    __slots__ = ("action", "api", "code", "count", "first", "lasti", "rule")

    def __init__(self, rule: str, code: CodeType | None, lasti: int, api: str, action: str) -> None:
        self.rule = rule
        # Where, as the capture path knows it: a repeat is reported from these, since the
        # first event may still be rendering on another thread.
        self.code = code
        self.lasti = lasti
        self.api = api
        self.action = action
        self.count = 0
        # Filled in by whoever counted the first violation here, once it has been rendered.
        self.first: ViolationEvent | None = None


class Sites(Generic[S]):
    """Sites counted by key, each kept with its code object. Thread-safe.

    Keyed by the code object's identity: code objects compare equal by content, so two files
    with the same helper would otherwise share a site. Each site holds its code object, so its
    id() is not reused while the key stands.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sites: dict[tuple[object, ...], S] = {}

    def _count(
        self, key: tuple[object, ...], new: Callable[..., S], *args: object
    ) -> tuple[S, int]:
        """Count one at ``key``, making its site as ``new(*args)`` the first time; return the
        site and this count (1: the first there, for the caller to fill in ``site.first``)."""
        with self._lock:
            site = self._sites.get(key)
            if site is None:
                site = self._sites[key] = new(*args)
            site.count += 1
            return site, site.count

    def __len__(self) -> int:
        """How many sites have been seen."""
        return len(self._sites)

    def sites(self) -> list[S]:
        """Every site seen, in the order first seen."""
        with self._lock:
            return list(self._sites.values())

    def totals(self) -> dict[str, int]:
        """Counts per rule."""
        totals: dict[str, int] = {}
        for site in self.sites():
            totals[site.rule] = totals.get(site.rule, 0) + site.count
        return totals


class Ledger(Sites[Site]):
    """Counts violations by site (rule, place in the user's code). One per installation."""

    def count(
        self, rule: str, code: CodeType | None, lasti: int, api: str, action: str
    ) -> tuple[Site, int]:
        """Count one violation of ``rule`` at (code, lasti); return its site and this count.

        A count of 1 tells the caller it is the first there, to fill in ``site.first``.
        """
        return self._count((rule, id(code), lasti), Site, rule, code, lasti, api, action)

    def where(self, site: Site) -> FrameInfo | None:
        """The site's user frame, rendered."""
        if site.code is None:
            return None
        frames = render((site.code, site.lasti))
        return frames[-1] if frames else None


def worth_logging(count: int) -> bool:
    """The counts at which a repeat is logged (briefly): 2, 4, 8, 16, ..."""
    return count & (count - 1) == 0
