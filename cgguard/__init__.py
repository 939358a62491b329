"""cgguard: guard every CUDA-graph capture in a PyTorch process.

The public API is re-exported here lazily: ``import cgguard`` loads nothing else until a name is
used, so that activation in every process costs nothing until torch is imported.

PYTEST_DONT_REWRITE: activation imports cgguard before pytest starts, so pytest, which rewrites
its plugins' packages, would warn (an error under ``filterwarnings = error``) that it cannot.
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cgguard._boot import activate
    from cgguard._config.config import Config
    from cgguard._data.rank_compare import RankDifference
    from cgguard._errors import (
        AbandonedCaptureError,
        CaptureDisabledError,
        CaptureViolation,
        CgguardError,
        ConcurrentCaptureError,
        ConfigError,
        DeadInputError,
        FirstUseInCaptureError,
        ImplicitSyncError,
        NestedCaptureError,
        RankDivergenceError,
        RngDuringCaptureError,
        StaleBindingError,
        SyncDuringCaptureError,
    )
    from cgguard._inspect.bindings import StaleBinding
    from cgguard._install import (
        Status,
        census,
        check_bindings,
        check_ranks,
        install,
        is_installed,
        status,
        uninstall,
    )
    from cgguard._switch import (
        capture_disabled,
        capture_enabled,
        follow_flag,
        is_capture_enabled,
        set_capture_enabled,
    )
    from cgguard._version import __version__

__all__ = [
    "AbandonedCaptureError",
    "CaptureDisabledError",
    "CaptureViolation",
    "CgguardError",
    "ConcurrentCaptureError",
    "Config",
    "ConfigError",
    "DeadInputError",
    "FirstUseInCaptureError",
    "ImplicitSyncError",
    "NestedCaptureError",
    "RankDifference",
    "RankDivergenceError",
    "RngDuringCaptureError",
    "StaleBinding",
    "StaleBindingError",
    "Status",
    "SyncDuringCaptureError",
    "__version__",
    "activate",
    "capture_disabled",
    "capture_enabled",
    "census",
    "check_bindings",
    "check_ranks",
    "follow_flag",
    "install",
    "is_capture_enabled",
    "is_installed",
    "set_capture_enabled",
    "status",
    "uninstall",
]

# Where each public name lives, below this face.
_HOMES = {
    "AbandonedCaptureError": "cgguard._errors",
    "CaptureDisabledError": "cgguard._errors",
    "CaptureViolation": "cgguard._errors",
    "CgguardError": "cgguard._errors",
    "ConcurrentCaptureError": "cgguard._errors",
    "Config": "cgguard._config.config",
    "ConfigError": "cgguard._errors",
    "DeadInputError": "cgguard._errors",
    "FirstUseInCaptureError": "cgguard._errors",
    "ImplicitSyncError": "cgguard._errors",
    "NestedCaptureError": "cgguard._errors",
    "RankDifference": "cgguard._data.rank_compare",
    "RankDivergenceError": "cgguard._errors",
    "RngDuringCaptureError": "cgguard._errors",
    "StaleBinding": "cgguard._inspect.bindings",
    "StaleBindingError": "cgguard._errors",
    "Status": "cgguard._install",
    "SyncDuringCaptureError": "cgguard._errors",
    "__version__": "cgguard._version",
    "activate": "cgguard._boot",
    "capture_disabled": "cgguard._switch",
    "capture_enabled": "cgguard._switch",
    "census": "cgguard._install",
    "check_bindings": "cgguard._install",
    "check_ranks": "cgguard._install",
    "follow_flag": "cgguard._switch",
    "install": "cgguard._install",
    "is_capture_enabled": "cgguard._switch",
    "is_installed": "cgguard._install",
    "set_capture_enabled": "cgguard._switch",
    "status": "cgguard._install",
    "uninstall": "cgguard._install",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cgguard' has no attribute {name!r}")
    # The import statement's machinery, not importlib's package: ``cgguard.activate`` is read
    # at every activated start-up, where importing importlib would cost more than the rest.
    __import__(home)
    value = getattr(sys.modules[home], name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
