"""The exceptions cgguard raises, all under one root."""

# Imported at start-up whenever a CGGUARD_* variable other than a plain CGGUARD_ENABLED=1 is
# set (the settings parser needs the rule names): no ``typing`` or ``__future__`` here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


class CgguardError(Exception):
    """Root of every exception cgguard raises."""


class ConfigError(CgguardError, ValueError):
    """A configuration value is not one cgguard accepts."""


class CaptureViolation(CgguardError, RuntimeError):  # noqa: N818 - the public name users catch
    """A CUDA-graph capture broke one of cgguard's rules.

    A RuntimeError, so handlers written for torch's own capture failures still catch it.
    ``event`` is the violation's full event, as reported (see docs/rules-and-events.md).
    """

    rule: str = ""  # the rule's name; cgguard._rules.table builds its table from these

    def __init__(self, message: str, event: "Mapping[str, object] | None" = None) -> None:
        super().__init__(message)
        self.event: Mapping[str, object] = event if event is not None else {}


def hidden_by_pytest(excinfo: object) -> bool:
    """Whether pytest leaves a module's frames out of a traceback: a violation's.

    Set as a module's ``__tracebackhide__`` (pytest reads it from a frame's locals, then from
    its module's globals, so it costs the module's hot paths nothing): cgguard's frames lie
    between the user's call and the raise, so the traceback ends at the user's line that broke
    the rule. Any other error keeps them, so that cgguard's own stays traceable.
    """
    return excinfo is not None and isinstance(getattr(excinfo, "value", None), CaptureViolation)


class CaptureDisabledError(CaptureViolation):
    """A capture began while capture was disabled."""

    rule = "capture_disabled"


class NestedCaptureError(CaptureViolation):
    """A capture began on a thread that already had an active capture."""

    rule = "nested_capture"


class ConcurrentCaptureError(CaptureViolation):
    """A capture began while another thread was capturing, one of them in "global" mode."""

    rule = "concurrent_capture"


class SyncDuringCaptureError(CaptureViolation):
    """A synchronize was called on a thread that is capturing."""

    rule = "sync_during_capture"


class AbandonedCaptureError(CaptureViolation):
    """A thread ended while a capture it began was active (reported, never raised)."""

    rule = "abandoned_capture"


class ImplicitSyncError(CaptureViolation):
    """An operator that synchronizes the device (``.item()``, ``nonzero``, ...) was called
    during a capture (refused before it ran)."""

    rule = "implicit_sync"


class DeadInputError(CaptureViolation):
    """A graph was replayed after a tensor its capture read had been freed or moved."""

    rule = "dead_input"


class StaleBindingError(CaptureViolation):
    """A graph was replayed after a name its capture read a tensor by had been rebound to
    another tensor (another storage, dtype, shape, strides or offset)."""

    rule = "stale_binding"


class RngDuringCaptureError(CaptureViolation):
    """The CUDA random-number generator was seeded or its state read or set during a capture."""

    rule = "rng_during_capture"


class FirstUseInCaptureError(CaptureViolation):
    """A communication resource was first used inside a capture: a process group that had run
    no collective outside one, or a symmetric-memory rendezvous or allocation."""

    rule = "first_use_in_capture"


class RankDivergenceError(CaptureViolation):
    """The ranks of a job captured differently: other graphs, keys or collectives, or a rank
    that did not reach the check (cgguard.check_ranks())."""

    rule = "rank_divergence"


# Shown, pickled and documented by the name users import them by: a traceback's last line reads
# ``cgguard.NestedCaptureError``, and pickle finds each class again through ``cgguard``'s own
# attribute (its lazy __getattr__), so that a violation crosses process boundaries. Every
# exception class here is public, re-exported by ``cgguard``.
for _public in [v for v in list(globals().values()) if isinstance(v, type)]:
    if issubclass(_public, CgguardError):
        _public.__module__ = "cgguard"
del _public
