"""The live check of a job's ranks: each rank puts its capture manifest in torch.distributed's
key-value store, waits for the others within a timeout, and compares them
(cgguard._data.rank_compare), so that every rank says which ranks captured differently, or did
not arrive, before a diverged job hangs in its collectives.

The store, not a collective: a job whose ranks diverged may already be stuck in a collective on
its own communicators, while the store (torchrun's ``TCPStore``, the default group's) needs
none: ``set``, ``check``, ``wait`` and ``get`` go to the store's server directly.

Each rank puts a digest of its manifest and the manifest itself, and reads every digest but only
one manifest per distinct digest: ranks that agree, the common case, cost the store one small
key each. Checks are numbered per process, so that every rank must make as many as the others,
as with a collective; a rank's key of the check before is deleted once every rank has arrived at
this one, which every rank read it before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cgguard._data.census_merge import counted
from cgguard._data.rank_compare import RankDifference, compare, missing
from cgguard._ranks.first_use import distributed
from cgguard._support.frames import stack_above
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from cgguard._core.installation import Installation
    from cgguard._data.schema import ManifestDocument

API = "cgguard.check_ranks"
# The keys of one check, in the store: a prefix of their own, per check made and per rank.
PREFIX = "cgguard/ranks"
# A capture issuing more collectives than this is exchanged with them as one digest: the same
# rule on every rank, so that ranks still part at the capture where they do.
COLLECTIVES_EXCHANGED = 64
# Differences told in one event's message; check_ranks() returns them all.
TOLD = 8
# The longest wait accepted, in seconds: what a timedelta holds with room to spare.
LONGEST = 1e9


def checked_timeout(timeout: object) -> float:
    """``timeout`` as seconds to wait, or one clear error: a finite number above 0."""
    if (
        not isinstance(timeout, (int, float))
        or isinstance(timeout, bool)
        or not 0 < timeout <= LONGEST
    ):
        raise ValueError(
            f"check_ranks(timeout={timeout!r}): accepted values are seconds, a number above 0 "
            f"and at most {LONGEST:.0e}"
        )
    return float(timeout)


def check_ranks(
    installation: Installation, timeout: float, *, depth: int = 2
) -> list[RankDifference]:
    """Compare this rank's capture manifest with every other rank's, through the store; report
    what differs as one rank_divergence event, and return it. ``depth``: frames between the
    program's call and here, for the event's stack. ``timeout``: seconds, as
    checked_timeout() accepts them."""
    dist = distributed()
    manifest = installation.run.manifest
    if dist is None:
        warn_once(
            "ranks:check",
            "check_ranks: torch.distributed has no default group in this process "
            "(init_process_group was not called): no ranks to compare",
        )
        return []
    if not manifest.recording:
        warn_once(
            "ranks:off",
            "check_ranks: the capture manifest is off in this process (CGGUARD_MANIFEST=0, "
            "or cgguard installed without a rank identity): nothing to compare",
        )
        return []
    manifest.checks += 1
    try:
        found = _exchange(dist, manifest.checks, exchanged(manifest.document()), timeout)
    except Exception as exc:
        warn_once(
            f"ranks:store:{manifest.checks}",
            f"check_ranks: torch.distributed's store failed ({exc!r}): nothing compared",
        )
        return []
    if found:
        _tell(installation, found, depth + 1)
    return found


def _exchange(
    dist: Any, check: int, document: ManifestDocument, timeout: float
) -> list[RankDifference]:
    """Put this rank's manifest in the store, wait for the others', compare."""
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    text = json.dumps(document, separators=(",", ":"))
    digest = _digest(text, 16)
    here = f"{PREFIX}/{check}"
    store.set(f"{here}/{rank}/manifest", text)
    store.set(f"{here}/{rank}/digest", digest)
    digests = [f"{here}/{other}/digest" for other in range(world)]
    # Timed out: who did not arrive is read below.
    with contextlib.suppress(Exception):
        store.wait(digests, timedelta(seconds=timeout))
    arrived: dict[int, str] = {}
    for other, key in enumerate(digests):
        if store.check([key]):
            arrived[other] = store.get(key).decode()
    # One manifest per distinct digest: ranks alike read as one.
    manifests: dict[int, ManifestDocument] = {}
    read: dict[str, ManifestDocument] = {digest: document}
    for other, theirs in arrived.items():
        if theirs not in read:
            read[theirs] = json.loads(store.get(f"{here}/{other}/manifest"))
        manifests[other] = read[theirs]
    found = compare(manifests)
    gone = missing(arrived, world)
    if gone is not None:
        found.append(gone)
    elif check > 1:
        # Every rank arrived at this check, so every one has read the check before.
        for suffix in ("manifest", "digest"):
            store.delete_key(f"{PREFIX}/{check - 1}/{rank}/{suffix}")
    return found


def exchanged(document: ManifestDocument) -> ManifestDocument:
    """The manifest as put in the store: a capture's collectives past COLLECTIVES_EXCHANGED
    as one digest, on every rank alike."""
    for capture in document["captures"]:
        collectives = capture["collectives"]
        if len(collectives) > COLLECTIVES_EXCHANGED:
            said = f"{len(collectives)} collectives {_digest(json.dumps(collectives), 8)}"
            capture["collectives"] = [{"op": said, "ranks": None, "dtype": None, "numel": 0}]
    return document


def _digest(text: str, size: int) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


def _tell(installation: Installation, found: list[RankDifference], depth: int) -> None:
    """One rank_divergence event for what a check found; its error raised where the rule's
    action says raise."""
    details = [difference.detail for difference in found[:TOLD]]
    more = f"; and {len(found) - TOLD} more" if len(found) > TOLD else ""
    count = len(found)
    why = f"{counted(count, 'difference')} between the ranks: "
    why += "; ".join(details) + more
    reporter = installation.reporter  # read once: a reconfiguration swaps it whole
    error = reporter.violated(
        [("rank_divergence", None)], API, stack_above(depth), refuse=True, why=why
    )
    if error is not None:
        raise error


def after_window(installation: Installation, timeout: float, entry: str) -> None:
    """CGGUARD_RANK_CHECK: a capture window closed, the ranks are compared; cgguard's own
    failure here is one line, never the program's. A window closed by an exception on its way
    out (an interrupt, a failure) is no capture phase ended: the program is not kept waiting."""
    if sys.exc_info()[1] is not None:
        return
    try:
        check_ranks(installation, timeout, depth=4)
    except Exception as exc:
        if getattr(exc, "rule", None) == "rank_divergence":
            raise
        warn_once("ranks:window", f"could not compare the ranks after {entry} closed: {exc!r}")
