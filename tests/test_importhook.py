"""The post-import hook (cgguard._boot): callbacks after a module's import."""

from __future__ import annotations

import importlib
import itertools
import sys
from typing import TYPE_CHECKING

import pytest

from cgguard import _boot
from cgguard._support import warn as _warn

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path
    from types import ModuleType

_serial = itertools.count()


class Modules:
    """Throwaway modules written to a folder on sys.path, each under a name never used before."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.names: list[str] = []

    def write(self, source: str, *, package: bool = False) -> str:
        """Write a module (or a package's __init__) holding ``source``; return its name."""
        name = f"cgguard_hook_sample_{next(_serial)}"
        self.names.append(name)
        if package:
            (self.folder / name).mkdir()
            (self.folder / name / "__init__.py").write_text(source)
        else:
            (self.folder / f"{name}.py").write_text(source)
        importlib.invalidate_caches()
        return name

    def forget(self) -> None:
        for name in list(sys.modules):
            if any(name == n or name.startswith(f"{n}.") for n in self.names):
                del sys.modules[name]


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Modules]:
    monkeypatch.syspath_prepend(str(tmp_path))
    made = Modules(tmp_path)
    yield made
    made.forget()


@pytest.fixture(autouse=True)
def _clean_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """No callbacks pending, sys.meta_path restored and warnings unsaid, around each test."""
    monkeypatch.setattr(_boot, "_callbacks", {})
    monkeypatch.setattr(_boot, "_reloads", {}, raising=False)
    monkeypatch.setattr(_boot, "_finishing", {}, raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(_warn, "_said", set())


def recorder(calls: list[tuple[ModuleType, object]]) -> Callable[[ModuleType], None]:
    """A callback that records the module and the value its body sets last, LAST."""

    def record(module: ModuleType) -> None:
        calls.append((module, getattr(module, "LAST", "<not yet>")))

    return record


BODY = "FIRST = 1\nMIDDLE = FIRST + 1\nLAST = 'body ran to the end'\n"


def test_fires_once_after_the_body_ran(modules: Modules) -> None:
    """The callback gets the module once its whole body ran, and never again on re-import."""
    name = modules.write(BODY)
    calls: list[tuple[ModuleType, object]] = []
    _boot.when_imported(name, recorder(calls))
    module = importlib.import_module(name)
    del sys.modules[name]
    importlib.import_module(name)
    assert [(module, "body ran to the end")] == calls


def test_fires_for_a_submodule(modules: Modules) -> None:
    """A callback for a package's submodule fires when the submodule is imported."""
    package = modules.write("", package=True)
    (modules.folder / package / "sub.py").write_text(BODY)
    importlib.invalidate_caches()
    calls: list[tuple[ModuleType, object]] = []
    _boot.when_imported(f"{package}.sub", recorder(calls))
    module = importlib.import_module(f"{package}.sub")
    assert [(module, "body ran to the end")] == calls


def test_other_modules_do_not_fire(modules: Modules) -> None:
    """Importing other modules and packages fires nothing; the watched one fires after."""
    watched = modules.write(BODY)
    calls: list[tuple[ModuleType, object]] = []
    _boot.when_imported(watched, recorder(calls))
    importlib.import_module(modules.write(BODY))
    importlib.import_module(modules.write(BODY, package=True))
    assert calls == []
    module = importlib.import_module(watched)
    assert [(module, "body ran to the end")] == calls


def test_registering_does_not_import(modules: Modules) -> None:
    """when_imported() only registers: the module is not imported and nothing is called."""
    name = modules.write("raise AssertionError('imported by when_imported')\n")
    calls: list[tuple[ModuleType, object]] = []
    _boot.when_imported(name, recorder(calls))
    assert (name in sys.modules, calls) == (False, [])


def test_cancel_prevents_the_call(modules: Modules) -> None:
    """A cancelled callback does not run; the others registered for the module still do."""
    name = modules.write(BODY)
    cancelled: list[tuple[ModuleType, object]] = []
    kept: list[tuple[ModuleType, object]] = []
    callback = recorder(cancelled)
    _boot.when_imported(name, callback)
    _boot.when_imported(name, recorder(kept))
    _boot.cancel(name, callback)
    module = importlib.import_module(name)
    assert ([], [(module, "body ran to the end")]) == (cancelled, kept)


def test_failing_callback_does_not_fail_the_import(
    modules: Modules, capsys: pytest.CaptureFixture[str]
) -> None:
    """A callback that raises leaves the import whole, the next callback runs, one line is said."""
    name = modules.write(BODY)

    def fail(module: ModuleType) -> None:
        raise ValueError("boom")

    calls: list[tuple[ModuleType, object]] = []
    _boot.when_imported(name, fail)
    _boot.when_imported(name, recorder(calls))
    module = importlib.import_module(name)
    assert [(module, "body ran to the end")] == calls
    assert sys.modules[name] is module
    expected_err = f"cgguard: error after importing {name}, ignored: ValueError('boom')\n"
    assert ("", expected_err) == capsys.readouterr()


def test_failed_import_does_not_fire(modules: Modules) -> None:
    """A module whose body raises fails as usual and its callback waits for a successful import."""
    name = modules.write("LAST = 'half'\nraise ImportError('body failed')\n")
    calls: list[tuple[ModuleType, object]] = []
    _boot.when_imported(name, recorder(calls))
    with pytest.raises(ImportError) as info:
        importlib.import_module(name)
    assert str(info.value) == "body failed"
    assert calls == []
    (modules.folder / f"{name}.py").write_text(BODY)
    importlib.invalidate_caches()
    module = importlib.import_module(name)
    assert [(module, "body ran to the end")] == calls


def test_finder_leaves_meta_path_when_nothing_is_pending(modules: Modules) -> None:
    """The finder goes first on sys.meta_path while callbacks wait, and leaves after the last."""
    before = list(sys.meta_path)
    first, second = modules.write(BODY), modules.write(BODY)
    _boot.when_imported(first, recorder([]))
    _boot.when_imported(second, recorder([]))
    assert [_boot._finder, *before] == sys.meta_path
    importlib.import_module(first)
    assert [_boot._finder, *before] == sys.meta_path
    importlib.import_module(second)
    assert before == sys.meta_path


def test_cancel_of_the_last_callback_removes_the_finder(modules: Modules) -> None:
    """Cancelling the only pending callback takes the finder off sys.meta_path."""
    before = list(sys.meta_path)
    name = modules.write(BODY)
    callback = recorder([])
    _boot.when_imported(name, callback)
    _boot.cancel(name, callback)
    assert before == sys.meta_path


def test_loader_is_left_unhooked(modules: Modules) -> None:
    """After the import the module's loader has no instance exec_module left by the hook."""
    name = modules.write(BODY)
    _boot.when_imported(name, recorder([]))
    module = importlib.import_module(name)
    assert module.__spec__ is not None
    loader = module.__spec__.loader
    assert "exec_module" not in vars(loader)


def test_a_hook_named_by_string_is_imported_only_when_it_fires(modules: Modules) -> None:
    """A hook given as "module:function" imports its module when the watched module is imported."""
    hooks = modules.write(
        "CALLS = []\n\ndef on_import(module):\n    CALLS.append((module.__name__, module.LAST))\n"
    )
    watched = modules.write(BODY)
    _boot.when_imported(watched, f"{hooks}:on_import")
    assert (hooks in sys.modules, _boot.pending(watched)) == (False, [f"{hooks}:on_import"])
    importlib.import_module(watched)
    assert [(watched, "body ran to the end")] == sys.modules[hooks].CALLS
    assert _boot.pending(watched) == []


# A module that, while its own body runs, asks to be called back at the end of its import
# HOOKS times, as install() does for a module being imported when it is called, once per
# install(): each hook records the module's LAST value in CALLS.
WAITING_BODY = """
import sys
from importlib.machinery import ModuleSpec

from cgguard import _boot

CALLS = []
SPEC_CLASS_DURING = None


def hook(n):
    return lambda module: CALLS.append((n, getattr(module, "LAST", "<not yet>")))


me = sys.modules[__name__]
shared = hook("shared")
for n in range(HOOKS):
    _boot.when_initialized(me, hook(n))
    _boot.when_initialized(me, shared)
SPEC_CLASS_DURING = type(__spec__)
LAST = "body ran to the end"
"""


@pytest.mark.parametrize("hooks", [1, 2, 3000])
def test_hooks_waiting_for_an_import_to_finish_run_once_each_after_it(
    modules: Modules, hooks: int
) -> None:
    """However many hooks wait for the end of a module's import (one per install() while it is
    imported), each runs once after its body, the shared one once, and the spec is its own
    class again: it was swapped once, never subclassed again."""
    from importlib.machinery import ModuleSpec

    name = modules.write(WAITING_BODY.replace("HOOKS", str(hooks)))
    module = importlib.import_module(name)
    assert [
        *[(n, "body ran to the end") for n in range(min(hooks, 1))],
        ("shared", "body ran to the end"),
        *[(n, "body ran to the end") for n in range(1, hooks)],
    ] == module.CALLS
    assert type(module.__spec__) is ModuleSpec
    assert module.SPEC_CLASS_DURING.__mro__[1] is ModuleSpec
    assert _boot.pending(name) == []


def test_a_hook_cancelled_while_waiting_for_the_end_does_not_run(modules: Modules) -> None:
    """cancel() takes back a hook waiting for the end of an import under way."""
    name = modules.write(
        "import sys\n"
        "from cgguard import _boot\n"
        "CALLS = []\n"
        "kept, dropped = CALLS.append, lambda module: CALLS.append('dropped')\n"
        "_boot.when_initialized(sys.modules[__name__], kept)\n"
        "_boot.when_initialized(sys.modules[__name__], dropped)\n"
        "_boot.cancel(__name__, dropped)\n"
    )
    module = importlib.import_module(name)
    assert [module] == module.CALLS


def test_a_failed_import_runs_no_hook_waiting_for_its_end(modules: Modules) -> None:
    """The import fails after hooks were registered: none runs, and none is left waiting."""
    name = modules.write(
        "import sys\n"
        "from cgguard import _boot\n"
        "import builtins\n"
        "builtins.cgguard_waiting_calls = []\n"
        "_boot.when_initialized(sys.modules[__name__], builtins.cgguard_waiting_calls.append)\n"
        "raise ValueError('the module fails')\n"
    )
    import builtins

    try:
        with pytest.raises(ValueError, match="the module fails"):
            importlib.import_module(name)
        assert (builtins.cgguard_waiting_calls, _boot.pending(name)) == ([], [])  # type: ignore[attr-defined]
    finally:
        del builtins.cgguard_waiting_calls  # type: ignore[attr-defined]


def test_reload_hooks_run_after_each_reload_until_cancelled(modules: Modules) -> None:
    """when_reloaded(): called after each importlib.reload() of the module, with the same module
    object and its new names, not at the import before it was registered; cancel() stops it."""
    name = modules.write(BODY)
    module = importlib.import_module(name)
    calls: list[tuple[ModuleType, object]] = []
    callback = recorder(calls)
    _boot.when_reloaded(name, callback)
    (modules.folder / f"{name}.py").write_text(BODY.replace("body ran", "reloaded body ran"))
    importlib.invalidate_caches()
    sys.modules[name].__dict__.pop("__cached__", None)
    importlib.reload(module)
    importlib.reload(module)
    _boot.cancel(name, callback)
    importlib.reload(module)
    assert calls == [(module, "reloaded body ran to the end")] * 2
    assert _boot._finder not in sys.meta_path


def test_start_up_imports_the_standard_library_alone() -> None:
    """The start-up layer imports the standard library and itself; what it calls above it, it
    names, and only the warning line, below it, is imported when there is one to say."""
    import ast
    from pathlib import Path

    assert _boot.__file__ is not None
    tree = ast.parse(Path(_boot.__file__).read_text(encoding="utf-8"))
    top_level = [
        alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names
    ] + [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
    inside = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("cgguard")
        and node not in tree.body
    }
    assert (top_level, sorted(inside)) == (["_thread", "os", "sys"], ["cgguard._support.warn"])
    assert _boot.CHECK_ENVIRONMENT == "cgguard._config.settings:activation_says_on"


def test_an_exemptions_file_is_parsed_once_from_start_up_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The start-up check's parse of CGGUARD_EXEMPT_FILE is the one install() uses: each entry
    is parsed once, its mistake said once, and the file's exemptions are in effect."""
    import torch

    import cgguard
    from cgguard import _activation
    from cgguard._config import settings as _settings
    from cgguard._rules import exempt_syntax as _exempt_syntax

    path = tmp_path / "exemptions"
    path.write_text("capture_disabled=pkg.mod:Kernel.run\noops\nnested_capture=*/kernels.py\n")
    parsed: list[str] = []
    real = _exempt_syntax.parse_entry
    monkeypatch.setattr(
        _exempt_syntax, "parse_entry", lambda entry: parsed.append(entry) or real(entry)
    )
    monkeypatch.setenv("CGGUARD_ENABLED", "1")
    monkeypatch.setenv("CGGUARD_EXEMPT_FILE", str(path))
    _settings.activation_says_on(default=False)  # what activation checks at start-up
    _activation.on_torch_import(torch)  # what it does once torch is imported
    expected = (
        ["capture_disabled=pkg.mod:Kernel.run", "oops", "nested_capture=*/kernels.py"],
        ("capture_disabled=pkg.mod:Kernel.run", "nested_capture=*/kernels.py"),
        f"cgguard: ignoring the exemption 'oops' in {str(path)!r} line 2: not RULE=PLACE; an "
        "entry is RULE=PLACE, PLACE a module (torch._inductor.), a file glob with a '/' "
        "(*/kernels.py) or a function (module:qualname)\n",
    )
    assert expected == (parsed, cgguard.status().exemptions, capsys.readouterr().err)
