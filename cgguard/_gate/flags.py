"""Capture flags: cgguard's own and other frameworks', capture windows, and which of them
disables capture."""

from __future__ import annotations

from types import FrameType
from typing import TYPE_CHECKING

from cgguard._rules.record import Disabler
from cgguard._support.frames import resolve, snapshot_from
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import ModuleType

    from cgguard._support.frames import LiveStack, Snapshot


class CaptureFlag:
    """cgguard's capture flag, and where it was last changed (None: by configuration)."""

    __slots__ = ("changed_at", "disabler", "enabled")

    def __init__(self) -> None:
        self.enabled = True
        self.changed_at: Snapshot | None = None
        # What disables capture while the flag is off: made as it is set, not at each refused
        # capture of a storm.
        self.disabler = Disabler(None, None)

    def set(self, enabled: bool, changed_at: Snapshot | None) -> None:
        # Origin first: a reader that sees the new value must not see the old origin.
        self.disabler = Disabler(None, changed_at)
        self.changed_at = changed_at
        self.enabled = enabled


class FlagSource:
    """Another framework's capture flag: a module attribute, and where its setter last set it."""

    how = ""  # what the message adds to where the flag was set: nothing
    profile: str | None = None  # never a built-in profile's (cgguard._gate.profiles)

    def __init__(self, module: ModuleType, attribute: str) -> None:
        self.module = module
        self.attribute = attribute
        self.label = f"{module.__name__}.{attribute}"
        self.changed_at: Snapshot | None = None

    def enabled(self, stack: object = None) -> bool:
        """The flag's value; a flag that cannot be read allows, with one warning naming it."""
        try:
            return bool(getattr(self.module, self.attribute, True))
        except Exception as exc:
            warn_once(f"flag:{self.label}", f"cannot read {self.label}, not followed: {exc!r}")
            return True


class Predicate:
    """A capture window over framework state: ``read()`` is true while captures belong.

    ``read`` runs on the capturing thread, at each capture attempt while windows are watched.
    """

    __slots__ = ("entry", "kind", "read")

    def __init__(self, entry: str, kind: str, read: Callable[[], object]) -> None:
        self.entry = entry
        self.kind = kind  # "module attribute", "ContextVar" or "thread-local attribute"
        self.read = read

    def unreadable(self, exc: Exception) -> None:
        """A read that failed: one warning naming the window. The capture that asked is let
        through, and the window counts as neither entered nor closed by it."""
        warn_once(f"window:{self.entry}", f"cannot read the capture window {self.entry}: {exc!r}")


