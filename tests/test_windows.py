"""Capture windows: a framework's capture function, or its state, marks when captures belong.

Tested against a small framework written into a temporary folder and imported after install,
as a framework's model runner is imported after cgguard's activation.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest
from helpers import DEFAULT_CONFIGURATION, SourceFile, clean_environ

import cgguard
import cgguard._gate.windows
from cgguard._gate.flags import Windows
from cgguard._gate.windows import WindowInfo, WindowRegistry

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path
    from types import ModuleType

pytestmark = pytest.mark.simulated

RUNNER = """\
import contextvars
import threading

import torch

FLAG = False
CAPTURING = contextvars.ContextVar("capturing", default=None)
LOCAL = threading.local()


def capture():
    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # @capture
        pass


def helper():
    capture()  # @helper


class Runner:
    @torch.inference_mode()
    def capture_model(self, then=None):
        capture()  # @inside
        helper()
        if then is not None:
            then()
        return torch.is_inference_mode_enabled()


    @property
    def capturing(self):
        return False


class Slotted:
    __slots__ = ("active",)


EVENT = threading.Event()


class EncoderRunner(Runner):
    # Overrides the window without calling super(): a window entry of its own.
    @torch.inference_mode()
    def capture_model(self, then=None):
        capture()  # @encoder
        return "encoder"


class Failing(Runner):
    def capture_model(self, then=None):
        raise RuntimeError("out of memory")


def start_server(runner=None):
    return (runner or Runner()).capture_model()  # @window-returns


def capture_while(flag):
    capture()  # @seen-inside
"""

PLUGIN = """\
from fw.runner import capture


def serve():
    capture()  # @plugin
