"""The gate: whether a capture may begin now, for the whole process."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cgguard._gate.flags import CaptureFlag, FlagSource, disabled_by
from cgguard._gate.follow import FollowedFlags
from cgguard._gate.profiles import Profiles
from cgguard._gate.windows import WindowRegistry
from cgguard._support.frames import snapshot

if TYPE_CHECKING:
    from types import TracebackType

    from cgguard._config.config import Config
    from cgguard._gate.flags import Windows
    from cgguard._support.frames import Snapshot


class Gate:
    """What decides whether a capture may begin: cgguard's capture flag, and what may disable
    capture besides it (``follows``): the frameworks' flags followed, the declared capture
    windows and the built-in profiles' windows.

    A program disables capture, follows a flag or declares windows whether or not, and before
    or after, cgguard is installed: the gate is the process's (cgguard._process), and the
    capture path of each installation reads its flag and ``follows``, the very objects.
    """

    def __init__(self) -> None:
        self.flag = CaptureFlag()
        self.follows: list[FlagSource | Windows] = []
        self.windows = WindowRegistry(self.follows)
        self.profiles = Profiles(self.windows)
        self.flags = FollowedFlags(self.follows)

    def is_capture_enabled(self) -> bool:
        """cgguard's flag and every followed flag allow a capture now. A refusal a built-in
        profile's windows alone would make, and only log (Config(profiles="log")), does not
        count."""
        disabler = disabled_by(self.flag, self.follows)
        return disabler is None or disabler.log_only

    def followed(self) -> tuple[str, ...]:
        """The frameworks' flags followed now, as module.attribute."""
        return tuple(s.label for s in self.follows if isinstance(s, FlagSource))

    def configure(self, config: Config) -> None:
        """Hold what ``config`` says of capture: the flag at start, vLLM's flag followed or not,
        the declared windows, the built-in profiles."""
        if config.capture is not None:
            self.flag.set(config.capture == "enabled", None)
        self.flags.follow_vllm(config.vllm_bridge)
        self.windows.declare(config.windows)
        self.profiles.switch(config.profiles != "off", log_only=config.profiles == "log")

    def stop(self) -> None:
        """No flag followed and no window watched any more (uninstall): each wrapped setter and
        window function put back, each pending import hook gone. The flag keeps its value."""
        self.flags.unfollow_all()
        self.windows.forget_all()
        self.profiles.switch(False)

    def after_fork(self) -> None:
        """A forked child's gate: the calls under way of threads it lacks are forgotten."""
        self.windows.after_fork()


class FlagSetting:
    """Sets ``flag`` on entry and puts back its previous value and origin on exit."""

    def __init__(self, flag: CaptureFlag, enabled: bool) -> None:
        self._flag = flag
        self._enabled = enabled
        self._saved: list[tuple[bool, Snapshot | None]] = []

    def __enter__(self) -> None:
        # A stack of saved values, so that one object entered twice still nests.
        flag = self._flag
        self._saved.append((flag.enabled, flag.changed_at))
        flag.set(self._enabled, snapshot(1))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._flag.set(*self._saved.pop())
