"""Global state department: the capture flag, the active captures and what install() set up.

(Activation without code changes keeps its two facts in cgguard._bootstrap, so that an idle
activation loads nothing more.)

Everything cgguard remembers between calls lives here, so that ``reset()`` gives tests a clean
process. Reads and writes are single attribute or dict operations, atomic under the GIL; the
capture path takes no lock.
"""

# Cheap to import: no ``typing`` or ``__future__`` at runtime.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._config import Config
    from cgguard._frames import Snapshot
    from cgguard._guard import CaptureRecord
    from cgguard._report import Reporter

# The capture flag and where it got its value (None: from configuration, or never changed).
capture_enabled: bool = True
capture_changed_at: "Snapshot | None" = None

# Captures begun and not yet ended, by id() of the CUDAGraph that holds them.
active: "dict[int, CaptureRecord]" = {}

# What install() set up; None while not installed.
config: "Config | None" = None
reporter: "Reporter | None" = None

# What cgguard._patches replaced on torch, as (owner, attribute name, original), in order.
patches: list[tuple[type, str, object]] = []

# Called with every violation's full event, whatever the logging; for cgguard.testing.
listeners: "list[Callable[[dict[str, object]], None]]" = []


def set_flag(enabled: bool, changed_at: "Snapshot | None") -> None:
    global capture_enabled, capture_changed_at
    # Origin first: a reader that sees the new value must not see the old origin.
    capture_changed_at = changed_at
    capture_enabled = enabled


def reset() -> None:
    """Forget everything: the flag enabled, no captures, nothing installed. For tests."""
    global config, reporter
    set_flag(True, None)
    active.clear()
    config = None
    reporter = None
    listeners.clear()