class Windows:
    """Capture windows, the declared ones or a built-in profile's: among what disables capture
    once one has been entered.

    Every Windows followed is one set with the others (disabled_by): a capture passes while any
    of them is open, or while none has been entered. Process-wide, as vLLM's own flag is: a
    function window is open while any thread runs it.
    It joins the followed flags (cgguard._gate.state.FOLLOWED) only once a function window has
    first been entered or a predicate window is declared, so that until then the capture path
    pays nothing for it. Where capture was disabled is the return of the window function that
    closed last, or, for a predicate window, the last capture seen inside it.
    """

    def __init__(self, profile: str | None = None) -> None:
        # The built-in profile these windows are (cgguard._gate.profiles), None for the declared
        # ones: a profile's refusals follow its own setting, and its exemptions apply to them.
        self.profile = profile
        # A profile's refusals only logged (Config(profiles="log")): they leave
        # is_capture_enabled() true. Set by cgguard._gate.profiles; never for the declared ones.
        self.log_only = False
        # The calling thread's id per call of a window function under way, on any thread:
        # list.append and list.remove are atomic, where a counter's += would need a lock on
        # every call; and a forked child keeps its own thread's calls alone.
        self.calls: list[int] = []
        self.entered = False
        self.predicates: tuple[Predicate, ...] = ()
        # The window that closed last, what closed it ("returned", or a capture seen inside
        # a predicate window) and where: the cause of a refusal, told only when one is made.
        self.closed: tuple[str, str, Snapshot] | None = None
        # Called once when the first window is entered: joins the followed flags.
        self.on_entered: Callable[[], None] = _nothing
        # Told each time the last call of these windows ends, with its entry (the live check of
        # a job's ranks listens here): the registry's one list, shared by every set.
        self.on_closed: list[Callable[[str], None]] = []

    @property
    def label(self) -> str | None:
        closed = self.closed
        return f"the capture window {closed[0]}" if closed is not None else None

    @property
    def changed_at(self) -> Snapshot | None:
        closed = self.closed
        return closed[2] if closed is not None else None

    @property
    def how(self) -> str:
        closed = self.closed
        if closed is None:
            return ""
        entry, what, _ = closed
        if what == RETURNED:
            return f", where the capture window {entry} returned"
        if what == WITH_ENDED:
            return f", where the with statement of the capture window {entry} ended"
        if what == SUSPENDED:
            return f", where the capture window {entry} was suspended (a yield or an await)"
        return f", the last capture seen inside the capture window {entry}"

    def enter_first(self) -> None:
        """The first call of a window function: the windows are watched from now on."""
        if not self.entered:
            self.entered = True
            self.on_entered()

    def close(self, entry: str, caller: FrameType, what: str = "") -> None:
        """The last call of a window function under way returned to ``caller``, or raised;
        or (``what`` WITH_ENDED) the last ``with`` body of a context window ended there; or
        (``what`` SUSPENDED) the last generator or coroutine running one gave way to it."""
        self.closed = (entry, what or RETURNED, snapshot_from(caller))

    def ended(self, entry: str) -> None:
        """The last call under way of these windows ended (``entry``'s), not only paused at a
        yield or an await: what listens for it is told, every time."""
        for listener in self.on_closed:
            listener(entry)

    def enabled(self, stack: Snapshot | LiveStack | None = None) -> bool:
        """Whether these windows alone let a capture begin now: inside an open window, or
        before any was entered."""
        if self.calls:
            return True
        if self.predicates and self.inside(stack):
            return True
        return not self.entered

    def inside(self, stack: Snapshot | LiveStack | None = None) -> bool:
        """Whether a capture now is inside one of these windows (or one's state cannot be
        read, which lets it through).

        ``stack`` is the capture's, when a capture asks: a predicate window seen true then is
        entered, and the capture is the last seen inside it.
        """
        if self.calls:
            return True
        unreadable = False
        for predicate in self.predicates:
            # The read inline, not through a method: this runs on every capture while a
            # predicate window is declared.
            try:
                inside = bool(predicate.read())
            except Exception as exc:  # the capture path never raises for a window's state
                predicate.unreadable(exc)
                unreadable = True
                continue
            if inside:
                if stack is not None:
                    top = stack[0]
                    code = top.f_code if type(top) is FrameType else top
                    closed = self.closed
                    # Captures made in a loop, at the line seen last: that stack holds.
                    if (
                        closed is None
                        or closed[0] is not predicate.entry
                        or closed[2][0] is not code
                        or closed[2][1] != stack[1]
                    ):
                        self.closed = (predicate.entry, SEEN_INSIDE, resolve(stack))
                    if not self.entered:
                        self.entered = True
                return True
        return unreadable

    def forget(self) -> None:
        """No window entered or closed yet; calls under way still leave."""
        self.entered = False
        self.closed = None


RETURNED = "returned"
WITH_ENDED = "with ended"
SUSPENDED = "suspended"  # a generator's or a coroutine's window, at a yield or an await
SEEN_INSIDE = "seen inside"


def _nothing() -> None:
    return None


def disabled_by(
    flag: CaptureFlag,
    follows: Iterable[FlagSource | Windows],
    stack: Snapshot | LiveStack | None = None,
) -> Disabler | None:
    """What disables capture now, cgguard's flag first; None when every flag allows it.

    The windows followed, declared and profiles', are one set: a capture inside any open one
    passes. Refused outside them all, it is blamed on a declared window that has been entered
    if any; on a profile (whose log-only setting and exemptions then apply) only when every
    entered window is that one profile's. ``stack`` is the capture's, when a capture asks (the
    windows keep it).
    """
    if not flag.enabled:
        disabler = flag.disabler
        # As set with the flag, unless its origin was assigned on its own since.
        return (
            disabler if disabler.changed_at is flag.changed_at else Disabler(None, flag.changed_at)
        )
    inside = False
    refusing: list[Windows] = []
    for source in list(follows):
        if isinstance(source, Windows):
            if source.inside(stack):
                inside = True
            elif source.entered:
                refusing.append(source)
        elif not source.enabled(stack):
            return Disabler(source.label, source.changed_at, source.how)
    if inside or not refusing:
        return None
    blamed = next((w for w in refusing if w.profile is None), refusing[0])
    profile = blamed.profile
    if profile is not None and any(w.profile != profile for w in refusing):
        profile = None  # two profiles' windows: neither one's setting or exemptions decide
    return Disabler(
        blamed.label,
        blamed.changed_at,
        blamed.how,
        profile,
        profile is not None and blamed.log_only,
    )
