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

from cgguard import _boot
from cgguard._errors import ConfigError
from cgguard._gate.flags import FlagSource
from cgguard._support.frames import snapshot
from cgguard._support.patchset import PatchSet

if TYPE_CHECKING:
    from types import ModuleType

    from cgguard._gate.flags import Windows

# vLLM's flag, where released vLLM keeps it and where its main branch moved it. There the old
# name is a sys.modules alias of the new module: whichever name is imported is followed, and
# one module under two names is followed once.
VLLM_MODULES = ("vllm.compilation.monitor", "vllm.backends.compiler.monitor")
VLLM_FLAG = ("cudagraph_capturing_enabled", "set_cudagraph_capturing_enabled")


class _Follow:
    """A follow request: applied when its module is imported, undone by undo()."""

    def __init__(
        self, module: str, attribute: str, setter: str | None, follows: list[FlagSource | Windows]
    ) -> None:
        self.module_name = module
        self.attribute = attribute
        self.setter = setter
        self.follows = follows
        self.source: FlagSource | None = None
        self.patches = PatchSet()

    def apply(self, module: ModuleType) -> None:
        import wrapt

        if any(
            isinstance(s, FlagSource) and s.module is module and s.attribute == self.attribute
            for s in self.follows
        ):
            return  # followed already, under another of its names
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
        self.follows.append(source)

    def undo(self) -> None:
        _boot.cancel(self.module_name, self.apply)
        if self.source is not None and self.source in self.follows:
            self.follows.remove(self.source)
        self.patches.restore()
        self.source = None


class FollowedFlags:
    """The frameworks' flags followed: follow_flag()'s requests, in order, and vLLM's apart,
    since install() switches it with its configuration. Each flag followed joins ``follows``,
    what may disable capture besides cgguard's flag."""

    def __init__(self, follows: list[FlagSource | Windows]) -> None:
        self.follows = follows
        self.requests: list[_Follow] = []
        self.vllm: list[_Follow] = []

    def follow(self, module: str, attribute: str, setter: str | None = None) -> None:
        """Follow ``module.attribute`` (see cgguard.follow_flag)."""
        for value, what in ((module, "module"), (attribute, "attribute")):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"follow_flag({what}={value!r}): accepted values are a name")
        self.requests.append(self._start(module, attribute, setter))

    def _start(self, module: str, attribute: str, setter: str | None) -> _Follow:
        follow = _Follow(module, attribute, setter, self.follows)
        # A module being imported now has no setter yet: it is wrapped once the module has run
        # to its end.
        _boot.when_ready(module, follow.apply)
        return follow

    def follow_vllm(self, enabled: bool) -> None:
        """Follow vLLM's capture flag (install's default), or stop; other follows are kept."""
        if self.vllm and not enabled:
            while self.vllm:
                self.vllm.pop().undo()
        elif not self.vllm and enabled:
            self.vllm.extend(self._start(module, *VLLM_FLAG) for module in VLLM_MODULES)

    def waiting(self) -> list[str]:
        """The modules whose flags will be followed once they are imported."""
        followed = {id(s.module) for s in self.follows if isinstance(s, FlagSource)}
        # vLLM's flag is one flag under either layout: once followed, no other name is awaited.
        vllm = [] if any(f.source is not None for f in self.vllm) else self.vllm
        return [
            f.module_name
            for f in [*self.requests, *vllm]
            if f.source is None
            and not (f.module_name in sys.modules and id(sys.modules[f.module_name]) in followed)
        ]

    def unfollow_all(self) -> None:
        """Stop following every flag; put each wrapped setter back."""
        self.follow_vllm(False)
        while self.requests:
            self.requests.pop().undo()
