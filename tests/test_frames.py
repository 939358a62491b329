"""cgguard._support.frames: stack snapshots, rendered to the user's frames, and frames as text.

Snapshots are taken in a sample module written for each test, on a thread started by
``_thread`` so that no frame lies below the sample's ``main``: the rendered stack is known whole.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import gc
import importlib.util
import inspect
import os
from pathlib import Path
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

import pytest
from helpers import SourceFile

import cgguard
from cgguard._support import frames as _frames

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import ModuleType

    from cgguard._support.frames import FrameInfo, Snapshot
    from tests.conftest import Runtime

SAMPLE = """\
import contextlib
import sys
import weakref

import cgguard._support.frames as frames


def main(target, out, done):
    try:
        out.append(target())
    finally:
        done.release()


def outer():
    return inner()


def inner():
    return frames.snapshot(0)


def outer_of_skipping():
    return skipping()


def skipping():
    return frames.snapshot(1)


def moved_on():
    early = take()
    late = take()
    return early, late


def take():
    return frames.snapshot(0)


def deep(n):
    if n:
        return deep(n - 1)
    return frames.snapshot(0)


def through(hidden):
    return hidden(inner)


class Tensor:
    pass


def holding():
    tensor = Tensor()
    return frames.snapshot(0), weakref.ref(tensor)


class Entering:
    def __enter__(self):
        self.kept = frames.with_stack(sys._getframe(1))
        return self

    def __exit__(self, *exc):
        return None


def with_statement():
    with Entering() as entered:
        return entered.kept, frames.resolve(entered.kept)


def enter_by_hand():
    return Entering().__enter__().kept


def generator_with():
    with Entering() as entered:
        yield entered.kept


def first_of_generator():
    return next(generator_with())


def through_exit_stack():
    with contextlib.ExitStack() as stack:
        return stack.enter_context(Entering()).kept


def through_context(manager):
    with manager() as kept:
        return kept
"""
SAMPLE_LINES = SAMPLE.splitlines()


class Sample:
    """The sample module, loaded from a file, and the rendered frames its lines must give."""

    def __init__(self, path: Path) -> None:
        path.write_text(SAMPLE)
        self.file = str(path)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None
        assert spec.loader is not None
        self.module: ModuleType = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.module)

    def frame(self, code: str, function: str) -> FrameInfo:
        """The frame for the sample line that reads ``code``, first of its kind in ``function``."""
        (start,) = [
            n for n, text in enumerate(SAMPLE_LINES, 1) if text.startswith(f"def {function}(")
        ]
        line = next(
            n for n, text in enumerate(SAMPLE_LINES, 1) if n > start and text.strip() == code
        )
        return {"file": self.file, "line": line, "function": function, "code": code}

    def main_frame(self) -> FrameInfo:
        return self.frame("out.append(target())", "main")

    def run_bare(self, target: Callable[[], Any]) -> Any:
        """``target()``'s result, called by the sample's main on a thread with no other frame."""
        out: list[Any] = []
        done = _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(self.module.main, (target, out, done))
        assert done.acquire(timeout=30), "the sample thread hung"
        assert len(out) == 1, "the sample target failed"
        return out[0]


@pytest.fixture
def sample(tmp_path: Path) -> Sample:
    return Sample(tmp_path / "frames_sample.py")


def compiled_in(filename: str, source: str, name: str) -> Callable[..., Any]:
    """Function ``name`` of ``source``, compiled as though it lived in ``filename``."""
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - fixed test source
    return namespace[name]  # type: ignore[no-any-return]


HIDDEN_CALLER = "def hidden(call):\n    return call()\n"


def test_render_caller_frames_outermost_first(sample: Sample) -> None:
    """snapshot(0) renders the caller and its callers, outermost first, with their source lines."""
    stack: Snapshot = sample.run_bare(sample.module.outer)
    expected = [
        sample.main_frame(),
        sample.frame("return inner()", "outer"),
        sample.frame("return frames.snapshot(0)", "inner"),
    ]
    assert expected == _frames.render(stack)


def test_snapshot_depth_skips_callers(sample: Sample) -> None:
    """snapshot(1) starts one frame above its caller."""
    stack: Snapshot = sample.run_bare(sample.module.outer_of_skipping)
    expected = [sample.main_frame(), sample.frame("return skipping()", "outer_of_skipping")]
    assert expected == _frames.render(stack)


def test_line_is_the_line_at_snapshot_time(sample: Sample) -> None:
    """Each frame keeps the line it was on when snapshotted, after it moved on and returned."""
    early, late = sample.run_bare(sample.module.moved_on)
    expected_early = [
        sample.main_frame(),
        sample.frame("early = take()", "moved_on"),
        sample.frame("return frames.snapshot(0)", "take"),
    ]
    expected_late = [
        sample.main_frame(),
        sample.frame("late = take()", "moved_on"),
        sample.frame("return frames.snapshot(0)", "take"),
    ]
    assert (expected_early, expected_late) == (_frames.render(early), _frames.render(late))


def test_snapshot_keeps_no_locals_alive(sample: Sample) -> None:
    """A snapshot holds no frame, so a snapshotted function's locals are freed when it returns."""
    stack, tensor = sample.run_bare(sample.module.holding)
    gc.collect()
    assert tensor() is None
    expected = [
        sample.main_frame(),
        sample.frame("return frames.snapshot(0), weakref.ref(tensor)", "holding"),
    ]
    assert expected == _frames.render(stack)


