"""Fleet metrics: cgguard's counters in prometheus_client's default registry, where asked for.

prometheus_client is imported only when ``metrics="prometheus"`` is configured. Its counters are
registered once per process (the default registry refuses a name twice) and work in its
multiprocess mode as in its plain one: with ``PROMETHEUS_MULTIPROC_DIR`` set before
prometheus_client is imported, each process writes its own values to that folder and the
server's ``MultiProcessCollector`` sums them. Only counters are used: they are the kind whose
multiprocess sum means what one process's value does.
"""

from __future__ import annotations

import threading
from typing import Any

from cgguard._warn import warn_once

_lock = threading.Lock()


class Metrics:
    """cgguard's counters, registered in prometheus_client's default registry."""

    def __init__(self, prometheus: Any) -> None:
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
        self.skips = counter(
            "cgguard_cudagraph_skips",
            "Graphs torch.compile compiled without a CUDA graph, by reason",
            ["reason"],
        )

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
            if seconds > 0:
                self.capture_seconds.inc(seconds)
            if reserved is not None and reserved > 0:
                # A counter only grows: memory a capture gave back is not taken off.
                self.capture_bytes.inc(reserved)
        except Exception as exc:
            warn_once("metrics:capture", f"could not count a capture's metrics: {exc!r}")

    def skipped(self, reason: str) -> None:
        """One graph torch.compile compiled without a CUDA graph, for the grouped ``reason``."""
        try:
            self.skips.labels(reason=reason).inc()
        except Exception as exc:
            warn_once("metrics:skip", f"could not count a skipped cudagraph's metric: {exc!r}")


_active: Metrics | None = None
_failed = False


def start() -> Metrics | None:
    """The process's metrics, registered on first use; None, with one warning, where
    prometheus_client cannot be imported or refuses them."""
    global _active, _failed
    with _lock:
        if _active is not None or _failed:
            return _active
        try:
            import prometheus_client

            _active = Metrics(prometheus_client)
        except ImportError:
            _failed = True
            warn_once(
                "metrics:import",
                "metrics='prometheus' (CGGUARD_METRICS) needs prometheus_client, which is not "
                "importable here: no metrics (pip install 'cgguard[metrics]')",
            )
        except Exception as exc:
            _failed = True
            warn_once("metrics:register", f"could not register cgguard's metrics: {exc!r}")
        return _active


def active() -> Metrics | None:
    """The metrics, if they were started in this process."""
    return _active
