"""torch.compile's skipped cudagraphs, seen where torch counts them.

``torch.compile(mode="reduce-overhead")`` falls back to no CUDA graph at all when inductor
finds a reason not to capture, and says so only in a log record most programs never show.
``log_cudagraph_skip_and_bump_counter`` is imported by name into several of torch's modules, so
a patch on its own module would catch nothing; and some skips bump the counter without it (a
graph without CUDA nodes, torch 2.13's ``CompiledFxGraph``). What every skip shares is the
counter ``torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]``: the "inductor" counter
is made a ``Counter`` that tells the census when that entry grows, and the reason is read from
the frame that bumped it (the message of ``log_cudagraph_skip_and_bump_counter``, or the
``disabled_cudagraphs_reason`` of the compiled graph). torch releases before the counter
existed (2.1) are not seen: docs/census.md says what they log instead.

Nothing here imports torch: the hook goes on once ``torch._dynamo.utils`` is imported by the
program.
"""

from __future__ import annotations

import collections
import sys
from typing import TYPE_CHECKING, Any

from cgguard import _boot
from cgguard._census.skip_classes import NO_REASON, skip_class
from cgguard._support.frames import innermost_visible, snapshot_from
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from types import FrameType, ModuleType

    from cgguard._core.installation import Installation

MODULE = "torch._dynamo.utils"
KEY = "cudagraph_skips"
# The function most skips go through, whose argument is torch's message.
_LOGGING_FUNCTION = "log_cudagraph_skip_and_bump_counter"


class CountingCounter(collections.Counter[str]):
    """torch's "inductor" counters, telling ``skips`` when ``cudagraph_skips`` grows."""

    def __init__(self, skips: CompileSkips, *args: Any) -> None:
        super().__init__(*args)
        self.skips = skips

    def __setitem__(self, key: str, value: int) -> None:
        if key != KEY:
            super().__setitem__(key, value)
            return
        before = self.get(key, 0)
        super().__setitem__(key, value)
        if isinstance(value, int) and value > before:
            self.skips.skipped(sys._getframe(1), value - before)

    def copy(self) -> CountingCounter:
        # Counter.copy() is ``self.__class__(self)``, which would take the counts for ``skips``.
        # torch copies these counters and may put the copy back in their place
        # (torch/_inductor/pattern_matcher.py, init_once_fakemode): the copy counts too.
        return CountingCounter(self.skips, self)

    def __reduce__(self) -> tuple[type[collections.Counter[str]], tuple[dict[str, int]]]:
        # Pickled (torch's compile workers, its metrics) as the plain Counter torch made: a
        # process without cgguard reads it.
        return collections.Counter, (dict(self),)


class _CountingFactory:
    """The ``default_factory`` of torch's counters while skips are counted: a fresh entry
    (after ``counters.clear()``) is a CountingCounter, so "inductor" counts again at its first
    use. Pickled, it is ``collections.Counter`` itself, torch's own factory: ``pickle.dumps``
    of the whole ``counters`` names nothing of cgguard's, and loads where cgguard is not."""

    def __init__(self, skips: CompileSkips) -> None:
        self.skips = skips

    def __call__(self) -> CountingCounter:
        return CountingCounter(self.skips)

    def __reduce__(self) -> tuple[type[type], tuple[collections.Counter[str]]]:
        # type(Counter()) is the Counter class: a callable and arguments that pickle names
        # only from the standard library.
        return type, (collections.Counter(),)


class CompileSkips:
    """torch.compile's skipped cudagraphs, counted into an installation's census while started."""

    def __init__(self) -> None:
        self.installation: Installation | None = None  # None: not counting

    def start(self, installation: Installation) -> None:
        """Count skipped cudagraphs into ``installation``'s census from now on: at once if
        torch._dynamo.utils is imported, otherwise once it is."""
        self.installation = installation
        _boot.when_ready(MODULE, self.hook)

    def stop(self) -> None:
        """Stop counting, and give torch plain counters back."""
        self.installation = None
        _boot.cancel(MODULE, self.hook)
        counters = getattr(sys.modules.get(MODULE), "counters", None)
        if not isinstance(counters, collections.defaultdict):
            return
        try:
            if isinstance(counters.default_factory, _CountingFactory):
                counters.default_factory = collections.Counter
            inductor = counters.get("inductor")
            if type(inductor) is CountingCounter:
                counters["inductor"] = collections.Counter(inductor)
        except Exception as exc:
            warn_once("skips:unwatch", f"could not restore torch's compile counters: {exc!r}")

    def hook(self, utils: ModuleType) -> None:
        """Make torch's "inductor" counters, now and after any ``counters.clear()``, count skips.

        ``counters`` is a ``defaultdict(Counter)`` that torch's modules import by name, so the
        object itself stays: its factory and its "inductor" entry change.
        """
        if self.installation is None:
            return
        try:
            counters: Any = utils.counters
            if not isinstance(counters, collections.defaultdict):
                warn_once("skips:hook", "torch's compile counters are not as expected: not counted")
                return
            counters.default_factory = _CountingFactory(self)
            inductor = counters.get("inductor")
            if type(inductor) is not CountingCounter or inductor.skips is not self:
                counters["inductor"] = CountingCounter(self, inductor or {})
        except Exception as exc:
            warn_once("skips:hook", f"could not watch torch.compile's skipped cudagraphs: {exc!r}")

    def skipped(self, frame: FrameType, count: int) -> None:
        """Count ``count`` skips bumped by ``frame``, with its reason, at the user's call."""
        installation = self.installation
        if installation is None:
            return
        try:
            reporter = installation.reporter  # read once: a reconfiguration swaps it whole
            if not reporter.config.census:
                return
            message = reason_of(frame)
            where = innermost_visible(snapshot_from(frame))
            census = installation.run.census
            for _ in range(count):
                census.skipped(message, where)
            metrics = reporter.metrics.active() if reporter.metrics is not None else None
            if metrics is not None:
                # Labelled by its class: torch's message names nodes, devices and the
                # user's code, values a metric's label must not take.
                cause = skip_class(message)
                for _ in range(count):
                    metrics.skipped(cause)
            if reporter.report is not None:
                reporter.report.changed(new_site=False)
        except Exception as exc:
            warn_once("skips:count", f"could not count a skipped cudagraph: {exc!r}")


def reason_of(frame: FrameType) -> str:
    """torch's message for the skip that ``frame`` counted, as far as the frame tells it."""
    local = frame.f_locals
    if frame.f_code.co_name == _LOGGING_FUNCTION:
        message = local.get("msg")
        if isinstance(message, str):
            return message
    graph = local.get("self")
    reason = getattr(graph, "disabled_cudagraphs_reason", None)
    if isinstance(reason, str) and reason:
        return reason
    return NO_REASON
