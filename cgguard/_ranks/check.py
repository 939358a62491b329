"""The live check of a job's ranks: each rank puts its capture manifest in torch.distributed's
key-value store, waits for the others' within a timeout, and compares them all
(cgguard._data.rank_compare), so that every rank says which ranks captured differently, or did
not arrive, before a diverged job hangs in its collectives.

The store, not a collective: a job whose ranks diverged may already be stuck in a collective on
its own communicators, while the store (torchrun's ``TCPStore``, the default group's) needs
none: ``set``, ``check`` and ``wait`` go to the store's server directly.
"""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

from cgguard._data.rank_compare import RankDifference, compare, missing
from cgguard._support.frames import stack_above
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from cgguard._core.installation import Installation
    from cgguard._data.schema import ManifestDocument

API = "cgguard.check_ranks"
# The keys of one check, in the store: a prefix of their own, one per rank, per check made.
PREFIX = "cgguard/ranks"
# A manifest larger than this is exchanged with each capture's collectives as a digest.
EXCHANGED_MAX = 4 * 1024 * 1024
# Differences told in one event's message; check_ranks() returns them all.
TOLD = 8


def check_ranks(
    installation: Installation, timeout: float, *, depth: int = 2
) -> list[RankDifference]:
    """Compare this rank's capture manifest with every other rank's, through the store; report
    what differs as one rank_divergence event, and return it. ``depth``: frames between the
    program's call and here, for the event's stack."""
    checked_timeout(timeout)
    dist = sys.modules.get("torch.distributed")
    manifest = installation.run.manifest
    try:
        initialized = dist is not None and dist.is_available() and dist.is_initialized()
    except Exception:
        initialized = False
    if not initialized:
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
    if dist is None:  # for type checkers: initialized says it is not
        return []
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    manifest.checks += 1
    keys = [f"{PREFIX}/{manifest.checks}/{other}" for other in range(world)]
    store.set(keys[rank], _exchanged(manifest.document()))
    # Timed out: who did not arrive is read below.
    with contextlib.suppress(Exception):
        store.wait(keys, timedelta(seconds=timeout))
    arrived: dict[int, ManifestDocument] = {}
    for other, key in enumerate(keys):
        if store.check([key]):
            arrived[other] = json.loads(store.get(key))
    found = compare(arrived)
    gone = missing(arrived, world)
    if gone is not None:
        found.append(gone)
    if found:
        _tell(installation, found, depth + 1)
    return found


def checked_timeout(timeout: object) -> float:
    """``timeout`` as seconds to wait, or one clear error: a finite number above 0."""
    if (
        not isinstance(timeout, (int, float))
        or isinstance(timeout, bool)
        or not 0 < timeout < float("inf")
    ):
        raise ValueError(
            f"check_ranks(timeout={timeout!r}): accepted values are seconds, a number above 0"
        )
    return float(timeout)


def _exchanged(document: ManifestDocument) -> str:
    """The manifest as put in the store: whole, or past EXCHANGED_MAX with each capture's
    collectives as one digest (the ranks still part at the same capture)."""
    text = json.dumps(document, separators=(",", ":"))
    if len(text) <= EXCHANGED_MAX:
        return text
    import hashlib

    for capture in document["captures"]:
        collectives = capture["collectives"]
        digest = hashlib.blake2b(json.dumps(collectives).encode(), digest_size=8).hexdigest()
        capture["collectives"] = [
            {
                "op": f"{len(collectives)} collectives {digest}",
                "ranks": None,
                "dtype": None,
                "numel": 0,
            }
        ]
    return json.dumps(document, separators=(",", ":"))


def _tell(installation: Installation, found: list[RankDifference], depth: int) -> None:
    """One rank_divergence event for what a check found; its error raised where the rule's
    action says raise."""
    details = [difference.detail for difference in found[:TOLD]]
    more = f"; and {len(found) - TOLD} more" if len(found) > TOLD else ""
    count = len(found)
    why = (
        f"{count} difference{'s' if count != 1 else ''} between the ranks: "
        + "; ".join(details)
        + more
    )
    reporter = installation.reporter  # read once: a reconfiguration swaps it whole
    error = reporter.violated(
        [("rank_divergence", None)], API, stack_above(depth), refuse=True, why=why
    )
    if error is not None:
        raise error


def after_window(installation: Installation, timeout: float, entry: str) -> None:
    """CGGUARD_RANK_CHECK: a capture window closed, the ranks are compared; cgguard's own
    failure here is one line, never the program's."""
    try:
        check_ranks(installation, timeout, depth=4)
    except Exception as exc:
        if getattr(exc, "rule", None) == "rank_divergence":
            raise
        warn_once("ranks:window", f"could not compare the ranks after {entry} closed: {exc!r}")
