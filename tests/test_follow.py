"""The vLLM bridge and follow_flag(): another framework's capture flag holds for every capture.

Tested against a small stand-in for ``vllm.compilation.monitor`` with vLLM's public names,
written into a temporary folder; cgguard has no dependency on vLLM.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pytest
import torch
from helpers import SourceFile

import cgguard

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path
    from types import ModuleType

pytestmark = pytest.mark.simulated

MONITOR = """\
cudagraph_capturing_enabled: bool = True


def set_cudagraph_capturing_enabled(enabled: bool) -> None:
    global cudagraph_capturing_enabled
    cudagraph_capturing_enabled = enabled
"""

# vLLM's model runner binds the setter by name when it is imported.
RUNNER = """\
from vllm.compilation.monitor import set_cudagraph_capturing_enabled


def finish_capture_phase() -> None:
    set_cudagraph_capturing_enabled(False)  # @runner-disables
"""


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path holding the stand-in vllm package; forgotten after the test."""
    package = tmp_path / "vllm"
    (package / "compilation").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "compilation" / "__init__.py").write_text("")
    (package / "compilation" / "monitor.py").write_text(MONITOR)
    (package / "model_runner.py").write_text(RUNNER)
    (tmp_path / "myframework.py").write_text("CAPTURE_OK = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.split(".")[0] in ("vllm", "myframework")]:
        del sys.modules[name]


@pytest.fixture
def cuda() -> Iterator[None]:
    from cgguard.testing import simulated_cuda

    with simulated_cuda():
        yield


def monitor() -> ModuleType:
    import vllm.compilation.monitor  # type: ignore[import-not-found]

    return vllm.compilation.monitor  # type: ignore[no-any-return]


def capture() -> None:
    with torch.cuda.graph(torch.cuda.CUDAGraph()):  # @capture
        pass


def test_setter_disables_every_capture_and_says_where(standin: Path, cuda: None) -> None:
    """vLLM's setter, called through its module, refuses every capture and names its caller."""
    cgguard.install()
    mon = monitor()  # imported after install: the bridge goes on at import
    mon.set_cudagraph_capturing_enabled(False)  # @test-disables
    assert cgguard.is_capture_enabled() is False
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        capture()
    here = SourceFile(__file__)
    assert raised.value.event["disabled_stack"][-1]["line"] == here.line_of("@test-disables")
    assert (
        f"capture was disabled at {here.path}:{here.line_of('@test-disables')} "
        "(in test_setter_disables_every_capture_and_says_where)" in str(raised.value)
    )
    mon.set_cudagraph_capturing_enabled(True)
    assert cgguard.is_capture_enabled() is True
    capture()


def test_setter_bound_before_install_is_still_obeyed(standin: Path, cuda: None) -> None:
    """A setter bound by name before cgguard saw the module bypasses the wrapper, not the rule."""
    from vllm.model_runner import finish_capture_phase  # type: ignore[import-not-found]

    cgguard.install()  # the monitor is already imported: the bridge goes on now
    finish_capture_phase()
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        capture()
    assert raised.value.event["disabled_stack"] is None
    assert str(raised.value).endswith(
        "capture was disabled by vllm.compilation.monitor.cudagraph_capturing_enabled."
    )


def test_value_at_bridge_time_counts(standin: Path, cuda: None) -> None:
    """A flag already off when cgguard installs refuses the first capture."""
    monitor().cudagraph_capturing_enabled = False
    cgguard.install()
    assert cgguard.is_capture_enabled() is False
    with pytest.raises(cgguard.CaptureDisabledError):
        capture()


def test_both_flags_must_allow(standin: Path, cuda: None) -> None:
    """cgguard's own flag off refuses even while vLLM's is on, and names cgguard's change."""
    cgguard.install()
    monitor()
    with cgguard.capture_disabled(), pytest.raises(cgguard.CaptureDisabledError) as raised:
        capture()
    assert raised.value.event["disabled_stack"][-1]["function"] == "test_both_flags_must_allow"


def test_uninstall_puts_the_setter_back(standin: Path) -> None:
    """uninstall() restores vLLM's setter exactly and stops following its flag."""
    mon = monitor()
    original = mon.set_cudagraph_capturing_enabled
    cgguard.install()
    assert mon.set_cudagraph_capturing_enabled is not original
    cgguard.uninstall()
    assert mon.set_cudagraph_capturing_enabled is original
    mon.cudagraph_capturing_enabled = False
    assert cgguard.is_capture_enabled() is True


def test_bridge_can_be_switched_off(standin: Path) -> None:
    """Config(vllm_bridge=False) leaves vLLM's module alone."""
    mon = monitor()
    original = mon.set_cudagraph_capturing_enabled
    cgguard.install(cgguard.Config(vllm_bridge=False))
    assert mon.set_cudagraph_capturing_enabled is original
    assert cgguard.status().followed == ()


def test_uninstall_before_vllm_import_cancels_the_bridge(standin: Path) -> None:
    """install() then uninstall() before vLLM is imported leaves vLLM's module untouched."""
    cgguard.install()
    cgguard.uninstall()
    mon = monitor()
    cgguard.install(cgguard.Config(vllm_bridge=False))
    assert cgguard.status().followed == ()
    assert mon.set_cudagraph_capturing_enabled.__module__ == "vllm.compilation.monitor"
    assert type(mon.set_cudagraph_capturing_enabled).__name__ == "function"


def test_follow_flag_for_another_framework(standin: Path, cuda: None) -> None:
    """follow_flag() applies the same bridge to any module attribute, imported or not."""
    cgguard.install()
    cgguard.follow_flag("myframework", "CAPTURE_OK")
    import myframework  # type: ignore[import-not-found]

    myframework.CAPTURE_OK = False
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        capture()
    assert str(raised.value).endswith("capture was disabled by myframework.CAPTURE_OK.")
    myframework.CAPTURE_OK = True
    capture()


@pytest.mark.parametrize(("module", "attribute"), [("", "x"), ("m", ""), (None, "x")])
def test_follow_flag_rejects_bad_names(module: object, attribute: object) -> None:
    """follow_flag() names the bad argument and what it accepts, in one line."""
    with pytest.raises(cgguard.ConfigError) as raised:
        cgguard.follow_flag(module, attribute)  # type: ignore[arg-type]
    what, value = ("module", module) if module in ("", None) else ("attribute", attribute)
    assert str(raised.value) == f"follow_flag({what}={value!r}): accepted values are a name"


def test_reinstall_keeps_the_users_follows(standin: Path, cuda: None) -> None:
    """install(config) again keeps flags followed with follow_flag() and switches vLLM's."""
    cgguard.install()
    cgguard.follow_flag("myframework", "CAPTURE_OK")
    import myframework  # noqa: F401 - the follow applies once the module is imported

    mon = monitor()
    cgguard.install(cgguard.Config(vllm_bridge=False))
    assert cgguard.status().followed == ("myframework.CAPTURE_OK",)
    assert type(mon.set_cudagraph_capturing_enabled).__name__ == "function"


def test_enabling_call_is_never_named_as_the_disabling_one(standin: Path, cuda: None) -> None:
    """Setter(True) seen, then an unseen setter(False): the refusal names the flag, not a line."""
    from vllm.model_runner import finish_capture_phase

    cgguard.install()
    monitor().set_cudagraph_capturing_enabled(True)  # seen by the wrapper: it turned capture on
    finish_capture_phase()  # bound before install: unseen
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        capture()
    assert raised.value.event["disabled_stack"] is None


def test_follow_flag_before_install_counts_and_uninstall_undoes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """follow_flag() before install(): the flag already counts, and uninstall() puts back its
    setter and stops following it."""
    import types

    framework = types.ModuleType("cgg_early_framework")

    def set_capture_ok(value: bool) -> None:
        framework.capture_ok = value  # type: ignore[attr-defined]

    framework.capture_ok = False  # type: ignore[attr-defined]
    framework.set_capture_ok = set_capture_ok  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cgg_early_framework", framework)
    cgguard.follow_flag("cgg_early_framework", "capture_ok", setter="set_capture_ok")
    before = (cgguard.is_capture_enabled(), cgguard.status().followed)
    cgguard.uninstall()
    after = (cgguard.is_capture_enabled(), framework.set_capture_ok is set_capture_ok)  # type: ignore[attr-defined]
    cgguard.install(cgguard.Config(vllm_bridge=False))
    assert (before, after, cgguard.status().followed) == (
        (False, ("cgg_early_framework.capture_ok",)),
        (True, True),
        (),
    )


@pytest.fixture
def main_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """vLLM's main-branch layout: the flag in vllm.backends.compiler.monitor, and the old name a
    sys.modules alias of that module, set by the old package as vLLM does."""
    package = tmp_path / "vllm"
    (package / "backends" / "compiler").mkdir(parents=True)
    (package / "compilation").mkdir()
    for folder in (package, package / "backends", package / "backends" / "compiler"):
        (folder / "__init__.py").write_text("")
    (package / "backends" / "compiler" / "monitor.py").write_text(MONITOR)
    (package / "compilation" / "__init__.py").write_text(
        "import sys\n\nfrom vllm.backends.compiler import monitor\n\n"
        'sys.modules["vllm.compilation.monitor"] = monitor\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.split(".")[0] == "vllm"]:
        del sys.modules[name]


NEW_FLAG = "vllm.backends.compiler.monitor.cudagraph_capturing_enabled"


@pytest.mark.parametrize("imported_as", ["new name", "old name", "both names"])
def test_the_moved_flag_is_followed_once_under_either_name(
    imported_as: str, main_layout: Path, cuda: None
) -> None:
    """vLLM main's monitor, imported by its new name, its old alias or both: followed once."""
    import importlib

    cgguard.install()
    names = {
        "new name": ["vllm.backends.compiler.monitor"],
        "old name": ["vllm.compilation.monitor"],
        "both names": ["vllm.compilation.monitor", "vllm.backends.compiler.monitor"],
    }[imported_as]
    modules = [importlib.import_module(name) for name in names]
    assert all(m is modules[0] for m in modules)
    assert (cgguard.status().followed, cgguard.status().waiting_to_follow) == ((NEW_FLAG,), ())
    modules[0].set_cudagraph_capturing_enabled(False)  # @new-layout-disables
    with pytest.raises(cgguard.CaptureDisabledError) as raised:
        capture()
    where = raised.value.event["disabled_stack"][-1]  # type: ignore[index]
    assert (where["function"], where["code"]) == (
        "test_the_moved_flag_is_followed_once_under_either_name",
        "modules[0].set_cudagraph_capturing_enabled(False)  # @new-layout-disables",
    )


def test_the_moved_flag_imported_before_install_is_followed_once(
    main_layout: Path, cuda: None
) -> None:
    """Both names already imported when cgguard installs: one flag followed."""
    import vllm.backends.compiler.monitor  # type: ignore[import-not-found]
    import vllm.compilation.monitor

    cgguard.install()
    assert cgguard.status().followed == (NEW_FLAG,)
    vllm.backends.compiler.monitor.cudagraph_capturing_enabled = False
    with pytest.raises(cgguard.CaptureDisabledError):
        capture()


# A framework module that activates cgguard in the middle of its own import, before its setter
# is defined: what its own `import torch` does under `cgguard run` or CGGUARD_ENABLED=1.
HALF_IMPORTED = """\
import cgguard

capturing = True
cgguard.install()
cgguard.follow_flag("cgg_early_framework", "capturing", "set_capturing")


def set_capturing(enabled):
    global capturing
    capturing = enabled
"""


def test_a_flag_followed_from_inside_its_modules_import_wraps_the_setter_defined_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuda: None
) -> None:
    """Followed while its module is still being imported, the flag's setter is wrapped once
    that import has finished: a refusal says where capture was disabled."""
    (tmp_path / "cgg_early_framework.py").write_text(HALF_IMPORTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import cgg_early_framework  # type: ignore[import-not-found]

        cgg_early_framework.set_capturing(False)  # @early-disable
        with pytest.raises(cgguard.CaptureDisabledError) as raised:
            capture()
    finally:
        sys.modules.pop("cgg_early_framework", None)
    here = SourceFile(__file__)
    function = "test_a_flag_followed_from_inside_its_modules_import_wraps_the_setter_defined_later"
    assert str(raised.value).endswith(
        f"capture was disabled at {here.path}:{here.line_of('@early-disable')} (in {function})."
    )
