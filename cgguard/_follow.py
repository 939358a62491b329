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

from cgguard import _guard, _startup
from cgguard._errors import ConfigError
from cgguard._frames import snapshot
from cgguard._guard import FlagSource
from cgguard._patchset import PatchSet

if TYPE_CHECKING:
    from types import ModuleType

VLLM = (
    "vllm.compilation.monitor",
    "cudagraph_capturing_enabled",
    "set_cudagraph_capturing_enabled",
)


class _Follow:
    """A follow request: applied when its module is imported, undone by unfollow_all()."""

    def __init__(self, module: str, attribute: str, setter: str | None) -> None:
        self.module_name = module
        self.attribute = attribute
        self.setter = setter
        self.source: FlagSource | None = None
        self.patches = PatchSet()

    def apply(self, module: ModuleType) -> None:
        import wrapt

        source = FlagSource(module, self.attribute)

        def record_where(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            where = snapshot(1)
            result = wrapped(*args, **kwargs)
            # Only a call that left the flag off is where capture was disabled; after one that
            # turned it on, a later refusal must name the flag, not this line.
            source.changed_at = None if source.enabled() else where
            return result

        if self.setter is not None and callable(getattr(module, self.setter, None)):
            self.patches.wrap(
                module, self.setter, lambda original: wrapt.FunctionWrapper(original, record_where)
            )
        self.source = source
        _guard.FOLLOWED.append(source)

    def undo(self) -> None:
        _startup.cancel(self.module_name, self.apply)
        if self.source is not None and self.source in _guard.FOLLOWED:
            _guard.FOLLOWED.remove(self.source)
        self.patches.restore()
        self.source = None


# The requests made, in order; vLLM's apart, since install() switches it with its config.
_requests: list[_Follow] = []
_vllm: _Follow | None = None


def follow_flag(module: str, attribute: str, setter: str | None = None) -> None:
    """Follow a framework's capture flag: captures are refused while ``module.attribute`` is false.

    ``setter``, if given, names the module's function that changes the flag; cgguard wraps it to
    report where capture was disabled. Works before or after the module is imported. Undone by
    uninstall().
    """
    for value, what in ((module, "module"), (attribute, "attribute")):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"follow_flag({what}={value!r}): accepted values are a name")
    _requests.append(_start(module, attribute, setter))


def _start(module: str, attribute: str, setter: str | None) -> _Follow:
    follow = _Follow(module, attribute, setter)
    if module in sys.modules:
        follow.apply(sys.modules[module])
    else:
        _startup.when_imported(module, follow.apply)
    return follow


def follow_vllm(enabled: bool) -> None:
    """Follow vLLM's capture flag (install's default), or stop; other follows are untouched."""
    global _vllm
    if _vllm is not None and not enabled:
        _vllm.undo()
        _vllm = None
    elif _vllm is None and enabled:
        _vllm = _start(*VLLM)


def waiting() -> list[str]:
    """The modules whose flags will be followed once they are imported."""
    return [f.module_name for f in [*_requests, *([_vllm] if _vllm else [])] if f.source is None]


def unfollow_all() -> None:
    """Stop following every flag; put each wrapped setter back."""
    follow_vllm(False)
    while _requests:
        _requests.pop().undo()
