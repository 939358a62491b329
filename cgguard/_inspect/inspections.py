"""The inspected captures of the process, kept across reconfigurations: each thread's own, and
those open on any thread (cgguard._process holds them; cgguard._inspect.inspector fills them),
and the bindings' epoch. Light to import: the process's owner makes them whether or not
inspection is ever on, so naming inputs (cgguard._inspect.bindings) is not imported here."""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Any

from cgguard._rules.record import THREAD
from cgguard._support.frames import stack_above

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    from cgguard._data.schema import ViolationEvent
    from cgguard._rules.record import Record
    from cgguard._support.frames import Snapshot

    # A type only: made at run time, a Protocol class costs the process's start-up for nothing.
    class Inspected(Protocol):
        """An inspected capture, as kept here (cgguard._inspect.inspector.InspectedCapture)."""

        inspector: Any  # the watcher that opened it
        record: Record
        on: bool  # still judged
        closed: bool  # over, its mode still to come off its thread's stack
        offender: ViolationEvent | None  # the first violation let through during it

        def take_off(self) -> None: ...


# Where the epoch keeps the rebindings it saw: bounded, the oldest forgotten first.
REBINDS_MAX = 4096


class Epoch:
    """Moved by each path cgguard sees that can rebind a name: ``nn.Module.__setattr__`` of a
    tensor or module, ``Module._apply`` (``.to()``, ``.half()``), ``load_state_dict``, a tensor's
    ``.data =``, a framework's lifecycle function, ``check_bindings()``. A graph's bindings are
    resolved again only when it moved since their last check.

    It also keeps where each attribute was last rebound (the owner held weakly), for a report.
    """

    __slots__ = ("rebinds", "value")

    def __init__(self) -> None:
        self.value = 0
        self.rebinds: dict[tuple[int, str], tuple[weakref.ref[Any], Snapshot]] = {}

    def moved(self, owner: Any = None, name: str = "") -> None:
        """Something may have been rebound (``owner.name``, where known, at the caller's)."""
        self.value += 1
        if owner is None:
            return
        with contextlib.suppress(TypeError):  # an owner without weak references: not kept
            rebinds = self.rebinds
            if len(rebinds) >= REBINDS_MAX:
                del rebinds[next(iter(rebinds))]
            rebinds[(id(owner), name)] = (weakref.ref(owner), stack_above(2))

    def rebound_at(self, owner: Any, name: str) -> Snapshot | None:
        """Where ``owner.name`` was last rebound, if cgguard saw it."""
        held = self.rebinds.get((id(owner), name))
        if held is None or held[0]() is not owner:
            return None
        return held[1]


class Inspections:
    """The inspected captures of the process, across reconfigurations: each thread's own,
    innermost last, and those open on any thread.

    While any is open, one listener among the process's ``listeners`` notes the first violation
    let through on a thread during its inspected capture, for a capture_end that fails.
    """

    def __init__(self, listeners: list[Callable[[ViolationEvent], None]]) -> None:
        self.listeners = listeners
        self.local = threading.local()  # .captures: this thread's inspected captures
        self.open: list[Inspected] = []  # on any thread
        self.lock = threading.Lock()
        # What may have rebound a name a graph reads (cgguard._inspect.bindings), and the
        # inputs of each live graph that has bindings, weakly: they go with their graph.
        self.epoch = Epoch()
        self.bound: weakref.WeakSet[Any] = weakref.WeakSet()

    def captures(self) -> list[Inspected]:
        """This thread's inspected captures, innermost last."""
        captures: list[Inspected] | None = getattr(self.local, "captures", None)
        if captures is None:
            captures = self.local.captures = []
        return captures

    def forget_closed(self) -> None:
        """Take off this thread's stack the modes of its captures that another thread ended."""
        captures = getattr(self.local, "captures", None)
        if captures:
            for capture in [w for w in captures if w.closed]:
                capture.take_off()

    def judging(self) -> Inspected | None:
        """This thread's innermost inspected capture that is still judged, if any."""
        captures: list[Inspected] | None = getattr(self.local, "captures", None)
        if not captures:
            return None
        self.forget_closed()
        for capture in reversed(captures):
            if capture.on:
                return capture
        return None

    def listen(self, capture: Inspected, *, opened: bool) -> None:
        """``capture`` opened or closed: the listener is subscribed while any is open (one for
        the process, called on the violating thread)."""
        with self.lock:
            if opened:
                self.open.append(capture)
            elif capture in self.open:
                self.open.remove(capture)
            listening = self.offended in self.listeners
            if self.open and not listening:
                self.listeners.append(self.offended)
            elif not self.open and listening:
                self.listeners.remove(self.offended)

    def offended(self, event: ViolationEvent) -> None:
        """The listener: a violation let through during this thread's inspected capture."""
        captures = getattr(self.local, "captures", None)
        if not captures or event.get("action") != "logged":
            return
        for capture in captures:
            if (
                capture.on
                and capture.offender is None
                and _thread_of(capture) == event.get("thread_id")
            ):
                capture.offender = event

    def retire(self, inspector: object) -> None:
        """``inspector`` was replaced: its captures still under way stop judging at once."""
        with self.lock:
            captures = list(self.open)
        for capture in captures:
            if capture.inspector is inspector:
                capture.on = False

    def after_fork(self) -> None:
        """A forked child: the forking thread's captures' modes come off its stack, and the
        captures of the threads it lacks are not its own."""
        for capture in list(self.captures()):
            capture.on = False
            capture.take_off()
        self.local = threading.local()
        # Another thread may have held the lock at the fork.
        self.lock = threading.Lock()
        self.open.clear()
        if self.offended in self.listeners:
            self.listeners.remove(self.offended)


def _thread_of(capture: Inspected) -> int | None:
    ident: int | None = capture.record[THREAD].ident
    return ident
