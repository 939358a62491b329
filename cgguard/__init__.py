"""cgguard: guard every CUDA-graph capture in a PyTorch process.

The public API is re-exported here lazily: ``import cgguard`` loads nothing else until a name is
used, so that activation in every process costs nothing until torch is imported.

PYTEST_DONT_REWRITE: activation imports cgguard before pytest starts, so pytest, which rewrites
its plugins' packages, would warn (an error under ``filterwarnings = error``) that it cannot.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cgguard._config import Config
    from cgguard._errors import (
        AbandonedCaptureError,
        CaptureDisabledError,
        CaptureViolation,
        CgguardError,
        ConcurrentCaptureError,
        ConfigError,
        DeadInputError,
        ImplicitSyncError,
        NestedCaptureError,
        RngDuringCaptureError,
        SyncDuringCaptureError,
    )
    from cgguard._flag import (
        capture_disabled,
        capture_enabled,
        is_capture_enabled,
        set_capture_enabled,
    )
    from cgguard._follow import follow_flag
    from cgguard._install import Status, census, install, is_installed, status, uninstall
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
    "ImplicitSyncError",
    "NestedCaptureError",
    "RngDuringCaptureError",
    "Status",
    "SyncDuringCaptureError",
    "__version__",
    "capture_disabled",
    "capture_enabled",
    "census",
    "follow_flag",
    "install",
    "is_capture_enabled",
    "is_installed",
    "set_capture_enabled",
    "status",
    "uninstall",
]

_HOMES = {
    "Config": "_config",
    "AbandonedCaptureError": "_errors",
    "CaptureDisabledError": "_errors",
    "CaptureViolation": "_errors",
    "CgguardError": "_errors",
    "ConcurrentCaptureError": "_errors",
    "ConfigError": "_errors",
    "NestedCaptureError": "_errors",
    "DeadInputError": "_errors",
    "ImplicitSyncError": "_errors",
    "RngDuringCaptureError": "_errors",
    "SyncDuringCaptureError": "_errors",
    "follow_flag": "_follow",
    "capture_disabled": "_flag",
    "capture_enabled": "_flag",
    "is_capture_enabled": "_flag",
    "set_capture_enabled": "_flag",
    "census": "_install",
    "install": "_install",
    "is_installed": "_install",
    "status": "_install",
    "Status": "_install",
    "uninstall": "_install",
    "__version__": "_version",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cgguard' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"cgguard.{home}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