def _package_dir(name: str) -> str:
    if name == "cgguard":
        return os.path.dirname(_frames.__file__)
    path = importlib.import_module(name).__file__
    assert path is not None
    return os.path.dirname(path)


@pytest.mark.parametrize("package", ["cgguard", "torch", "wrapt"])
def test_render_drops_frames_of_hidden_packages(sample: Sample, package: str) -> None:
    """Frames whose file lies in cgguard's, torch's or wrapt's folder are left out."""
    hidden = compiled_in(os.path.join(_package_dir(package), "fake.py"), HIDDEN_CALLER, "hidden")
    stack: Snapshot = sample.run_bare(functools.partial(sample.module.through, hidden))
    expected = [
        sample.main_frame(),
        sample.frame("return hidden(inner)", "through"),
        sample.frame("return frames.snapshot(0)", "inner"),
    ]
    assert expected == _frames.render(stack)


def test_render_keeps_frames_of_a_folder_named_like_a_hidden_one(sample: Sample) -> None:
    """A folder whose name only starts like torch's (torch_extra) is not hidden."""
    filename = os.path.join(_package_dir("torch") + "_extra", "fake.py")
    hidden = compiled_in(filename, HIDDEN_CALLER, "hidden")
    stack: Snapshot = sample.run_bare(functools.partial(sample.module.through, hidden))
    expected: list[FrameInfo] = [
        sample.main_frame(),
        sample.frame("return hidden(inner)", "through"),
        {"file": filename, "line": 2, "function": "hidden", "code": None},
        sample.frame("return frames.snapshot(0)", "inner"),
    ]
    assert expected == _frames.render(stack)


def test_render_source_unavailable_gives_code_none(sample: Sample) -> None:
    """A frame whose source cannot be read (compiled from a string) renders with code None."""
    probe = compiled_in("<string>", HIDDEN_CALLER, "hidden")
    stack: Snapshot = sample.run_bare(functools.partial(probe, sample.module.inner))
    expected: list[FrameInfo] = [
        sample.main_frame(),
        {"file": "<string>", "line": 2, "function": "hidden", "code": None},
        sample.frame("return frames.snapshot(0)", "inner"),
    ]
    assert expected == _frames.render(stack)


