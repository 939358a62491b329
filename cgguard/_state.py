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

    from cgguard._bridge import FlagSource
    from cgguard._config import Config
    from cgguard._frames import Snapshot
    from cgguard._guard import Record
    from cgguard._ledger import Ledger
    from cgguard._report import Reporter

# The capture flag and where it got its value (None: from configuration, or never changed).
capture_enabled: bool = True
capture_changed_at: "Snapshot | None" = None

# Captures begun and not yet ended, by id() of the CUDAGraph that holds them.
active: "dict[int, Record]" = {}


# Captures torch.cuda.graph.__enter__ is preparing, by (thread id, id() of the CUDAGraph): the
# record of each, and whether there was nothing to check, for the capture_begin it makes.
entering: "dict[tuple[int, int], tuple[Record, bool]]" = {}

# Other frameworks' capture flags that cgguard follows (cgguard._bridge); all must allow.
flag_sources: "list[FlagSource]" = []

# What install() set up; None while not installed.
config: "Config | None" = None
reporter: "Reporter | None" = None
ledger: "Ledger | None" = None
# Called when a violation is first seen at a new site: keeps the JSON report current.
on_new_site: "Callable[[], None] | None" = None

# What cgguard._patches replaced on torch, as (owner, attribute name, original), in order.
patches: list[tuple[type, str, object]] = []

# torch._C._cuda_synchronize as (original, cgguard's wrapper) while cgguard wraps it; it comes
# and goes with the simulated runtime on CPU builds, so it is kept apart from ``patches``.
device_sync: "tuple[object, object] | None" = None

# Called with every violation's full event, whatever the logging; for cgguard.testing.
listeners: "list[Callable[[dict[str, object]], None]]" = []


def set_flag(enabled: bool, changed_at: "Snapshot | None") -> None:
    global capture_enabled, capture_changed_at
    # Origin first: a reader that sees the new value must not see the old origin.
    capture_changed_at = changed_at
    capture_enabled = enabled


def reset() -> None:
    """Forget everything: the flag enabled, no captures, nothing installed. For tests."""
    global config, reporter, ledger, on_new_site
    set_flag(True, None)
    active.clear()
    entering.clear()
    flag_sources.clear()
    config = None
    reporter = None
    ledger = None
    on_new_site = None
    listeners.clear()
