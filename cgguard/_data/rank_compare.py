"""The ranks of a job compared by their capture manifests (cgguard._data.manifest): which ranks
captured differently from the others, and where they first part.

Plain values in, plain values out: ``cgguard report`` compares the manifests of a job's reports,
and ``cgguard.check_ranks()`` those its ranks exchanged, with the same function.

Ranks that agree form a group; the largest group (the one holding the lowest rank, on a tie)
is the reference, and each other group is compared with it: the first capture where their
sequences part (a capture one side lacks, another site or key, another collective), then the
sites whose counts differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from cgguard._data.census_merge import counted

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from cgguard._data.schema import ManifestCapture, ManifestCollective, ManifestDocument

# A difference's kinds.
EXTRA = "extra_capture"  # one side captured more graphs
KEY = "key"  # the same site, captured with another key (other input shapes or dtypes)
SITE = "site"  # another capture altogether at that place in the order
COLLECTIVES = "collectives"  # the same capture, another collective sequence inside it
COUNT = "count"  # another number of captures at a site
MISSING = "missing"  # a rank that did not arrive (the live check)


class RankDifference(NamedTuple):
    """Ranks that captured differently from the others (``check_ranks()`` returns these)."""

    kind: str  # extra_capture, key, site, collectives, count, missing
    ranks: tuple[int, ...]  # the ranks on the differing side (those that did not arrive)
    others: tuple[int, ...]  # the ranks they differ from
    detail: str  # where they part, in words
    capture: int | None = None  # the first capture where they part, counted from 1


def rank_of(identity: Mapping[str, Any]) -> int | None:
    """A process's global rank: torch.distributed's, else the launcher's RANK."""
    for key in ("dist_rank", "rank"):
        value = identity.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def collective_text(collective: ManifestCollective) -> str:
    """A collective in a few words: ``all_reduce of 4096 float32 over ranks [0, 1]``."""
    what = collective["op"]
    if collective["dtype"] is not None:
        what += f" of {collective['numel']} {collective['dtype']}"
    if collective["ranks"] is not None:
        what += f" over ranks {collective['ranks']}"
    return what


def collective_key(collective: ManifestCollective) -> tuple[object, ...]:
    """What ranks that agree have alike in a collective: its op, dtype, size and its group's
    size, not the group's ranks, which differ between the tensor-parallel groups of one job
    running the same code."""
    ranks = collective["ranks"]
    return (
        collective["op"],
        collective["dtype"],
        collective["numel"],
        len(ranks) if ranks is not None else None,
    )


def capture_text(capture: ManifestCapture) -> str:
    return f"{capture['site']} ({capture['key']})"


def _signature(manifest: ManifestDocument) -> tuple[object, ...]:
    """What ranks that agree have alike: each capture's site, key and collectives, in order,
    and the captures per site."""
    captures = tuple(
        (
            c["site"],
            c["key"],
            tuple(collective_key(x) for x in c["collectives"]),
            c.get("collectives_dropped", 0),
        )
        for c in manifest["captures"]
    )
    return captures, tuple(sorted(manifest["per_site"].items()))


def groups(manifests: Mapping[int, ManifestDocument]) -> list[tuple[int, ...]]:
    """The ranks, in groups of those whose manifests agree; the reference group first."""
    found: dict[tuple[object, ...], list[int]] = {}
    for rank in sorted(manifests):
        found.setdefault(_signature(manifests[rank]), []).append(rank)
    return sorted((tuple(g) for g in found.values()), key=lambda g: (-len(g), g[0]))


