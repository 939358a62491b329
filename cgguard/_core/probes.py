"""What the capture path and inspection ask of torch and of the device, answered by
cgguard._core.patches: the one seam between cgguard's decisions and the runtime underneath."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from cgguard._rules.record import STREAM

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._rules.record import Record

# torch's CUDAGraph::capture_end refuses before cudaStreamEndCapture when called on another
# stream than the capture's (aten/src/ATen/cuda/CUDAGraph.cpp: TORCH_CHECK(stream ==
# capture_stream_, ...)); the capture then goes on. Every later failure comes after CUDA has
# ended the capture, successfully or not.
_STILL_CAPTURING = "Capture must end on the same stream it began on"


def _no(*_: object) -> bool:
    return False


def _none() -> None:
    return None


def _nothing(_: str) -> None:
    return None


def runs_kernels(tensor: Any) -> bool:
    """Whether ``tensor``, a tensor on the device it says, has memory a kernel would run on:
    not a meta tensor, nor a fake one (torch's FakeTensor says the device it stands for and
    keeps a meta tensor's storage: torch/_subclasses/fake_tensor.py, FakeTensor.__new__). A
    tensor without a storage of its own (sparse) counts: its values are the device's."""
    try:
        return bool(tensor.untyped_storage().device.type != "meta")
    except Exception:
        return True


class Device(NamedTuple):
    """What a runtime standing in for CUDA's device says where torch cannot: one whose device
    memory is the host's, say, put in place over torch's entry points (cgguard._install's
    ``torch_changed``). Inspection asks it, through the probes, rather than torch."""

    on_device: Callable[[Any], bool]  # whether an op's argument is a device tensor
    every_tensor: bool  # every tensor is one: the per-tensor test can be skipped
    # Told of an implicit synchronize inspection let through: a runtime that cannot see it
    # itself fails the capture as CUDA would.
    waited: Callable[[str], None]
    allocator: bool  # whether torch's caching allocator says whose pool a block is in


class Probes(NamedTuple):
    """What the capture path asks torch, and inspection the device."""

    is_capturing: Callable[[], bool]  # whether the current stream captures
    current_stream: Callable[[], Any]
    is_current_stream: Callable[[Any], bool]
    stream_captures: Callable[[Any], bool]  # whether a given stream captures
    # The allocator's statistics of the current device, (device, reserved bytes, allocated
    # bytes), read once; None where torch has no CUDA allocator (CPU builds), and the probe
    # answers None while CUDA is not initialised.
    memory: Callable[[], tuple[int, int, int] | None] | None = None
    # The device's answers, as a Device says them: torch's own unless one is in place.
    on_device: Callable[[Any], bool] = _no
    every_tensor: bool = False
    waited: Callable[[str], None] = _nothing
    allocator: bool = False

    def over(self, device: Device | None) -> Probes:
        """These probes, with ``device``'s answers in place of torch's where one is given."""
        return self if device is None else self._replace(**device._asdict())

    # The questions the capture path asks of streams: never raising, whatever torch does.

    def stream(self) -> Any:
        """The current stream; None where it cannot be told."""
        try:
            return self.current_stream()
        except Exception:
            return None

    def began(self, record: Record, *, unknown: bool = False) -> bool:
        """Whether ``record``'s stream captures (``unknown`` where that cannot be told)."""
        stream = record[STREAM]
        try:
            if stream is None:
                return unknown
            return self.stream_captures(stream)
        except Exception:
            return unknown

    def still_capturing(self, error: BaseException) -> bool:
        """Whether the capture that a capture_end failing with ``error`` was ending goes on."""
        if _STILL_CAPTURING in str(error):
            return True  # refused on another stream: the capture's own stream still captures
        try:
            # On the capture's stream: anything that failed before CUDA ended the capture (a
            # bad argument, an interrupt) leaves that stream capturing.
            return self.is_capturing()
        except Exception:
            return False


# Without torch: nothing captures, and no stream is known (so no record is ever found stale).
NO_TORCH = Probes(_no, _none, _no, _no)