def test_snapshot_depth_is_bounded(sample: Sample) -> None:
    """Deep recursion records only the innermost MAX_DEPTH frames, and how many it left out."""
    stack: Snapshot = sample.run_bare(functools.partial(sample.module.deep, 3 * _frames.MAX_DEPTH))
    # deep(384) down to deep(0) is 385 frames, under main: 386, of which 128 are kept.
    left_out = 3 * _frames.MAX_DEPTH + 2 - _frames.MAX_DEPTH
    assert (len(stack), stack[-2:]) == (2 * _frames.MAX_DEPTH + 2, (left_out, -1))
    omitted: FrameInfo = {
        "file": "<frames not kept>",
        "line": 0,
        "function": "258 outer frames",
        "code": None,
    }
    expected = [
        omitted,
        *[sample.frame("return deep(n - 1)", "deep")] * (_frames.MAX_DEPTH - 1),
        sample.frame("return frames.snapshot(0)", "deep"),
    ]
    assert expected == _frames.render(stack)
    assert _frames.format_frames([omitted]) == "  ... 258 outer frames not kept"


def test_a_stack_within_the_depth_says_nothing_left_out(sample: Sample) -> None:
    """A stack of exactly MAX_DEPTH frames ends with its outermost frame, nothing counted."""
    # deep(n) for n = MAX_DEPTH - 2 .. 0 is MAX_DEPTH - 1 frames, under main: MAX_DEPTH.
    depth = _frames.MAX_DEPTH - 2
    stack: Snapshot = sample.run_bare(functools.partial(sample.module.deep, depth))
    assert len(stack) == 2 * _frames.MAX_DEPTH
    assert not any(isinstance(stack[i], int) for i in range(0, len(stack), 2))


FRAMES: list[FrameInfo] = [
    {"file": "/app/serve.py", "line": 12, "function": "<module>", "code": "main()"},
    {"file": "<string>", "line": 1, "function": "generated", "code": None},
    {"file": "/app/model.py", "line": 40, "function": "warm_up", "code": "with graph(g):"},
]


def test_where_names_innermost_frame() -> None:
    """where() is the innermost frame as file:line (in function)."""
    assert _frames.where(FRAMES) == "/app/model.py:40 (in warm_up)"


def test_where_without_frames() -> None:
    """where() of no frames is <unknown>."""
    assert _frames.where([]) == "<unknown>"


def test_format_frames_like_a_traceback() -> None:
    """format_frames() writes Python's traceback lines, skipping the code line when it is None."""
    expected = (
        '  File "/app/serve.py", line 12, in <module>\n'
        "    main()\n"
        '  File "<string>", line 1, in generated\n'
        '  File "/app/model.py", line 40, in warm_up\n'
        "    with graph(g):"
    )
    assert expected == _frames.format_frames(FRAMES)


def test_format_frames_escapes_what_a_terminal_acts_on() -> None:
    """A file, function or source line made by exec or compile prints its control characters
    and bidi overrides escaped, as repr() writes them, each frame on its own lines."""
    hostile: list[FrameInfo] = [
        {"file": "\x1b]0;owned\x07gen.py", "line": 3, "function": "f\u202eeno", "code": None},
        {"file": "<x>", "line": 1, "function": "g", "code": 'x = 1\x1b[2J\n  File "fake.py"'},
    ]
    assert _frames.format_frames(hostile) == (
        '  File "\\x1b]0;owned\\x07gen.py", line 3, in f\\u202eeno\n'
        '  File "<x>", line 1, in g\n'
        '    x = 1\\x1b[2J\\n  File "fake.py"'
    )


def test_format_frames_empty() -> None:
    """format_frames() of no frames is the empty string."""
    assert _frames.format_frames([]) == ""


def test_with_stack_keeps_the_frame_running_a_with_statement(sample: Sample) -> None:
    """Entered by a ``with`` statement, the stack is that frame, walked exactly while it runs."""
    kept, walked = sample.run_bare(sample.module.with_statement)
    assert (type(kept[0]), kept[0].f_code) == (FrameType, sample.module.with_statement.__code__)
    assert _frames.render(walked) == [
        sample.main_frame(),
        sample.frame("with Entering() as entered:", "with_statement"),
    ]