"""

WINDOW = "fw.runner:Runner.capture_model"
ENCODER = "fw.runner:EncoderRunner.capture_model"
SYNTAX = (
    "module:qualname, naming a function or method (a capture window while it runs), or a "
    "module attribute, a ContextVar or a threading.local's attribute (module:local.attr), "
    "true while captures belong"
)
DISABLED = (
    "CUDA graph capturing detected at an inappropriate time. This operation is currently disabled. "
)


@pytest.fixture
def fw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The framework package on sys.path, not imported yet; forgotten after the test."""
    package = tmp_path / "fw"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runner.py").write_text(RUNNER)
    (package / "plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [n for n in sys.modules if n.split(".")[0] == "fw"]:
        del sys.modules[name]


@pytest.fixture
def cuda() -> Iterator[None]:
    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        yield


def modules() -> tuple[ModuleType, ModuleType]:
    import fw.plugin  # type: ignore[import-not-found]
    import fw.runner  # type: ignore[import-not-found]

    return fw.runner, fw.plugin


def refusal(call: Any, *args: Any) -> cgguard.CaptureDisabledError:
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        call(*args)
    return raised.value


def test_a_capture_after_the_window_returned_names_where_it_closed(fw: Path, cuda: None) -> None:
    """Before the window first ran, inside it and in what it calls, captures pass; after it
    returned, a plugin's capture is refused, blamed on the window function's return."""
    cgguard.install(cgguard.Config(windows=WINDOW))
    runner, plugin = modules()  # imported after install: the window goes on at import
    plugin.serve()  # before the window first ran
    assert runner.start_server() is True  # @test-starts
    error = refusal(plugin.serve)
    source, plugged, here = (
        SourceFile(fw / "runner.py"),
        SourceFile(fw / "plugin.py"),
        SourceFile(__file__),
    )
    capture_at = f"{source.path}:{source.line_of('@capture')} (in capture)"
    closed_at = f"{source.path}:{source.line_of('@window-returns')} (in start_server)"
    expected = (
        f"{DISABLED}torch.cuda.graph at {capture_at} began a capture; capture was disabled at "
        f"{closed_at}, where the capture window {WINDOW} returned.",
        [
            here.frame(
                "@test-starts", "test_a_capture_after_the_window_returned_names_where_it_closed"
            ),
            source.frame("@window-returns", "start_server"),
        ],
        [
            plugged.frame("@plugin", "serve"),
            source.frame("@capture", "capture"),
        ],
    )
    event = error.event
    assert expected == (str(error), event["disabled_stack"][-2:], event["stack"][-2:])


def test_the_decorators_wrapper_is_the_window(fw: Path) -> None:
    """The attribute as found, @torch.inference_mode()'s wrapper, is wrapped, and put back."""
    runner, _ = modules()
    found = vars(runner.Runner)["capture_model"]
    cgguard.install(cgguard.Config(windows=WINDOW))
    wrapped = vars(runner.Runner)["capture_model"]
    kept = (wrapped is not found, wrapped.__wrapped__ is found, found.__wrapped__.__name__)
    cgguard.uninstall()
    assert (
        *kept,
        vars(runner.Runner)["capture_model"] is found,
    ) == (True, True, "capture_model", True)


def test_an_exempted_capture_outside_the_window_passes_counted(fw: Path, cuda: None) -> None:
    """A capture its framework means to make outside the window goes ahead, counted as
    exempted; no violation."""
    cgguard.install(cgguard.Config(windows=WINDOW, exempt="capture_disabled=fw.plugin:serve"))
    runner, plugin = modules()
    runner.start_server()
    plugin.serve()
    status = cgguard.status()
    assert (status.violations, status.exempted) == ({}, {"capture_disabled": 1})


def test_a_subclass_overriding_the_window_is_a_window_of_its_own(fw: Path, cuda: None) -> None:
    """An override that never calls super() opens no window unless declared; declared, its
    captures pass and its return is where capture was disabled."""
    cgguard.install(cgguard.Config(windows=WINDOW))
    runner, plugin = modules()
    runner.start_server()
    undeclared = refusal(runner.EncoderRunner().capture_model)
    cgguard.install(cgguard.Config(windows=(WINDOW, ENCODER)))
    runner.start_server()
    declared = runner.start_server(runner.EncoderRunner())
    error = refusal(plugin.serve)
    source = SourceFile(fw / "runner.py")
    expected = (
        source.frame("@encoder", "capture_model"),
        "encoder",
        f"capture was disabled at {source.path}:{source.line_of('@window-returns')} "
        f"(in start_server), where the capture window {ENCODER} returned.",
    )
    assert expected == (
        undeclared.event["stack"][-2],
        declared,
        str(error).partition("began a capture; ")[2],
    )


def test_a_window_that_raises_closes(fw: Path, cuda: None) -> None:
    """A window function that raises closes the window as its return would."""
    cgguard.install(cgguard.Config(windows=WINDOW))
    runner, plugin = modules()
    runner.start_server()  # entered once: the window is watched
    with pytest.raises(RuntimeError, match="out of memory"):
        runner.start_server(runner.Failing())  # inherits nothing: its own method raises
    error = refusal(plugin.serve)
    source = SourceFile(fw / "runner.py")
    assert error.event["disabled_stack"][-1] == source.frame("@window-returns", "start_server")


def test_another_thread_inside_the_window_opens_it_for_every_thread(fw: Path, cuda: None) -> None:
    """Process-wide, as vLLM's flag: while any thread runs the window, a capture on another
    thread passes; once the last call returns, it is refused."""
    cgguard.install(cgguard.Config(windows=WINDOW))
    runner, plugin = modules()
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        leave.wait(30)

    thread = threading.Thread(target=runner.Runner().capture_model, args=(hold,))
    thread.start()
    inside.wait(30)
    status = cgguard.status()
    plugin.serve()  # the window is open on the other thread
    leave.set()
    thread.join(30)
    refusal(plugin.serve)
    assert (WindowInfo(WINDOW, "function", "open"),) == status.windows


def test_a_module_flag_window_blames_the_last_capture_seen_inside(fw: Path, cuda: None) -> None:
    """A module attribute: entered at the first capture seen while true; a capture seen while
    it is false after that is refused, blamed on the last capture seen inside."""
    cgguard.install(cgguard.Config(windows="fw.runner:FLAG"))
    runner, plugin = modules()
    plugin.serve()  # false, never seen true: allowed
    runner.FLAG = True
    runner.capture_while(True)
    plugin.serve()
    runner.FLAG = False
    error = refusal(plugin.serve)
    source = SourceFile(fw / "runner.py")
    expected = (
        f"capture was disabled at {source.path}:{source.line_of('@capture')} (in capture), the "
        "last capture seen inside the capture window fw.runner:FLAG.",
        [source.frame("@seen-inside", "capture_while"), source.frame("@capture", "capture")],
    )
    assert expected == (
        str(error).partition("began a capture; ")[2],
        error.event["disabled_stack"][-2:],
    )


def test_a_contextvar_window(fw: Path, cuda: None) -> None:
    """A ContextVar is a window while its value is true, read on the capturing thread."""
    cgguard.install(cgguard.Config(windows="fw.runner:CAPTURING"))
    runner, plugin = modules()
    token = runner.CAPTURING.set(object())
    plugin.serve()
    runner.CAPTURING.reset(token)
    error = refusal(plugin.serve)
    expected = "the last capture seen inside the capture window fw.runner:CAPTURING."
    assert (expected, (WindowInfo("fw.runner:CAPTURING", "ContextVar", "watched"),)) == (
        str(error).rpartition(", ")[2],
        cgguard.status().windows,
    )


def test_a_thread_local_window_is_read_on_the_capturing_thread(fw: Path, cuda: None) -> None:
    """``module:local.attr`` of a threading.local: true on one thread says nothing of another."""
    cgguard.install(cgguard.Config(windows="fw.runner:LOCAL.capturing"))
    runner, plugin = modules()
    runner.LOCAL.capturing = True
    plugin.serve()
    refused: list[BaseException] = []

    def elsewhere() -> None:
        try:
            plugin.serve()
        except cgguard.CaptureDisabledError as exc:
            refused.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(30)
    assert [cgguard.CaptureDisabledError] == [type(e) for e in refused]


def test_bad_entries_warn_once_and_the_others_apply(
    fw: Path, cuda: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry of the wrong form, and one naming nothing the module has or a class, each get
    one warning line naming it and the accepted form; the good entry still applies."""
    environ = {
        "CGGUARD_WINDOW": f"not a window, fw.runner:Missing, fw.runner:Runner, {WINDOW}",
        "CGGUARD_LOG_FILE": os.devnull,
    }
    cgguard.install(cgguard.Config.from_environ(environ))
    cgguard.install(cgguard.Config.from_environ(environ))  # said once, not twice
    runner, plugin = modules()
    runner.start_server()
    refusal(plugin.serve)
    assert capsys.readouterr().err == (
        f"cgguard: ignoring the capture window 'not a window' in CGGUARD_WINDOW: an entry is "
        f"{SYNTAX}\n"
        f"cgguard: ignoring the capture window 'fw.runner:Missing': fw.runner has no 'Missing'; "
        f"an entry is {SYNTAX}\n"
        "cgguard: ignoring the capture window 'fw.runner:Runner': it names a class; a function "
        f"window names a function or method; an entry is {SYNTAX}\n"
    )


def test_entries_no_window_can_honour_are_refused_not_taken_for_another_kind(
    fw: Path, cuda: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A property or a slot of a class, and a module attribute whose value is true whatever
    its state (an Event, a module): each refused with one warning line and shown unresolved,
    rather than watched as a predicate that is always true, which lets every capture pass."""
    entries = ("fw.runner:Runner.capturing", "fw.runner:Slotted.active", "fw.runner:EVENT")
    entries += ("fw.runner:threading", WINDOW)
    cgguard.install(cgguard.Config(windows=entries, log_file=os.devnull))
    runner, plugin = modules()
    runner.start_server()
    refusal(plugin.serve)
    lines = capsys.readouterr().err.splitlines()
    true = (
        "is true whatever its state, so the window would never close; a module attribute window "
        "names a value that is true while captures belong (a bool, a number, a container, or "
        f"None while not); an entry is {SYNTAX}"
    )
    assert (
        [
            "cgguard: ignoring the capture window 'fw.runner:Runner.capturing': it names a "
            "property of a class, a value each instance has, not one cgguard can read; an entry "
            f"is {SYNTAX}",
            "cgguard: ignoring the capture window 'fw.runner:Slotted.active': it names a "
            "member_descriptor of a class, a value each instance has, not one cgguard can read; "
            f"an entry is {SYNTAX}",
            f"cgguard: ignoring the capture window 'fw.runner:EVENT': its value, an Event, {true}",
            f"cgguard: ignoring the capture window 'fw.runner:threading': its value, a module, "
            f"{true}",
        ],
        [(None, "not resolved")] * 4 + [("function", "watched")],
    ) == (lines, [(info.kind, info.state) for info in cgguard.status().windows])


def test_status_shows_each_window_as_it_is(fw: Path, cuda: None) -> None:
    """status().windows: waiting before the import, then what each names; no followed flag."""
    entries = (WINDOW, "fw.runner:FLAG", "fw.runner:Missing")
    cgguard.install(cgguard.Config(windows=entries, vllm_bridge=False))
    before = cgguard.status().windows
    runner, _ = modules()
    seen: list[tuple[WindowInfo, ...]] = []
    runner.Runner().capture_model(lambda: seen.append(cgguard.status().windows))
    after = cgguard.status()
    assert (
        tuple(WindowInfo(e, None, "waiting for import") for e in entries),
        (
            WindowInfo(WINDOW, "function", "open"),
            WindowInfo("fw.runner:FLAG", "module attribute", "watched"),
            WindowInfo("fw.runner:Missing", None, "not resolved"),
        ),
        WindowInfo(WINDOW, "function", "watched"),
        (),
    ) == (before, seen[0], after.windows[0], after.followed)


def test_uninstall_puts_back_and_reconfiguring_swaps_the_windows(fw: Path, cuda: None) -> None:
    """install() with other windows undoes the old ones; uninstall() undoes every one and
    forgets that any was entered."""
    runner, plugin = modules()
    original = vars(runner.Runner)["capture_model"]
    cgguard.install(cgguard.Config(windows=WINDOW))
    runner.start_server()
    cgguard.install(cgguard.Config(windows=ENCODER))
    swapped = (vars(runner.Runner)["capture_model"] is original, cgguard.status().windows)
    plugin.serve()  # the new set of windows has not been entered
    cgguard.uninstall()
    assert (
        (True, (WindowInfo(ENCODER, "function", "watched"),)),
        True,
        "encoder",
        True,
    ) == (
        swapped,
        vars(runner.Runner)["capture_model"] is original,
        vars(runner.EncoderRunner)["capture_model"].__wrapped__(runner.EncoderRunner()),
        cgguard.is_capture_enabled(),
    )


def test_no_window_entered_keeps_the_capture_path_as_it_was(fw: Path) -> None:
    """Declared and not yet entered, function windows add nothing to what the capture path
    reads: no followed source at all."""
    from cgguard import _process

    cgguard.install(cgguard.Config(windows=WINDOW, vllm_bridge=False))
    modules()
    assert _process.PROCESS.gate.follows == []


def test_cgguard_info_shows_the_windows() -> None:
    """cgguard info lists each window from CGGUARD_WINDOW, and warns of a bad one."""
    from cgguard._commands.info import _configuration

    environ = {"CGGUARD_WINDOW": f"{WINDOW},fw.runner:FLAG,oops"}
    expected = [
        "  enabled        (unset)      (CGGUARD_ENABLED)",
        *DEFAULT_CONFIGURATION[:11],
        f"  window         {WINDOW} (CGGUARD_WINDOW)",
        "  window         fw.runner:FLAG (CGGUARD_WINDOW)",
        *DEFAULT_CONFIGURATION[12:],
        f"  warning: ignoring the capture window 'oops' in CGGUARD_WINDOW: an entry is {SYNTAX}",
    ]
    assert expected == _configuration(environ)


PROGRAM = """\
import cgguard
import fw.plugin
import fw.runner

fw.runner.start_server()
try:
    fw.plugin.serve()
except cgguard.CaptureDisabledError as exc:
    print(str(exc).rpartition(", ")[2])
print(cgguard.status().windows)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("how", ["--window", "CGGUARD_WINDOW"])
def test_the_option_and_the_variable_reach_the_program(fw: Path, how: str) -> None:
    """``cgguard run --window`` and CGGUARD_WINDOW declare the window in the program."""
    (fw.parent / "program.py").write_text(PROGRAM)
    options = ["--window", WINDOW] if how == "--window" else []
    changes = {"CGGUARD_WINDOW": WINDOW} if how == "CGGUARD_WINDOW" else {}
    done = subprocess.run(
        [sys.executable, "-m", "cgguard", "run", "--simulate-cuda", *options, "program.py"],
        cwd=fw.parent,
        env=clean_environ(PYTHONPATH=str(fw.parent), CGGUARD_LOG_FILE="log.jsonl", **changes),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    expected = (
        0,
        f"where the capture window {WINDOW} returned.\n"
        f"({WindowInfo(WINDOW, 'function', 'watched')!r},)\n",
    )
    assert expected == (done.returncode, done.stdout)


EARLY = """\
import cgguard

# As activation does when this module's own import of torch is the first: the window is
# declared while the module that defines it is still being executed.
cgguard.install(cgguard.Config(windows="fw.early:Runner.capture_model"))


class Runner:
    def capture_model(self):
        return "captured"
"""


def test_a_window_declared_while_its_module_is_imported_resolves_at_its_end(fw: Path) -> None:
    """Declared from inside its module's own import, the window goes on once that import has
    finished, with every name the module defines."""
    (fw / "early.py").write_text(EARLY)
    import fw.early  # type: ignore[import-not-found]

    wrapped = vars(fw.early.Runner)["capture_model"]
    assert (
        (WindowInfo("fw.early:Runner.capture_model", "function", "watched"),),
        "capture_model",
        True,
    ) == (cgguard.status().windows, wrapped.__name__, hasattr(wrapped, "__wrapped__"))


class Unreadable:
    def __bool__(self) -> bool:
        raise RuntimeError("no truth")


def test_a_window_state_that_cannot_be_read_counts_as_inside(
    fw: Path, cuda: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A predicate whose value cannot be told true or false never fails the capture: it
    counts as inside, with one warning naming the window."""
    cgguard.install(cgguard.Config(windows="fw.runner:FLAG", log_file=os.devnull))
    runner, plugin = modules()
    runner.FLAG = Unreadable()
    plugin.serve()
    plugin.serve()
    assert capsys.readouterr().err == (
        "cgguard: cannot read the capture window fw.runner:FLAG: RuntimeError('no truth')\n"
    )


# Generators and coroutines: their bodies run after the call returns, a step at a time.

STEPS = """\
import asyncio
import importlib
import contextlib

from fw.runner import capture


def generate(n):
    for i in range(n):
        capture()  # @generate
        yield i


def made(n):
    # A plain function returning a generator: its body runs once iterated.
    return generate.__wrapped__(n) if hasattr(generate, "__wrapped__") else generate(n)


async def warm_up():
    await asyncio.sleep(0)  # @warm-up-waits
    capture()
    return "warm"


async def agenerate(n):
    for i in range(n):
        await asyncio.sleep(0)
        capture()
        yield i


@contextlib.asynccontextmanager
async def opening():
    yield "body"


def cleaning(seen):
    try:
        while True:
            try:
                yield
            except ValueError as exc:
                seen.append(f"thrown {exc}")
    finally:
        capture()
        seen.append("closed")
"""

SUSPENDED = "was suspended (a yield or an await)."


@pytest.fixture
def steps(fw: Path) -> Path:
    (fw / "steps.py").write_text(STEPS)
    return fw / "steps.py"


def test_a_generator_window_is_open_while_its_body_runs_and_closed_between_steps(
    steps: Path, cuda: None
) -> None:
    """A generator function stays one, and its window is open while its body runs: a capture
    there passes; one by its caller between two steps is refused, blamed on the step that gave
    way; after its end, on its return."""
    cgguard.install(cgguard.Config(windows="fw.steps:generate"))
    import fw.steps  # type: ignore[import-not-found]

    _, plugin = modules()
    counted = fw.steps.generate(2)
    plugin.serve()  # made, not yet run: no window entered
    first = next(counted)  # @generator-steps
    between = refusal(plugin.serve)
    rest = list(counted)  # @generator-ends
    after = refusal(plugin.serve)
    here = SourceFile(__file__)
    name = "test_a_generator_window_is_open_while_its_body_runs_and_closed_between_steps"
    assert (
        True,
        0,
        (here.frame("@generator-steps", name), f"fw.steps:generate {SUSPENDED}"),
        [1],
        (here.frame("@generator-ends", name), "fw.steps:generate returned."),
    ) == (
        inspect.isgeneratorfunction(fw.steps.generate),
        first,
        (between.event["disabled_stack"][-1], str(between).rpartition("capture window ")[2]),
        rest,
        (after.event["disabled_stack"][-1], str(after).rpartition("capture window ")[2]),
    )


def test_a_generator_made_by_a_plain_window_function_runs_inside(steps: Path, cuda: None) -> None:
    """A window function that returns a generator without being a generator function: the
    generator's body runs inside the window still."""
    cgguard.install(cgguard.Config(windows="fw.steps:made"))
    import fw.steps

    _, plugin = modules()
    made = fw.steps.made(3)
    values = list(made)
    refused = refusal(plugin.serve)
    assert (values, str(refused).endswith("fw.steps:made returned.")) == ([0, 1, 2], True)


def test_a_coroutine_window_is_open_while_the_coroutine_runs(steps: Path, cuda: None) -> None:
    """An async def window stays one, and is open while its body runs: its capture after an
    await passes; another task's capture while it waits at that await is refused."""
    cgguard.install(cgguard.Config(windows="fw.steps:warm_up"))
    import fw.steps

    _, plugin = modules()
    refused: list[str] = []

    async def elsewhere() -> None:
        try:
            plugin.serve()
        except cgguard.CaptureDisabledError as exc:
            refused.append(str(exc).rpartition("capture window ")[2])

    async def serve() -> str:
        task = asyncio.get_running_loop().create_task(elsewhere())
        warm: str = await fw.steps.warm_up()
        await task
        return warm

    assert (True, "warm", [f"fw.steps:warm_up {SUSPENDED}"]) == (
        inspect.iscoroutinefunction(fw.steps.warm_up),
        asyncio.run(serve()),
        refused,
    )


def test_an_async_generator_window_is_open_while_its_body_runs(steps: Path, cuda: None) -> None:
    """An async generator window stays one: captures in its body pass at every step; its
    consumer's captures between the steps are refused, blamed on the suspension."""
    cgguard.install(cgguard.Config(windows="fw.steps:agenerate"))
    import fw.steps

    _, plugin = modules()

    async def consume() -> tuple[list[int], list[str]]:
        items: list[int] = []
        refused: list[str] = []
        async for item in fw.steps.agenerate(2):
            items.append(item)
            try:
                plugin.serve()
            except cgguard.CaptureDisabledError as exc:
                refused.append(str(exc).rpartition("capture window ")[2])
        return items, refused

    assert (True, ([0, 1], [f"fw.steps:agenerate {SUSPENDED}"] * 2)) == (
        inspect.isasyncgenfunction(fw.steps.agenerate),
        asyncio.run(consume()),
    )


def test_an_async_context_window_is_open_in_its_async_with_body(steps: Path) -> None:
    """A context window's function that returns an async context manager: ``async with`` works
    through the wrapper, and the window is open in its body only."""
    import fw.steps

    registry = WindowRegistry([])
    windows = Windows()
    entry = registry.entry("fw.steps:opening", windows, context=True)

    async def use() -> tuple[str, bool]:
        async with fw.steps.opening() as body:
            inside = windows.enabled()
        return body, inside

    used = asyncio.run(use())
    after = (windows.enabled(), windows.closed[1] if windows.closed else None)
    entry.undo()
    assert (used, after) == (("body", True), (False, "with ended"))


def test_what_a_generator_window_is_sent_thrown_and_closed_with_reaches_its_body(
    steps: Path, cuda: None
) -> None:
    """throw() goes on into the body as yield from's would; close() runs its finally blocks
    inside the window, where its capture passes."""
    cgguard.install(cgguard.Config(windows="fw.steps:cleaning"))
    import fw.steps

    _, plugin = modules()
    seen: list[str] = []
    cleaning = fw.steps.cleaning(seen)
    next(cleaning)
    cleaning.throw(ValueError("in"))
    cleaning.close()
    refused = refusal(plugin.serve)
    assert (
        seen,
        str(refused).rpartition("capture window ")[2],
    ) == (["thrown in", "closed"], "fw.steps:cleaning returned.")


@pytest.mark.parametrize(
    ("entry", "call"),
    [
        (WINDOW, lambda runner: runner.start_server()),
        ("fw.runner:helper", lambda runner: runner.helper()),
    ],
    ids=["method", "module function"],
)
def test_a_reload_of_the_windows_module_makes_its_new_function_the_window(
    fw: Path, cuda: None, entry: str, call: Any
) -> None:
    """importlib.reload() defines the module's names anew (a new class, a new function): the
    entry is resolved again, so that the new function is the window as the old one was, and
    uninstall() puts back the new one."""
    cgguard.install(cgguard.Config(windows=entry))
    runner, plugin = modules()
    call(runner)
    refusal(plugin.serve)  # the window has closed
    reloaded = importlib.reload(runner)
    call(reloaded)  # its captures are inside the window
    closed = str(refusal(plugin.serve)).rpartition("capture window ")[2]
    windows = cgguard.status().windows
    cgguard.uninstall()
    owner = reloaded.Runner if entry == WINDOW else reloaded
    name = entry.rpartition(".")[2].rpartition(":")[2]
    put_back = vars(owner)[name]
    assert (
        f"{entry} returned.",
        (WindowInfo(entry, "function", "watched"),),
        False,
    ) == (closed, windows, put_back.__code__.co_filename == cgguard._gate.windows.__file__)
