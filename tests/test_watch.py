"""Watchers (cgguard._core.watcher): what the capture path tells them, once per capture, and the
replay hook that exists only while one of them wants replays."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import helpers
import pytest
import torch

import cgguard
from cgguard import _process
from cgguard._core.watcher import Watcher
from cgguard._rules.record import ABANDONED, ENDED, FAILED
from cgguard.testing import simulated_cuda

if TYPE_CHECKING:
    from collections.abc import Iterator

    from cgguard._rules.record import Record

pytestmark = pytest.mark.simulated

REPLAY = "torch.cuda.graphs.CUDAGraph.replay"


class Recorder(Watcher):
    """Writes down what it is told, as (what, graph id or api, detail)."""

    def __init__(self, *, replays: bool = False) -> None:
        self.wants_replays = replays
        self.told: list[tuple[str, Any, Any]] = []

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        self.told.append(("opening", id(graph), record[2]))
        return ("token", id(graph))

    def closed(self, token: Any, outcome: str, error: BaseException | None) -> None:
        self.told.append(("closed", token, (outcome, type(error).__name__ if error else None)))

    def refused(self, record: Record) -> None:
        self.told.append(("refused", record[2], None))

    def replaying(self, graph: Any) -> None:
        self.told.append(("replaying", id(graph), None))


def watch(*watchers: Watcher) -> None:
    installation = _process.PROCESS.installation
    assert installation is not None
    installation.set_watchers(watchers)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with simulated_cuda():
        cgguard.install(cgguard.Config(log_file="/dev/null"))
        seen = Recorder()
        watch(seen)
        yield seen


def test_a_capture_is_opened_then_closed_once_with_its_token(recorder: Recorder) -> None:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.zeros(2).add_(1)
    assert recorder.told == [
        ("opening", id(graph), "torch.cuda.graph"),
        ("closed", ("token", id(graph)), (ENDED, None)),
    ]


def test_a_capture_torch_refuses_to_begin_is_closed_as_failed(recorder: Recorder) -> None:
    graph = torch.cuda.CUDAGraph()
    # torch refuses a capture on the default stream (the simulation keeps that rule).
    with pytest.raises(RuntimeError, match="non-default stream"):
        graph.capture_begin()
    assert recorder.told == [
        ("opening", id(graph), "CUDAGraph.capture_begin"),
        ("closed", ("token", id(graph)), (FAILED, "SimulatedCudaError")),
    ]
    # Nothing left to tell at a later end.
    assert helpers.tracker().fanout.tokens == {}


# What a Stamped watcher's tokens start from: the clock is added to it.
OFFSET = -1000.0


class Stamped(Recorder):
    """Returns a list token: stamped at a capture's end, told of any other ending."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[list[Any]] = []

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        super().opening(graph, record, args, kwargs)
        self.tokens.append([OFFSET, id(graph)])
        return self.tokens[-1]


def test_a_list_token_is_stamped_at_an_end_and_told_of_a_failure(recorder: Recorder) -> None:
    """A capture that ended adds the clock to its list token's first item, and closed() is not
    called; one torch refuses to begin is told to closed() as failed."""
    stamped = Stamped()
    watch(stamped)
    graph = torch.cuda.CUDAGraph()
    before = time.perf_counter()
    with torch.cuda.graph(graph):
        pass
    after = time.perf_counter()
    assert [what for what, _, _ in stamped.told] == ["opening"]
    (token,) = stamped.tokens
    assert token[1] == id(graph)
    assert before + OFFSET <= token[0] <= after + OFFSET
    failing = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        failing.capture_begin()  # on the default stream: torch refuses
    assert stamped.told[-1] == ("closed", [OFFSET, id(failing)], (FAILED, "SimulatedCudaError"))