def test_with_stack_walks_an_enter_called_by_hand_at_once(sample: Sample) -> None:
    """``__enter__()`` called by a function that moves on is walked then, not kept live."""
    kept = sample.run_bare(sample.module.enter_by_hand)
    assert not isinstance(kept[0], FrameType)
    assert _frames.render(kept) == [
        sample.main_frame(),
        sample.frame("return Entering().__enter__().kept", "enter_by_hand"),
    ]


def test_with_stack_walks_a_generator_at_once(sample: Sample) -> None:
    """A ``with`` in a generator is walked then: suspended, the generator has no callers."""
    kept = sample.run_bare(sample.module.first_of_generator)
    assert not isinstance(kept[0], FrameType)
    assert _frames.render(kept) == [
        sample.main_frame(),
        sample.frame("return next(generator_with())", "first_of_generator"),
        sample.frame("with Entering() as entered:", "generator_with"),
    ]


def test_render_ends_an_exit_stack_entry_at_the_user_s_line(sample: Sample) -> None:
    """A context entered by ExitStack.enter_context is shown at that call: contextlib is hidden."""
    kept = sample.run_bare(sample.module.through_exit_stack)
    assert _frames.render(_frames.resolve(kept)) == [
        sample.main_frame(),
        sample.frame("return stack.enter_context(Entering()).kept", "through_exit_stack"),
    ]


HIDDEN_MANAGER = """\
import contextlib

import cgguard._support.frames as frames


@contextlib.contextmanager
def manager():
    yield frames.snapshot(0)
"""


def test_render_ends_a_hidden_context_manager_at_the_user_s_with(sample: Sample) -> None:
    """A @contextmanager of a hidden package is shown at the user's ``with``, not in contextlib."""
    filename = os.path.join(_package_dir("torch"), "fake.py")
    manager = compiled_in(filename, HIDDEN_MANAGER, "manager")
    stack: Snapshot = sample.run_bare(functools.partial(sample.module.through_context, manager))
    assert _frames.render(stack) == [
        sample.main_frame(),
        sample.frame("with manager() as kept:", "through_context"),
    ]


CALLER = "def call(function):\n    return function()\n"


def test_started_by_cuts_the_runner_that_called_the_program(sample: Sample, tmp_path: Path) -> None:
    """Within started_by(), a stack starts below the runner's frames that dispatched to it."""
    runner, dispatcher = tmp_path / "runner", tmp_path / "dispatcher"
    dispatch = compiled_in(str(dispatcher / "hooks.py"), CALLER, "call")
    run_test = compiled_in(str(runner / "python.py"), CALLER, "call")
    helper = compiled_in(str(runner / "raises.py"), HIDDEN_CALLER, "hidden")
    # main -> the dispatcher -> the runner -> the test (through) -> a runner helper -> inner
    test = functools.partial(sample.module.through, helper)
    stack: Snapshot = sample.run_bare(
        functools.partial(dispatch, functools.partial(run_test, test))
    )
    below = [
        sample.frame("return hidden(inner)", "through"),
        # A runner's helper the test calls itself, not by way of the dispatcher, stays.
        {"file": str(runner / "raises.py"), "line": 2, "function": "hidden", "code": None},
        sample.frame("return frames.snapshot(0)", "inner"),
    ]
    whole = [
        sample.main_frame(),
        {"file": str(dispatcher / "hooks.py"), "line": 2, "function": "call", "code": None},
        {"file": str(runner / "python.py"), "line": 2, "function": "call", "code": None},
        *below,
    ]
    with _frames.started_by([str(runner), str(dispatcher)], [str(dispatcher)]):
        cut = _frames.render(stack)
    assert (below, whole) == (cut, _frames.render(stack))


THIS_FILE = SourceFile(__file__)


