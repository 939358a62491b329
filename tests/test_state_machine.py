"""A state machine over begin / end / enable / disable / body-raises on three threads.

Runs on the simulated CUDA runtime with cgguard installed, and checks after every step that
cgguard's view of the active captures matches a model and the simulated driver, per thread.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from helpers import tracker
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import cgguard
from cgguard import _process
from cgguard.testing import capture_violations, simulated_cuda

pytestmark = pytest.mark.simulated

THREADS = 3
# thread_local: one thread's synchronize (torch.cuda.graph.__enter__ makes one) must not
# invalidate another thread's capture, or the model would have to follow CUDA's poisoning.
MODE = "thread_local"


class BodyFailedError(Exception):
    """Raised inside a capture's body on purpose."""


@dataclass
class Capture:
    graph: Any
    stream: Any
    invalidated: bool = False


@dataclass
class Worker:
    """One long-lived thread, so that a logical thread keeps its identity across steps."""

    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=1))
    captures: list[Capture] = field(default_factory=list)
    ident: int = 0

    def run(self, fn: Any) -> Any:
        """Run ``fn`` on this worker's thread; return its result or the exception it raised."""
        future = self.pool.submit(fn)
        error = future.exception(timeout=30)
        return error if error is not None else future.result()


class CaptureMachine(RuleBasedStateMachine):
    @initialize(mode=st.sampled_from(["raise", "log"]))
    def start(self, mode: str) -> None:
        self.mode = mode
        self.simulation_cm = simulated_cuda()
        self.simulation = self.simulation_cm.__enter__()
        cgguard.install(cgguard.Config(mode=mode, log_file=os.devnull))  # type: ignore[arg-type]
        self.violations_cm = capture_violations()
        self.events = self.violations_cm.__enter__()
        self.workers = [Worker() for _ in range(THREADS)]
        for worker in self.workers:
            worker.ident = worker.run(lambda: __import__("threading").get_ident())
        self.enabled = True
        self.expected_events: list[str] = []

    def expected_rules(self, worker: Worker) -> list[str]:
        rules = [] if self.enabled else ["capture_disabled"]
        if worker.captures:
            rules.append("nested_capture")
        return rules

    @rule(w=st.integers(0, THREADS - 1))
    def begin(self, w: int) -> None:
        worker = self.workers[w]
        rules = self.expected_rules(worker)

        def attempt() -> Capture:
            capture = Capture(torch.cuda.CUDAGraph(), torch.cuda.Stream())
            torch.cuda.set_stream(capture.stream)
            capture.graph.capture_begin(capture_error_mode=MODE)
            return capture

        result = worker.run(attempt)
        self.expected_events += rules
        if rules and self.mode == "raise":
            assert isinstance(result, cgguard.CaptureViolation), result
            assert result.event["rule"] == rules[0]
        else:
            assert isinstance(result, Capture), result
            worker.captures.append(result)

    @precondition(lambda self: any(w.captures for w in self.workers))
    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        busy = [w for w in self.workers if w.captures]
        worker = data.draw(st.sampled_from(busy))
        capture = worker.captures.pop()

        def finish() -> None:
            torch.cuda.set_stream(capture.stream)
            capture.graph.capture_end()

        result = worker.run(finish)
        if capture.invalidated:
            assert isinstance(result, RuntimeError), result
            assert "previous error during capture" in str(result)
        else:
            assert result is None, result

    @rule()
    def disable(self) -> None:
        cgguard.set_capture_enabled(False)
        self.enabled = False

    @rule()
    def enable(self) -> None:
        cgguard.set_capture_enabled(True)
        self.enabled = True

    @rule(w=st.integers(0, THREADS - 1))
    def body_raises(self, w: int) -> None:
        worker = self.workers[w]
        rules = self.expected_rules(worker)

        def attempt() -> None:
            with torch.cuda.graph(
                torch.cuda.CUDAGraph(), stream=torch.cuda.Stream(), capture_error_mode=MODE
            ):
                raise BodyFailedError

        result = worker.run(attempt)
        self.expected_events += rules
        if rules and self.mode == "raise":
            assert isinstance(result, cgguard.CaptureViolation), result
        elif worker.captures:
            # Log mode lets it through; torch's own synchronize then fails the way CUDA does
            # and poisons this thread's open captures.
            assert isinstance(result, RuntimeError), result
            assert "operation not permitted when stream is capturing" in str(result)
            for capture in worker.captures:
                capture.invalidated = True
        else:
            assert isinstance(result, BodyFailedError), result

    @invariant()
    def views_agree(self) -> None:
        by_thread: dict[int, set[int]] = {}
        for key, (_, thread, *_) in tracker().active.items():
            by_thread.setdefault(thread.ident, set()).add(key)
        model = {w.ident: {id(c.graph) for c in w.captures} for w in self.workers if w.captures}
        assert by_thread == model
        driver = {(c.thread, c.graph_id) for c in self.simulation.active_captures()}
        expected = {(w.ident, c.graph._simcuda_id) for w in self.workers for c in w.captures}
        assert driver == expected
        assert [e["rule"] for e in self.events] == self.expected_events
        assert cgguard.is_capture_enabled() is self.enabled

    def teardown(self) -> None:
        if not hasattr(self, "workers"):
            return
        for worker in self.workers:
            while worker.captures:
                capture = worker.captures.pop()

                def finish(capture: Capture = capture) -> None:
                    torch.cuda.set_stream(capture.stream)
                    capture.graph.capture_end()

                worker.run(finish)
            worker.pool.shutdown()
        self.violations_cm.__exit__(None, None, None)
        cgguard.uninstall()
        self.simulation_cm.__exit__(None, None, None)
        _process.PROCESS.gate.flag.set(True, None)


CaptureMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCaptureMachine = CaptureMachine.TestCase