def test_a_list_token_of_a_capture_found_ended_later_is_stamped(recorder: Recorder) -> None:
    """A capture whose end cgguard could not see (a capture_end past torch's hook), found
    ended at the next capture: its list token is stamped, as at any end, and closed() is not
    called."""

    class Direct(torch.cuda.CUDAGraph):  # type: ignore[misc]
        def capture_end(self) -> None:
            super(torch.cuda.graphs.CUDAGraph, self).capture_end()  # past the hook

    stamped = Stamped()
    watch(stamped)
    graph, stream = Direct(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        graph.capture_end()
    (token,) = stamped.tokens
    assert token[0] == OFFSET  # not seen to end
    before = time.perf_counter()
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass
    assert before + OFFSET <= token[0] <= time.perf_counter() + OFFSET
    assert [what for what, _, _ in stamped.told] == ["opening", "opening"]


def test_a_list_token_that_cannot_be_stamped_is_one_warning(
    recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty list token: the stamp fails as a watcher's own failure, one warning, and the
    watchers after it are still told."""

    class Empty(Watcher):
        def opening(self, graph: Any, record: Record, args: Any, kwargs: Any) -> Any:
            return []

    watch(Empty(), recorder)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pass
    assert ("closed", ("token", id(graph)), (ENDED, None)) in recorder.told
    assert "internal error while watching a capture: IndexError" in capsys.readouterr().err


def test_a_refused_capture_is_told_as_refused_and_never_opened(recorder: Recorder) -> None:
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        with pytest.raises(cgguard.CaptureViolation), torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
    assert [what for what, _, _ in recorder.told] == ["opening", "refused", "closed"]
    assert recorder.told[1] == ("refused", "torch.cuda.graph", None)


def test_a_capture_left_open_by_an_ended_thread_is_closed_as_abandoned(
    recorder: Recorder,
) -> None:
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()

    def begin() -> None:
        with torch.cuda.stream(stream):
            # Not global: this thread's own capture would forbid the next one's synchronize.
            graph.capture_begin(capture_error_mode="thread_local")

    worker = threading.Thread(target=begin)
    worker.start()
    worker.join()
    cgguard.status()  # nothing swept yet: the sweep comes with the next capture attempt
    assert [what for what, _, _ in recorder.told] == ["opening"]
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass
    assert ("closed", ("token", id(graph)), (ABANDONED, None)) in recorder.told


def test_a_watcher_that_fails_is_one_warning_and_the_capture_goes_on(
    recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    class Broken(Watcher):
        def opening(self, graph: Any, record: Record, args: Any, kwargs: Any) -> Any:
            raise ValueError("broken watcher")

    watch(Broken(), recorder)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.zeros(2).add_(1)
    graph.replay()
    assert ("closed", ("token", id(graph)), (ENDED, None)) in recorder.told
    assert "broken watcher" in capsys.readouterr().err


class Named(Watcher):
    """Writes down, into a log it shares, what it is told under its own name."""

    def __init__(self, name: str, log: list[tuple[str, str, Any]]) -> None:
        self.name, self.log = name, log

    def opening(self, graph: Any, record: Record, args: tuple[Any, ...], kwargs: Any) -> Any:
        self.log.append((self.name, "opening", None))
        return self.name

    def closed(self, token: Any, outcome: str, error: BaseException | None) -> None:
        self.log.append((self.name, "closed", (token, outcome)))


def test_every_watcher_is_told_in_its_order_whichever_way_a_capture_ends(
    recorder: Recorder,
) -> None:
    """The first watcher, told apart from the rest, is told first, and each gets its own
    token back: at an end, at a failed begin and at an abandoned capture."""
    log: list[tuple[str, str, Any]] = []
    watch(Named("first", log), Named("second", log), Named("third", log))
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass
    failing = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        failing.capture_begin()  # on the default stream: torch refuses
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda.CUDAGraph().capture_begin(capture_error_mode="relaxed")
    cgguard.uninstall()  # the capture still under way is over for cgguard: abandoned
    names = ("first", "second", "third")
    opened = [(name, "opening", None) for name in names]
    assert log == [
        *opened,
        *[(name, "closed", (name, ENDED)) for name in names],
        *opened,
        *[(name, "closed", (name, FAILED)) for name in names],
        *opened,
        *[(name, "closed", (name, ABANDONED)) for name in names],
    ]


def test_a_capture_under_way_as_the_watchers_change_is_closed_by_those_that_opened_it(
    recorder: Recorder,
) -> None:
    """Watchers replaced mid-capture: the capture's end goes to the watchers that opened it,
    first and rest alike, and none to the new ones."""
    log: list[tuple[str, str, Any]] = []
    watch(Named("old first", log), Named("old second", log))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        watch(Named("new first", log), Named("new second", log))
    assert log == [
        ("old first", "opening", None),
        ("old second", "opening", None),
        ("old first", "closed", ("old first", ENDED)),
        ("old second", "closed", ("old second", ENDED)),
    ]


def test_replay_is_hooked_only_while_a_watcher_wants_replays(recorder: Recorder) -> None:
    real_replay = vars(torch.cuda.graphs.CUDAGraph)["replay"]
    assert REPLAY not in cgguard.status().patched
    replays = Recorder(replays=True)
    watch(recorder, replays)
    assert REPLAY in cgguard.status().patched
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.zeros(2).add_(1)
    graph.replay()
    graph.replay()
    assert [t for t in replays.told if t[0] == "replaying"] == [("replaying", id(graph), None)] * 2
    assert not any(what == "replaying" for what, _, _ in recorder.told)
    watch(recorder)
    assert vars(torch.cuda.graphs.CUDAGraph)["replay"] is real_replay
    cgguard.uninstall()
    assert vars(torch.cuda.graphs.CUDAGraph)["replay"] is real_replay


def test_a_watcher_refuses_a_replay_by_raising_a_violation(recorder: Recorder) -> None:
    class Refuses(Watcher):
        wants_replays = True

        def replaying(self, graph: Any) -> None:
            raise cgguard.CaptureViolation("refused replay")

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.zeros(2).add_(1)
    watch(Refuses())
    sim_replays = _replays_of(graph)
    with pytest.raises(cgguard.CaptureViolation, match="refused replay"):
        graph.replay()
    assert _replays_of(graph) == sim_replays  # torch's replay never ran


def test_replays_are_watched_by_a_watcher_set_before_torch_was_patched() -> None:
    """Watchers chosen by install() before torch's hooks exist reach the tracker made later."""
    cgguard.uninstall()
    replays = Recorder(replays=True)
    with simulated_cuda():
        cgguard.install(cgguard.Config(log_file="/dev/null"))
        installation = _process.PROCESS.installation
        assert installation is not None
        tracker = installation.tracker
        installation.tracker = None  # as before torch's import
        installation.set_watchers((replays,))
        installation.tracker = tracker
        assert REPLAY not in cgguard.status().patched
        from cgguard._core.patches import patch_device_sync

        patch_device_sync(installation)  # what patch_torch ends with
        assert REPLAY in cgguard.status().patched


def _replays_of(graph: Any) -> int:
    from cgguard.testing import _simcuda

    sim = _simcuda._ACTIVE
    assert sim is not None
    return sum(
        1 for call in sim.calls if call.name == "replay" and call.args == (graph._simcuda_id,)
    )
