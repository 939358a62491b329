"""Events recorded into a capture under way: CUDA fails their synchronize and query in every
capture mode while that capture is active (cudaErrorCapturedEvent)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from cgguard._rules.record import KEY
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cgguard._rules.record import Record


class CapturedEvents:
    """Each event last recorded into a capture, with that capture's record.

    Weak, so an entry goes with its event. An entry counts only while its record is the active
    one, and goes when its capture ends, found through ``of``: the record may hold the capturing
    frame, with its tensors, and the dictionary is never iterated, which fails while another
    thread adds to it.
    """

    def __init__(self) -> None:
        self.into: weakref.WeakKeyDictionary[Any, Record] = weakref.WeakKeyDictionary()
        # The events recorded into each capture under way, by id() of its graph.
        self.of: dict[int, list[weakref.ref[Any]]] = {}

    def note(self, event: Any, into: Record | None) -> None:
        """``event`` was just recorded into the capture ``into``, or into none."""
        if into is None:
            self.into.pop(event, None)
        else:
            self.into[event] = into
            self.of.setdefault(into[KEY], []).append(weakref.ref(event))

    def forget(self, key: int, ended: Record | None) -> None:
        """Drop the entries of the events recorded into the capture at ``key``, which ended."""
        refs = self.of.pop(key, None)
        if not refs or ended is None:
            return
        try:
            for ref in refs:
                event = ref()
                # Unless recorded since into another capture.
                if event is not None and self.into.get(event) is ended:
                    self.into.pop(event, None)
        except Exception as exc:
            warn_once("guard:events", f"internal error while forgetting events: {exc!r}")

    def captured_into(self, events: list[Any], active: Mapping[int, Record]) -> Record | None:
        """The capture among ``active`` the first of ``events`` was last recorded into."""
        if not self.into:
            return None
        for event in events:
            record = self.into.get(event)
            # An entry outlives its capture: it counts only while its record is the active one.
            if record is not None and active.get(record[KEY]) is record:
                return record
        return None

    def after_fork(self) -> None:
        """A forked child's fresh start: replaced, not cleared, since the fork may have caught
        another thread inside them."""
        self.into = weakref.WeakKeyDictionary()
        self.of = {}
