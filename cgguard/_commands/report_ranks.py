"""The ranks of a merged job compared by their capture manifests: what ``cgguard report`` says
of ranks that captured differently (docs/ranks.md).

Processes whose reports carry a manifest with a rank identity are compared
(cgguard._data.rank_compare, the live check's comparison); the others (torchrun's own launcher,
a process with the manifest off) are listed apart and left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cgguard._data.census_merge import counted
from cgguard._data.rank_compare import RankDifference, agreement, compare, rank_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cgguard._data.schema import ManifestDocument

    # A merged report's process (cgguard._commands.report_merge.Process), read for its place.
    Process = Mapping[str, Any]


class Ranks:
    """The manifests of a job's ranks, gathered a report at a time, then compared once."""

    def __init__(self) -> None:
        self.manifests: dict[int, ManifestDocument] = {}
        self.processes: dict[int, Process] = {}
        self.apart: list[Process] = []  # without a manifest or a rank identity
        # A rank another report already held (a restarted process), with that rank.
        self.twice: list[tuple[int, Process]] = []
        self._differences: list[RankDifference] | None = None

    def add(self, process: Process, manifest: ManifestDocument | None) -> None:
        rank = rank_of(manifest["identity"]) if manifest is not None else None
        if manifest is None or rank is None:
            self.apart.append(process)
        elif rank in self.manifests:
            self.twice.append((rank, process))
        else:
            self.manifests[rank] = manifest
            self.processes[rank] = process

    def differences(self) -> list[RankDifference]:
        if self._differences is None:
            self._differences = compare(self.manifests)
        return self._differences

    def summary(self) -> str | None:
        """The comparison in one line; None where no report is a rank's."""
        if not self.manifests:
            return None
        count = len(self.manifests)
        found = self.differences()
        if not found:
            return agreement(self.manifests)
        return (
            f"{count} ranks compared: {counted(len(found), 'difference')}, "
            "the ranks on each side named"
        )

    def left_out(self) -> str | None:
        """The processes left out of the comparison, in one line; None where none is."""
        said = []
        if self.apart and self.manifests:
            said.append(
                f"{counted(len(self.apart), 'process', 'processes')} without a rank "
                "identity or a capture manifest (a launcher, CGGUARD_MANIFEST=0)"
            )
        if self.twice:
            ranks = sorted({rank for rank, _ in self.twice})
            said.append(
                f"{counted(len(self.twice), 'report')} of a rank already "
                f"compared (ranks {', '.join(map(str, ranks))}: a restarted process?)"
            )
        return "left out: " + "; ".join(said) if said else None

    def json(self) -> dict[str, Any] | None:
        """The comparison as the JSON view holds it; None where no report is a rank's."""
        if not self.manifests:
            return None
        return {
            "identified": sorted(self.manifests),
            "unidentified": [_where(p) for p in self.apart],
            "repeated": [{"rank": rank, **_where(p)} for rank, p in self.twice],
            "agree": not self.differences(),
            "divergence": [d._asdict() for d in self.differences()],
        }


def _where(process: Process) -> dict[str, object]:
    return {"host": process["host"], "pid": process["pid"], "report": process["report"]}
