"""A process's capture manifest: its rank identity, and its captures in order, each with its site,
a key and the collectives issued inside it; what ranks of one job must agree on.

NCCL makes whether an operation is graph-captured a property of the collective, the same on
every rank: a rank that captures another set of graphs, or issues another collective inside
one, hangs or corrupts the job far from the cause. Each process keeps its manifest; the report
carries it, ``cgguard report`` compares the ranks of a job (cgguard._data.rank_compare), and
``cgguard.check_ranks()`` compares them live.

Bounded for a long-running server: the first ``KEPT`` captures are kept in order, each with at
most ``COLLECTIVES_KEPT`` collectives (and the count of the rest); every later capture is only
counted at its site. A server captures at start-up, a few hundred graphs, and rarely again.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from cgguard._support.frames import place_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._data.schema import ManifestCapture, ManifestCollective, ManifestDocument
    from cgguard._support.frames import Place

# Captures kept in order; later ones are counted per site.
KEPT = 2048
# Collectives kept per capture, in order; more are counted.
COLLECTIVES_KEPT = 256


class Capture:
    """One capture in the manifest: where, its key, and the collectives issued inside it."""

    __slots__ = ("collectives", "dropped", "key", "outcome", "site")

    def __init__(self, site: str, key: str) -> None:
        self.site = site
        self.key = key
        self.collectives: list[ManifestCollective] = []
        self.dropped = 0  # collectives past COLLECTIVES_KEPT, counted only
        self.outcome = ""  # "" while under way, then the census's outcome (ended, failed, ...)

    def issued(self, collective: ManifestCollective) -> None:
        """A collective was issued inside this capture, on its thread."""
        if len(self.collectives) < COLLECTIVES_KEPT:
            self.collectives.append(collective)
        else:
            self.dropped += 1

    def as_dict(self) -> ManifestCapture:
        entry: dict[str, object] = {
            "site": self.site,
            "key": self.key,
            "outcome": self.outcome or "open",
            "collectives": list(self.collectives),
        }
        if self.dropped:
            entry["collectives_dropped"] = self.dropped
        return entry  # type: ignore[return-value]  # ManifestCapture's keys, built here


class Manifest:
    """The captures of this process in order, bounded; their count per site, unbounded in time.

    Written by capturing threads, read by reports and the live check: under one lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Whether a watcher records into it (cgguard._ranks): a report carries it only then.
        self.recording = False
        # The process's rank identity, read when a report or a check asks: torch.distributed's
        # default group may be made after the first capture.
        self.identify: Callable[[], dict[str, int | str]] = dict
        self.checks = 0  # live checks made (cgguard._ranks.check): each one's keys are its own
        self.captures: list[Capture] = []
        self.per_site: dict[str, int] = {}  # every capture, kept or not
        self.later = 0  # captures past KEPT: counted per site only

    def begin(self, place: Place | None, key: str | None = None) -> Capture:
        """A capture begins at ``place``; its key, unless given, is its ordinal at its site
        ("call 3": the third capture there), the same on ranks that run the same code."""
        site = place_text(place)
        with self._lock:
            ordinal = self.per_site.get(site, 0) + 1
            self.per_site[site] = ordinal
            capture = Capture(site, key if key is not None else f"call {ordinal}")
            if len(self.captures) < KEPT:
                self.captures.append(capture)
            else:
                self.later += 1
            return capture

    def after_fork(self) -> None:
        """Nothing recorded, as a forked child starts: its captures are its own, and a lock
        another thread of the parent held stays held in the child."""
        self._lock = threading.Lock()
        self.captures = []
        self.per_site = {}
        self.later = 0
        self.checks = 0

    def document(self) -> ManifestDocument:
        """The manifest as the report holds it, with the process's rank identity."""
        identity = self.identify()
        with self._lock:
            captures = [capture.as_dict() for capture in self.captures]
            per_site = dict(self.per_site)
            later = self.later
        return {
            "identity": identity,
            "captures": captures,
            "per_site": per_site,
            "later": later,
        }