def test_capture_entered_by_exit_stack_is_reported_at_enter_context(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A capture refused in ExitStack.enter_context names that line last, not contextlib's."""
    import torch

    cgguard.install(cgguard.Config(log_format="json"))
    with contextlib.ExitStack() as stack, cgguard.capture_disabled():
        with pytest.raises(cgguard.CaptureDisabledError) as raised:
            stack.enter_context(torch.cuda.graph(torch.cuda.CUDAGraph()))  # @exit-stack
    test = "test_capture_entered_by_exit_stack_is_reported_at_enter_context"
    assert raised.value.event["stack"][-1] == THIS_FILE.frame("@exit-stack", test)


@contextlib.contextmanager
def capturing(graph: Any) -> Iterator[None]:
    """A library's context manager around torch.cuda.graph."""
    import torch

    with torch.cuda.graph(graph):  # @generator-captures
        yield


def test_capture_in_a_context_manager_is_reported_without_contextlib(
    runtime: Runtime, events: list[dict[str, Any]]
) -> None:
    """A capture begun in a @contextmanager: the user's ``with``, then the generator's line."""
    import torch

    cgguard.install(cgguard.Config(log_format="json"))
    with cgguard.capture_disabled(), pytest.raises(cgguard.CaptureDisabledError) as raised:
        with capturing(torch.cuda.CUDAGraph()):  # @enters-capturing
            pass
    test = "test_capture_in_a_context_manager_is_reported_without_contextlib"
    assert raised.value.event["stack"][-2:] == [
        THIS_FILE.frame("@enters-capturing", test),
        THIS_FILE.frame("@generator-captures", "capturing"),
    ]


# --- the line of an instruction -------------------------------------------------------------

# A generated module: each ``mark()`` line records (code, lasti, f_lineno) of the frame that
# called it, among loops, handlers, a ``with``, continued lines, a nested function and a
# generator, and past line 1,000 of one long function (inductor's output code is thousands).
GENERATED_HEAD = """\
import contextlib
import sys

seen = []


def mark():
    caller = sys._getframe(1)
    seen.append((caller.f_code, caller.f_lasti, caller.f_lineno))


def generated(n):
    mark()
    for i in range(n):
        mark()
        if i % 2:
            mark()
    try:
        mark()
        raise ValueError(n)
    except ValueError:
        mark()
    finally:
        mark()
    total = (
        n
        + 1
    )
    mark()
    with contextlib.nullcontext():
        mark()

    def nested():
        mark()

    nested()
    gen = (mark() for _ in range(2))
    list(gen)
    # a comment, then blank lines

"""
GENERATED_FILLER = "    total += 1\n    mark()\n"
GENERATED_TAIL = "    return total\n"


def generated_module(filler: int) -> tuple[dict[str, Any], str]:
    """The generated module run once (its namespace), and its source."""
    source = GENERATED_HEAD.rstrip("\n") + "\n" + GENERATED_FILLER * filler + GENERATED_TAIL
    namespace: dict[str, Any] = {}
    exec(compile(source, "<generated>", "exec"), namespace)  # noqa: S102 - fixed test source
    namespace["generated"](3)
    return namespace, source


def walked_lines(code: CodeType) -> dict[int, int]:
    """Each instruction offset's line from one walk of co_lines(): that of the first range
    holding it that has a line. An offset without one has the function's first line."""
    found: dict[int, int] = {}
    for start, end, line in code.co_lines():
        if line is not None:
            for offset in range(start, end):
                found.setdefault(offset, line)
    return found


def code_objects(code: CodeType) -> Iterator[CodeType]:
    """``code`` and every code object nested in it."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from code_objects(constant)


def test_line_of_is_the_line_python_reports_at_each_mark() -> None:
    """Each marked instruction's line, in a generated function of over 1,000 lines, is the
    frame's own f_lineno and the line its source shows: loops, handlers, a with, a generator."""
    namespace, source = generated_module(600)
    lines = source.splitlines()
    m = [n for n, text in enumerate(lines, 1) if text.strip() == "mark()"]
    (generator,) = [n for n, text in enumerate(lines, 1) if text.strip().startswith("gen = (")]
    # generated(3): the loop's mark three times, the odd one once; the generator's twice.
    expected = [m[0], m[1], m[1], m[2], m[1], *m[3:9], generator, generator, *m[9:]]
    seen = namespace["seen"]
    assert len(m) > 600
    assert [lineno for _, _, lineno in seen] == expected
    assert [_frames._line_of(code, lasti) for code, lasti, _ in seen] == expected


def test_line_of_agrees_with_a_walk_of_co_lines_at_every_offset() -> None:
    """At every offset of every code object of a standard-library module and the generated
    function, -1 and past the end included, the line is the one a walk of co_lines() finds."""
    namespace, _ = generated_module(600)
    module = compile(Path(inspect.__file__).read_text(), inspect.__file__, "exec")
    codes = [*code_objects(module), *code_objects(namespace["generated"].__code__)]
    found, expected = [], []
    for code in codes:
        walked = walked_lines(code)
        for lasti in range(-1, len(code.co_code) + 4):
            found.append((code, lasti, _frames._line_of(code, lasti)))
            expected.append((code, lasti, walked.get(lasti, code.co_firstlineno)))
    assert len(codes) > 100
    assert found == expected


def test_line_of_without_an_instruction_is_the_first_line() -> None:
    """lasti -1 (a frame not started), or past the last instruction: the function's first line."""
    namespace, _ = generated_module(0)
    code = namespace["generated"].__code__
    lines = [_frames._line_of(code, lasti) for lasti in (-1, len(code.co_code), 10**9)]
    assert lines == [code.co_firstlineno] * 3


class CountedCode:
    """A code object's stand-in that counts the ranges its co_lines() yields."""

    def __init__(self, code: CodeType) -> None:
        self.code = code
        self.co_firstlineno = code.co_firstlineno
        self.yielded = 0

    def co_lines(self) -> Iterator[tuple[int, int, int | None]]:
        for item in self.code.co_lines():
            self.yielded += 1
            yield item


def test_line_of_walks_co_lines_once_per_code_object() -> None:
    """Many lines looked up in one long function walk its co_lines() once in all, not once
    per look-up: a violation per line of generated code costs the same at every line."""
    namespace, _ = generated_module(2000)
    code = namespace["generated"].__code__
    counted = CountedCode(code)
    offsets = range(0, len(code.co_code), 7)
    lines = [_frames._line_of(counted, lasti) for lasti in offsets]  # type: ignore[arg-type]
    walked = walked_lines(code)
    assert (counted.yielded, lines) == (
        len(list(code.co_lines())),
        [walked.get(lasti, code.co_firstlineno) for lasti in offsets],
    )


def test_line_tables_are_bounded_and_go_with_their_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Code made at run time keeps coming: the tables start again past their bound; each holds
    its code object weakly, and goes with it, so that an id() is never another code's table's
    while the code itself is not kept alive by it."""
    monkeypatch.setattr(_frames, "_CACHE_MAX", 8)
    monkeypatch.setattr(_frames, "_lines", {})
    # Each code's last instruction, its return, is on its last line: line n + 1.
    codes = [compile(f"x = {n}\n" * (n + 1), f"<made {n}>", "exec") for n in range(20)]
    lines = [_frames._line_of(code, len(code.co_code) - 2) for code in codes]
    assert lines == [n + 1 for n in range(20)]
    assert len(_frames._lines) <= 8
    assert all(entry[0]() is codes[ident] for ident, entry in _by_code(codes).items())
    kept = len(_frames._lines)
    del codes[-1]
    gc.collect()
    assert len(_frames._lines) == kept - 1


def _by_code(codes: list[CodeType]) -> dict[int, tuple[object, ...]]:
    """The tables standing, by the index of their code in ``codes``."""
    index = {id(code): n for n, code in enumerate(codes)}
    return {index[key]: entry for key, entry in _frames._lines.items()}