def compare(manifests: Mapping[int, ManifestDocument]) -> list[RankDifference]:
    """Every group of ranks that captured otherwise than the reference group, with where."""
    found = groups(manifests)
    if len(found) < 2:
        return []
    reference = found[0]
    expected = manifests[reference[0]]
    differences: list[RankDifference] = []
    for group in found[1:]:
        actual = manifests[group[0]]
        parted = _parted(group, reference, actual["captures"], expected["captures"])
        if parted is not None:
            differences.append(parted)
        differences += _counts(group, reference, actual["per_site"], expected["per_site"])
    return differences


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _parted(
    group: tuple[int, ...],
    reference: tuple[int, ...],
    actual: Sequence[ManifestCapture],
    expected: Sequence[ManifestCapture],
) -> RankDifference | None:
    """Where ``group``'s captures first part from ``reference``'s, or None: they do not."""
    these, those = _ranks(group), _ranks(reference)
    for index, (mine, theirs) in enumerate(zip(actual, expected, strict=False), start=1):
        if mine["site"] != theirs["site"]:
            detail = (
                f"capture {index}: {these} captured at {capture_text(mine)} where {those} "
                f"captured at {capture_text(theirs)}"
            )
            return RankDifference(SITE, group, reference, detail, index)
        if mine["key"] != theirs["key"]:
            detail = (
                f"capture {index} at {mine['site']}: {these} captured it with key "
                f"{mine['key']!r}, {those} with {theirs['key']!r}"
            )
            return RankDifference(KEY, group, reference, detail, index)
        step = _collective_parted(mine["collectives"], theirs["collectives"], these, those)
        if step is None and mine.get("collectives_dropped") != theirs.get("collectives_dropped"):
            step = f"{these} and {those} issue different numbers past the collectives kept"
        if step is not None:
            detail = f"capture {index} at {capture_text(mine)}: {step}"
            return RankDifference(COLLECTIVES, group, reference, detail, index)
    if len(actual) == len(expected):
        return None
    longer, shorter = (group, reference) if len(actual) > len(expected) else (reference, group)
    first = (actual if len(actual) > len(expected) else expected)[min(len(actual), len(expected))]
    index = min(len(actual), len(expected)) + 1
    detail = (
        f"{_ranks(longer)} captured {abs(len(actual) - len(expected))} more: capture {index} at "
        f"{capture_text(first)} is missing on {_ranks(shorter)}"
    )
    return RankDifference(EXTRA, group, reference, detail, index)


def _collective_parted(
    mine: Sequence[ManifestCollective],
    theirs: Sequence[ManifestCollective],
    these: str,
    those: str,
) -> str | None:
    """Where two captures' collective sequences first part, in words; None if alike."""
    texts = [collective_text(c) for c in mine]
    others = [collective_text(c) for c in theirs]
    pairs = zip(mine, theirs, strict=False)
    for step, (this, that) in enumerate(pairs, start=1):
        if collective_key(this) != collective_key(that):
            return (
                f"collective {step} is {texts[step - 1]} on {these}, {others[step - 1]} on {those}"
            )
    if len(texts) == len(others):
        return None
    more, fewer = (these, those) if len(texts) > len(others) else (those, these)
    extra = (texts if len(texts) > len(others) else others)[min(len(texts), len(others))]
    count = abs(len(texts) - len(others))
    return (
        f"{more} issue{'s' if more.startswith('rank ') else ''} "
        f"{counted(count, 'more collective', 'more collectives')} than {fewer}, the first {extra}"
    )


def _counts(
    group: tuple[int, ...],
    reference: tuple[int, ...],
    actual: Mapping[str, int],
    expected: Mapping[str, int],
) -> Iterable[RankDifference]:
    for site in sorted(set(actual) | set(expected)):
        mine, theirs = actual.get(site, 0), expected.get(site, 0)
        if mine != theirs:
            detail = (
                f"{site}: captured {_times(mine)} on {_ranks(group)}, {_times(theirs)} on "
                f"{_ranks(reference)}"
            )
            yield RankDifference(COUNT, group, reference, detail)


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def missing(arrived: Iterable[int], world_size: int) -> RankDifference | None:
    """The ranks of ``world_size`` that did not arrive, if any."""
    present = set(arrived)
    absent = tuple(rank for rank in range(world_size) if rank not in present)
    if not absent:
        return None
    arrived_text = f"{_ranks(sorted(present))} did" if present else "none did"
    detail = f"{_ranks(absent)} did not reach the check in time; {arrived_text}"
    return RankDifference(MISSING, absent, tuple(sorted(present)), detail)


def agreement(manifests: Mapping[int, ManifestDocument]) -> str:
    """The line of a job whose ranks agree: ``2 ranks agree: 5 captures, 12 collectives``."""
    any_rank = manifests[min(manifests)]
    captures = sum(any_rank["per_site"].values())
    collectives = sum(len(c["collectives"]) for c in any_rank["captures"])
    count = len(manifests)
    return (
        f"{counted(count, 'rank')} agree: {counted(captures, 'capture')}, "
        f"{counted(collectives, 'collective')} inside them"
    )
