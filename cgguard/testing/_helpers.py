"""The simulated CUDA runtime in place beside an installed cgguard, and a violation recorder."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from cgguard.testing._simcuda import SESSION_MAX_CALLS, active, simulated_runtime

if TYPE_CHECKING:
    from collections.abc import Iterator

    from cgguard._data.schema import ViolationEvent
    from cgguard.testing._simcuda import SimulatedCuda


@contextlib.contextmanager
def simulated_cuda(*, force: bool = False, max_calls: int | None = None) -> Iterator[SimulatedCuda]:
    """Run torch's real CUDA-graph code over cgguard's simulated CUDA runtime (no GPU).

    Replaces torch.cuda's graph, stream and event entry points with stand-ins for the duration
    and restores every one on exit; GPU code's requests for CUDA memory (``device="cuda"``,
    ``.cuda()``, ``model.cuda()``) get host memory meanwhile, and torch.cuda's device calls
    answer for one simulated device, cuda:0. Runs on CPU-only and CUDA builds of torch;
    refuses where a CUDA device is available unless ``force``. Composes with an installed
    cgguard, in either order: while both are in place, the simulated device synchronize is
    guarded, and so are the stand-ins where they do not extend torch's classes (CUDA builds).
    The runtime's ``calls`` are every call it received, or the latest ``max_calls`` of them.
    """
    # Imported here, as the composition root is in each helper: importing cgguard.testing
    # (pytest's plugin does, in every run) loads none of it.
    from cgguard import _install

    # cgguard lets go of what the simulation is about to replace (torch's own synchronize on a
    # CUDA build, the simulated one on the way out) and takes up what replaced it.
    with simulated_runtime(
        force=force,
        unhook=_install.torch_changing,
        rehook=_install.torch_changed,
        max_calls=max_calls,
    ) as runtime:
        yield runtime


def active_simulation() -> SimulatedCuda | None:
    """The simulated CUDA runtime in place now, if any."""
    return active()


@contextlib.contextmanager
def capture_violations() -> Iterator[list[ViolationEvent]]:
    """Collect the full event of every violation reported inside the block, in order.

    Independent of logging: every violation is seen, whatever the configured output.
    """
    from cgguard import _process

    events: list[ViolationEvent] = []
    listener = events.append
    _process.PROCESS.listeners.append(listener)
    try:
        yield events
    finally:
        _process.PROCESS.listeners.remove(listener)


_session: contextlib.ExitStack | None = None


def start_session_simulation() -> None:
    """The simulated runtime for the rest of the process (CGGUARD_SIMULATE_CUDA activation)."""
    import atexit

    from cgguard._support.warn import warn_once

    global _session
    if _session is not None:
        return
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(simulated_cuda(max_calls=SESSION_MAX_CALLS))
    except Exception as exc:  # e.g. a usable CUDA device: guard it all the same, unsimulated
        warn_once("simulation", f"CGGUARD_SIMULATE_CUDA: no simulated CUDA runtime: {exc}")
        return
    _session = stack
    # Left at exit while the interpreter is still whole; a generator closed by the garbage
    # collector at shutdown would run its clean-up with its module's globals already gone.
    atexit.register(stack.close)
    warn_once(
        "simulation",
        "CGGUARD_SIMULATE_CUDA: torch.cuda runs on cgguard's simulated CUDA runtime "
        "(no GPU work; results are not GPU results)",
    )


@contextlib.contextmanager
def bindings_kept() -> Iterator[None]:
    """Run the block (a weight reload, a LoRA load, a wake from sleep) and fail, with an
    AssertionError holding each stale_binding message, if after it any live graph captured
    under inspection reads a tensor whose name the block rebound (cgguard.check_bindings()).

    With inspection off, or no graph captured under it, there is nothing to check: it passes.
    """
    from cgguard import _install

    yield
    with capture_violations() as events:
        stale = _install.check_bindings()
    if stale:
        said = [e["message"] for e in events if e.get("rule") == "stale_binding"]
        raise AssertionError(
            "\n".join(said)
            or "\n".join(f"{s.name} {s.change} (captured at {s.site})" for s in stale)
        )
