"""The CUDA random-number generator during a capture: which of torch.cuda's seeding and state
functions torch refuses while a graph captures, release by release (rng_during_capture)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

# torch.cuda's functions that seed the CUDA generator or read or set its state, each judged by
# rng_refused. torch.manual_seed and torch.seed reach manual_seed_all and seed_all through
# torch.cuda's attributes, looked up at each call (torch/random.py).
RNG_FUNCTIONS = (
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "get_rng_state",
    "get_rng_state_all",
    "set_rng_state",
    "set_rng_state_all",
)

# What torch's CUDAGeneratorImpl refuses during a capture
# (aten/src/ATen/cuda/CUDAGeneratorImpl.cpp):
# - seed() (torch.cuda.seed, seed_all): assertNotCapturing("Cannot call CUDAGeneratorImpl::seed"),
#   in every release.
# - Before torch 2.10, everything else too: set_current_seed (manual_seed, and set_state through
#   it) and current_seed (which get_state reads) each call assertNotCapturing.
# - From torch 2.10 (pytorch/pytorch#162505, "Make torch.cuda.rng_set_state() and
#   torch.cuda.rng_get_state() work during stream capture"), current_seed() checks nothing, so
#   get_state (get_rng_state) is allowed; set_current_seed, during a capture, only
#   TORCH_CHECKs that the seed is unchanged ("can be called during stream capture only if new
#   seed is the same as the original seed"), a no-op; set_philox_offset_per_thread stores the
#   offset into the capture's own state. So manual_seed and set_rng_state are refused only
#   when they change the seed: torch.utils.checkpoint(preserve_rng_state=True) inside a graph
#   rewinds the offset with get/set_rng_state and is allowed.
# The release is inferred from the pull request's merge date (September 2025), not read from a
# tagged release's source: a GPU run of the probe's RNG scenarios on each release settles it.
_RNG_IN_CAPTURE_SINCE = (2, 10)


def rng_refused(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether torch refuses ``torch.cuda.<name>(*args, **kwargs)`` during a capture."""
    if name in ("seed", "seed_all"):
        return True
    if _torch_version() < _RNG_IN_CAPTURE_SINCE:
        return True
    if name in ("get_rng_state", "get_rng_state_all"):
        return False
    try:
        return any(seed != current_seed(index) for index, seed in _seeds_set(name, args, kwargs))
    except Exception:
        return True  # not known (no CUDA generator to read): reported, as torch may refuse it


def _seeds_set(
    name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[tuple[int, int]]:
    """The (device index, seed) pairs a manual_seed or set_rng_state call would set."""
    torch = sys.modules["torch"]
    count = torch.cuda.device_count()
    if name in ("manual_seed", "manual_seed_all"):
        seed = int(args[0] if args else kwargs["seed"]) & 0xFFFF_FFFF_FFFF_FFFF
        if name == "manual_seed":
            return [(torch.cuda.current_device(), seed)]
        # No device counted (a runtime standing in for CUDA's): device 0's, whose seed is then
        # not known.
        return [(index, seed) for index in range(count or 1)]
    if name == "set_rng_state":
        state = args[0] if args else kwargs["new_state"]
        device = args[1] if len(args) > 1 else kwargs.get("device", "cuda")
        if isinstance(device, int):
            index: int | None = device
        else:
            index = torch.device(device).index
        if index is None:
            index = torch.cuda.current_device()
        return [(index, _seed_in(state))]
    # set_rng_state_all(new_states)
    states = args[0] if args else kwargs["new_states"]
    return [(index, _seed_in(state)) for index, state in enumerate(states)]


def _seed_in(state: Any) -> int:
    """The seed a CUDA RNG state holds: its first 8 bytes (CUDAGeneratorImpl::set_state)."""
    return int.from_bytes(state.numpy().tobytes()[:8], sys.byteorder)


def current_seed(index: int) -> int:
    """The seed of device ``index``'s default CUDA generator (allowed during a capture from
    torch 2.10)."""
    torch = sys.modules["torch"]
    return int(torch.cuda.default_generators[index].initial_seed())


def _torch_version() -> tuple[int, int]:
    version = str(getattr(sys.modules.get("torch"), "__version__", "0.0"))
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c in "0123456789") or 0)
