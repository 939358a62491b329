"""The captures under way in one installation: the book the capture path keeps, and what ending
one tells, the events recorded into it (cgguard._core.captured_events) and its watchers
(cgguard._core.fanout)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from cgguard._core.captured_events import CapturedEvents
from cgguard._core.fanout import Fanout
from cgguard._rules.record import ABANDONED, ENDED, KEY, MODE, STREAM, THREAD
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from cgguard._core.probes import Probes
    from cgguard._core.watcher import GraphNotes
    from cgguard._rules.record import Record


class Entering(threading.local):
    """Each thread's torch.cuda.graph being entered, for the capture_begin its __enter__ makes:
    (id() of the graph, what the hook on __enter__ checked: the record, and the keys of the
    captures active then); None outside every __enter__."""

    def __init__(self) -> None:
        self.capture: tuple[int, tuple[Record, tuple[int, ...]]] | None = None


class CaptureBook:
    """Each capture begun and not yet ended, by id() of the graph that holds it."""

    def __init__(self, notes: GraphNotes | None = None) -> None:
        # Mutated in place only: the capture path's hooks bind these very dicts.
        self.active: dict[int, Record] = {}
        # Handed from the hook on torch.cuda.graph.__enter__ to the capture_begin it makes, on
        # the same thread: passed aside, not through the active captures, since torch's own
        # synchronize before capture_begin is no synchronize during a capture.
        self.entering = Entering()
        self.events = CapturedEvents()
        self.fanout = Fanout(notes)

    def drop(self, key: int, record: Record, outcome: str = ABANDONED) -> bool:
        """Forget the capture at ``key`` if it is still ``record``; whether this call did.

        Popped only while it is this record: its thread may end it meanwhile, and of two
        threads that find it, one drops it.
        """
        active = self.active
        if active.get(key) is record and active.pop(key, None) is record:
            self.events.forget(key, record)
            fanout = self.fanout
            if fanout.led or fanout.tokens:
                fanout.closed(key, outcome, None)
            return True
        return False

    def forget(self, kept: tuple[Record, ...] = ()) -> list[Record]:
        """Forget every capture under way but ``kept``; return the records forgotten."""
        return [
            record
            for key, record in list(self.active.items())
            if not any(record is k for k in kept) and self.drop(key, record)
        ]

    def abandoned(self) -> list[Record]:
        """Forget the captures of threads that have ended: those this call dropped, each for
        the caller to report once."""
        try:
            # Relaxed captures are left alone: CUDA lets another thread end them.
            dead = [
                (k, r)
                for k, r in list(self.active.items())
                if r[THREAD]() is None and r[MODE] != "relaxed"
            ]
        except Exception as exc:
            warn_once("guard:threads", f"internal error while checking threads: {exc!r}")
            return []
        # Dropped first: of two threads that find one, one reports it.
        return [record for key, record in dead if self.drop(key, record)]

    def stale(self, causes: list[Record], probes: Probes) -> bool:
        """Forget those of ``causes`` whose stream no longer captures; whether there were any.

        Such a record is cgguard's own mistake, not the program's: its capture ended where
        cgguard could not see it (an interrupt right after torch's capture_end, a capture_end
        that skips torch's). Asked only of a violation's causes, just before it is reported.
        """
        stale = [cause for cause in causes if not probes.began(cause, unknown=True)]
        for record in stale:
            # It ended, in a way cgguard could not see.
            self.drop(record[KEY], record, ENDED)
        return bool(stale)

    def began_here(self, record: Record, previous: Record | None, probes: Probes) -> bool:
        """Whether the capture_begin that raised had begun ``record``'s capture: its stream
        captures, and for no other capture cgguard knows (torch refuses a capture_begin on a
        stream already capturing)."""
        if not probes.began(record):
            return False
        others = [r for r in self.active.values() if r is not record]
        if previous is not None:
            others.append(previous)
        try:
            return not any(other[STREAM] == record[STREAM] for other in others)
        except Exception:
            return True

    def after_fork(self) -> None:
        """A forked child's fresh start: the parent's captures belong to threads it lacks."""
        self.active.clear()
        self.entering.capture = None  # the forking thread's, the child's only one
        self.events.after_fork()
        self.fanout.after_fork()
