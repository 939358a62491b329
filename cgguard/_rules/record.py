"""A capture as the rules see it: its record, the cause of a refusal when capture is disabled,
and the ways a capture comes to an end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    from cgguard._support.frames import LiveStack, Snapshot
    from cgguard._support.threads import ThreadRef

# A capture that has begun, as the capture path keeps it: (id() of the graph, the thread that
# began it, api, capture_error_mode, where it began, the stream it captures on where known),
# read by the indexes below. A plain tuple for speed: one is made at every capture, and a
# NamedTuple's constructor costs about 160 ns on CPython 3.11 against about 30 ns for a tuple
# display (tuple.__new__ on the class, about 95 ns), some 5% of the capture path's budget.
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

# The entry points a record or a violation names, as cgguard reports them.
API_GRAPH: Final = "torch.cuda.graph"
API_CAPTURE_BEGIN: Final = "CUDAGraph.capture_begin"
API_ACCELERATOR_GRAPH: Final = "torch.accelerator.Graph"
API_ACCELERATOR_CAPTURE_BEGIN: Final = "Graph.capture_begin"
API_SYNCHRONIZE: Final = "torch.cuda.synchronize"
API_ACCELERATOR_SYNCHRONIZE: Final = "torch.accelerator.synchronize"
API_STREAM_SYNCHRONIZE: Final = "Stream.synchronize"
API_STREAM_QUERY: Final = "Stream.query"
API_EVENT_SYNCHRONIZE: Final = "Event.synchronize"
API_EVENT_QUERY: Final = "Event.query"
API_EVENT_ELAPSED_TIME: Final = "Event.elapsed_time"
# torch's CUDAEvent::elapsed_time queries both events (cudaEventQuery) before it measures: the
# APIs whose violation is a query, not a synchronize.
QUERIES: Final = (API_STREAM_QUERY, API_EVENT_QUERY, API_EVENT_ELAPSED_TIME)
EVENT_CALLS: Final = (API_EVENT_SYNCHRONIZE, API_EVENT_QUERY, API_EVENT_ELAPSED_TIME)
STREAM_CALLS: Final = (API_STREAM_SYNCHRONIZE, API_STREAM_QUERY)
