"""A capture as the rules see it: its record, the cause of a refusal when capture is disabled,
and the ways a capture comes to an end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    from cgguard._support.frames import LiveStack, Snapshot
    from cgguard._support.threads import ThreadRef

# A capture that has begun, as the capture path keeps it: a plain tuple, since anything with a
# constructor of its own costs several times a tuple display, and most records are never read.
# (id() of the graph, the thread that began it, api, capture_error_mode, where it began, the
# stream it captures on where known).
Record = tuple[int, "ThreadRef", str, str, "Snapshot | LiveStack", Any]
KEY: Final = 0
THREAD: Final = 1
API: Final = 2
MODE: Final = 3
BEGAN_AT: Final = 4
STREAM: Final = 5


class Disabler(NamedTuple):
    """Which flag disables capture, and where it was set: the cause of a refused capture."""

    label: str | None  # a followed flag's module.attribute; None for cgguard's own
    changed_at: Snapshot | None  # None: by configuration, or by a setter cgguard never saw
    how: str = ""  # what the message adds after where: which window closed there
    # The built-in profile whose windows disable capture, if every window that does is its.
    profile: str | None = None
    log_only: bool = False  # that profile's refusals are only logged (Windows.log_only)


# Each rule broken, with what it is blamed on: the capture that conflicts, or the flag that
# disables capture.
Found = list[tuple[str, "Record | Disabler | None"]]

# How a capture came to an end, once cgguard saw it begin (or saw a rule refuse it).
ENDED: Final = "ended"  # torch's capture_end returned
FAILED: Final = "failed"  # torch's capture_begin or capture_end raised
REFUSED: Final = "refused"  # a rule refused it: it never began
ABANDONED: Final = "abandoned"  # its thread ended, or a test runner let go of it, mid-capture
OUTCOMES: Final = (ENDED, FAILED, REFUSED, ABANDONED)
