"""Following another framework's capture flag, so its capture windows hold for every capture.

vLLM keeps ``vllm.compilation.monitor.cudagraph_capturing_enabled`` and its setter
``set_cudagraph_capturing_enabled``, but checks the flag only in its own wrappers. cgguard reads
the flag at every capture attempt (capture is allowed only if cgguard's flag and every followed
flag allow it) and wraps the setter to learn where capture was disabled. Reading the flag is
what makes it dependable: vLLM's model runner binds the setter by name, so calls bound before
cgguard saw the module never reach the wrapper.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from cgguard import _bootstrap, _state
from cgguard._errors import ConfigError
from cgguard._frames import snapshot

if TYPE_CHECKING:
    from types import ModuleType

    from cgguard._frames import Snapshot

VLLM = (
    "vllm.compilation.monitor",
    "cudagraph_capturing_enabled",
    "set_cudagraph_capturing_enabled",
)


class FlagSource:
    """One followed flag: a module attribute, and where its setter last changed it."""

    def __init__(self, module: ModuleType, attribute: str) -> None:
        self.module = module
        self.attribute = attribute
        self.label = f"{module.__name__}.{attribute}"
        self.changed_at: Snapshot | None = None

    def enabled(self) -> bool:
        return bool(getattr(self.module, self.attribute, True))


class _Follow:
    """A follow_flag() request: applied when its module is imported, undone by unfollow_all()."""

    def __init__(self, module: str, attribute: str, setter: str | None) -> None:
        self.module_name = module
        self.attribute = attribute
        self.setter = setter
        self.source: FlagSource | None = None
        self.original_setter: Any = None

    def apply(self, module: ModuleType) -> None:
        import wrapt

        source = FlagSource(module, self.attribute)
        if self.setter is not None and callable(getattr(module, self.setter, None)):
            self.original_setter = getattr(module, self.setter)

            def record_where(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                where = snapshot(1)
                result = wrapped(*args, **kwargs)
                # Only a call that left the flag off is where capture was disabled; after one
                # that turned it on, a later refusal must name the flag, not this line.
                source.changed_at = None if source.enabled() else where
                return result

            setattr(module, self.setter, wrapt.FunctionWrapper(self.original_setter, record_where))
        self.source = source
        _state.flag_sources.append(source)

    def undo(self) -> None:
        _bootstrap.cancel(self.module_name, self.apply)
        if self.source is None:
            return
        if self.source in _state.flag_sources:
            _state.flag_sources.remove(self.source)
        if self.original_setter is not None:
            setattr(self.source.module, self.setter or "", self.original_setter)
        self.source = None


_follows: list[_Follow] = []


def follow_flag(module: str, attribute: str, setter: str | None = None) -> None:
    """Follow a framework's capture flag: captures are refused while ``module.attribute`` is false.

    ``setter``, if given, names the module's function that changes the flag; cgguard wraps it to
    report where capture was disabled. Works before or after the module is imported. Undone by
    uninstall().
    """
    for value, what in ((module, "module"), (attribute, "attribute")):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"follow_flag({what}={value!r}): accepted values are a name")
    _follows.append(_start(module, attribute, setter))


def _start(module: str, attribute: str, setter: str | None) -> _Follow:
    follow = _Follow(module, attribute, setter)
    if module in sys.modules:
        follow.apply(sys.modules[module])
    else:
        _bootstrap.when_imported(module, follow.apply)
    return follow


_vllm: _Follow | None = None


def follow_vllm(enabled: bool) -> None:
    """Follow vLLM's capture flag (install's default), or stop; other follows are untouched."""
    global _vllm
    if _vllm is not None and not enabled:
        _vllm.undo()
        _vllm = None
    elif _vllm is None and enabled:
        _vllm = _start(*VLLM)


def unfollow_all() -> None:
    """Stop following every flag; put each wrapped setter back."""
    follow_vllm(False)
    while _follows:
        _follows.pop().undo()
