"""What has been seen: each distinct violation site, how often, and what was first reported there.

A site is a rule at one place in the user's code. The ledger decides what the log stream says
(everything the first time; a brief repeat count at 2, 4, 8, 16, ...), and feeds the exit
summary and the JSON report. A storm of violations at one site costs a counter, not a stack.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from cgguard._data.census import Census
from cgguard._data.manifest import Manifest
from cgguard._data.site import Site

if TYPE_CHECKING:
    from types import CodeType

    from cgguard._data.schema import ExemptedEvent, ViolationEvent


class RuleSite(Site):
    """One rule at one place, and what came of it there: its count, and its first full event.

    A violation's site is (rule, place, action); an exempted capture's is (rule, place,
    exemption), its action "exempted".
    """

    __slots__ = ("action", "api", "count", "exemption", "first", "rule")

    def __init__(  # noqa: PLR0917 - made on the capturing thread: positional costs least
        self,
        rule: str,
        code: CodeType | None,
        lasti: int,
        api: str,
        action: str,
        exemption: str | None = None,
    ) -> None:
        # Where, as the capture path knows it: a repeat is reported from there, since the
        # first event may still be rendering on another thread.
        super().__init__(code, lasti)
        self.rule = rule
        self.api = api
        self.action = action
        self.exemption = exemption  # the exemption that let it through, as written
        self.count = 0
        # Filled in by whoever counted the first one here, once it has been rendered.
        self.first: ViolationEvent | ExemptedEvent | None = None


class Sites:
    """Sites counted by key, each kept with its code object. Thread-safe.

    Keyed by the code object's identity: code objects compare equal by content, so two files
    with the same helper would otherwise share a site. Each site holds its code object, so its
    id() is not reused while the key stands.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sites: dict[tuple[object, ...], RuleSite] = {}

    def _count(self, key: tuple[object, ...], *site_fields: Any) -> tuple[RuleSite, int]:
        """Count one at ``key``, making its site from ``site_fields`` (RuleSite's own arguments)
        the first time; return the site and this count (1: the first there, for the caller to
        fill in ``site.first``)."""
        with self._lock:
            site = self._sites.get(key)
            if site is None:
                site = self._sites[key] = RuleSite(*site_fields)
            site.count += 1
            return site, site.count

    def __len__(self) -> int:
        """How many sites have been seen."""
        return len(self._sites)

    def sites(self) -> list[RuleSite]:
        """Every site seen, in the order first seen."""
        with self._lock:
            return list(self._sites.values())

    def totals(self) -> dict[str, int]:
        """Counts per rule."""
        totals: dict[str, int] = {}
        for site in self.sites():
            totals[site.rule] = totals.get(site.rule, 0) + site.count
        return totals


class Ledger(Sites):
    """Violations counted by site (rule, place in the user's code)."""

    def count(
        self, rule: str, code: CodeType | None, lasti: int, api: str, action: str
    ) -> tuple[RuleSite, int]:
        """Count one violation of ``rule`` at (code, lasti); return its site and this count.

        A count of 1 tells the caller it is the first there, to fill in ``site.first``.
        """
        return self._count((rule, id(code), lasti), rule, code, lasti, api, action)


class Tally(Sites):
    """Exempted captures counted by site (rule, place in the user's code, exemption)."""

    def count(
        self, rule: str, code: CodeType | None, lasti: int, api: str, exemption: str
    ) -> tuple[RuleSite, int]:
        """Count one exempted capture; return its site and this count (1: the first there)."""
        key = (rule, id(code), lasti, exemption)
        return self._count(key, rule, code, lasti, api, "exempted", exemption)


class Run:
    """What a run has seen: its violations, the captures exemptions let through, and the
    census of every capture (cgguard._data.census).

    Kept when install() switches configuration, and made anew in a forked child, which reports
    its own violations: reports summed across a job must not count the parent's twice.
    """

    __slots__ = ("census", "ledger", "manifest", "tally")

    def __init__(self, census: Census | None = None, manifest: Manifest | None = None) -> None:
        self.ledger = Ledger()
        self.tally = Tally()
        # A forked child's run keeps the census and manifest objects, emptied, since the
        # capture path's watchers hold them (Installation.after_fork).
        self.census = census if census is not None else Census()
        self.manifest = manifest if manifest is not None else Manifest()

    def seen(self) -> bool:
        """Whether anything was counted."""
        return bool(len(self.ledger) or len(self.tally))
