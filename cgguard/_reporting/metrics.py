"""Fleet metrics: cgguard's counters in prometheus_client's default registry, where asked for.

prometheus_client is imported only when ``metrics="prometheus"`` is configured, and then only at
the first count, or by the program itself (cgguard's counters are registered right after):
never at configuration, which comes at torch's import, before a server sets the environment
prometheus_client reads at its own import. Its counters are registered once per process (the
default registry refuses a name twice) and work in its multiprocess mode as in its plain one:
with ``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client is imported, each process writes
its own values to that folder and the server's ``MultiProcessCollector`` sums them. Only
counters and a histogram are used: the kinds whose multiprocess sum means what one process's
value does (a histogram's buckets are counters).

Every label takes values from a fixed set, so that a server's series stay bounded: a violation's
rule and action, a capture's outcome, and a skipped cudagraph's class
(cgguard._census.skip_classes), never torch's message.
"""

from __future__ import annotations

import threading
from typing import Any

from cgguard import _boot
from cgguard._rules.record import ENDED, FAILED
from cgguard._support.warn import warn_once

# The histogram's buckets, in seconds: a capture takes milliseconds for a small graph, and up to
# minutes where it compiles or autotunes inside the capture.
CAPTURE_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
# The outcomes whose time is counted, as the census counts it: a refused capture never began,
# and an abandoned one's time is only how long cgguard took to notice.
_TIMED = frozenset({ENDED, FAILED})


class Metrics:
    """cgguard's counters, registered in prometheus_client's default registry."""

    def __init__(self, prometheus: Any) -> None:
        self._prometheus = prometheus
        counter = prometheus.Counter
        # prometheus_client adds the "_total" of a counter's sample itself.
        self.violations = counter(
            "cgguard_violations", "CUDA-graph capture violations cgguard saw", ["rule", "action"]
        )
        self.captures = counter(
            "cgguard_captures", "CUDA-graph captures cgguard saw, by outcome", ["outcome"]
        )
        self.capture_seconds = counter(
            "cgguard_capture_seconds",
            "Wall time from capture_begin to the end of capture_end, summed over captures",
        )
        self.capture_bytes = counter(
            "cgguard_capture_bytes",
            "Growth of the allocator's reserved bytes across captures, summed where it grew",
        )
        self.capture_duration = prometheus.Histogram(
            "cgguard_capture_duration_seconds",
            "Wall time from capture_begin to the end of capture_end, of each capture that "
            "ended or failed",
            buckets=CAPTURE_BUCKETS,
        )
        self.skips = counter(
            "cgguard_cudagraph_skips",
            "Graphs torch.compile compiled without a CUDA graph, by the class of torch's reason",
            ["reason"],
        )
        # Registered at the first replayed(), where replays are counted: a process that counts
        # none shows no replay counter, rather than one that says 0.
        self.replays: Any = None

    def violated(self, rule: str, action: str) -> None:
        """One violation, labelled as its event is (``action`` "raised" or "logged")."""
        try:
            self.violations.labels(rule=rule, action=action).inc()
        except Exception as exc:
            warn_once("metrics:violation", f"could not count a violation's metric: {exc!r}")

    def captured(self, outcome: str, seconds: float, reserved: int | None) -> None:
        """One capture, as it ended; ``reserved``: its growth of reserved bytes, where known."""
        try:
            self.captures.labels(outcome=outcome).inc()
            if outcome in _TIMED and seconds >= 0:
                self.capture_seconds.inc(seconds)
                self.capture_duration.observe(seconds)
            if reserved is not None and reserved > 0:
                # A counter only grows: memory a capture gave back is not taken off.
                self.capture_bytes.inc(reserved)
        except Exception as exc:
            warn_once("metrics:capture", f"could not count a capture's metrics: {exc!r}")

    def skipped(self, reason: str) -> None:
        """One graph torch.compile compiled without a CUDA graph, for ``reason``, its class
        (cgguard._census.skip_classes)."""
        try:
            self.skips.labels(reason=reason).inc()
        except Exception as exc:
            warn_once("metrics:skip", f"could not count a skipped cudagraph's metric: {exc!r}")

    def replayed(self, count: int) -> None:
        """``count`` replays of graphs whose replays the census counts; the counter is
        registered at the first call, 0 included."""
        try:
            replays = self.replays
            if replays is None:
                with _lock:
                    if self.replays is None:
                        self.replays = self._prometheus.Counter(
                            "cgguard_graph_replays",
                            "Replays of the CUDA graphs captured while replays were counted",
                        )
                    replays = self.replays
            if count:
                replays.inc(count)
        except Exception as exc:
            warn_once("metrics:replay", f"could not count a replay's metric: {exc!r}")


MODULE = "prometheus_client"

# cgguard's counters as registered in prometheus_client's default registry, which refuses a name
# twice: like that registry, once per process, whatever cgguard's own state does since.
_registered: list[Metrics] = []
_lock = threading.Lock()


class Prometheus:
    """Whether a configuration asks for metrics, and the counters once registered: at the first
    count, or when the program imports prometheus_client itself, whichever comes first."""

    def __init__(self) -> None:
        self.wanted = False
        self.failed = False  # prometheus_client could not be imported, or refused the counters

    def want(self) -> None:
        """Metrics are asked for: registered once there is something to count, or as soon as
        the program imports prometheus_client. Never imports it here: prometheus_client picks
        its value class (multiprocess or not) from ``PROMETHEUS_MULTIPROC_DIR`` when it is
        imported, and a server sets that variable after torch's import, where cgguard is
        configured."""
        self.wanted = True
        if _registered or self.failed:
            return
        _boot.when_ready(MODULE, self.on_import)

    def unwant(self) -> None:
        """Metrics are no longer asked for: nothing more is registered (counters registered stay
        in prometheus_client's registry, which has no way to take them back that a server's
        collector would follow)."""
        self.wanted = False
        _boot.cancel(MODULE, self.on_import)

    def on_import(self, module: object) -> None:
        """The program imported prometheus_client: cgguard's counters go in its registry now."""
        if self.wanted:
            self._start()

    def active(self) -> Metrics | None:
        """The counters where metrics are asked for, registered at the first call; None, with
        one warning, where prometheus_client cannot be imported or refuses them. Called where
        there is something to count, so that the program's environment is read as it is by
        then."""
        if _registered or not self.wanted:
            return _registered[0] if _registered else None
        return self._start()

    def captured(self, outcome: str, seconds: float, reserved: int | None) -> None:
        """One capture to count, as it ended (Metrics.captured), registering the counters first
        if need be."""
        metrics = self.active()
        if metrics is not None:
            metrics.captured(outcome, seconds, reserved)

    def replayed(self, count: int) -> None:
        """``count`` replays to count (Metrics.replayed), registering the counters first if
        need be."""
        metrics = self.active()
        if metrics is not None:
            metrics.replayed(count)

    def _start(self) -> Metrics | None:
        with _lock:
            if _registered or self.failed:
                return _registered[0] if _registered else None
            # Importing it below would fire the hook on this thread, under this lock.
            _boot.cancel(MODULE, self.on_import)
            try:
                import prometheus_client

                _registered.append(Metrics(prometheus_client))
            except ImportError:
                self.failed = True
                warn_once(
                    "metrics:import",
                    "metrics='prometheus' (CGGUARD_METRICS) needs prometheus_client, which is "
                    "not importable here: no metrics (pip install 'cgguard[metrics]')",
                )
            except Exception as exc:
                self.failed = True
                warn_once("metrics:register", f"could not register cgguard's metrics: {exc!r}")
            return _registered[0] if _registered else None
