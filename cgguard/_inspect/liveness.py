"""Dead inputs: the tensors a capture read that were allocated outside it, and whether each
still holds the memory the graph baked in.

A graph replays the addresses its capture read. Each external input's storage is held by a
weak reference whose callback marks its graph's inputs dead, so the check at replay of a
healthy graph is one attribute test, never a walk over its inputs. Allocations made by the
capture's own ops are the graph's (its pool), not inputs. A storage that is still alive but
now has another address (``resize_``, ``set_``) has no callback to tell: that is looked for
at a graph's first replay only, in one walk.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any

from cgguard._support.frames import stack_above

if TYPE_CHECKING:
    from cgguard._rules.record import Record
    from cgguard._support.frames import Snapshot


class Input:
    """One external input of a capture: where it was first read, and what became of it."""

    __slots__ = (
        "__weakref__",
        "address",
        "described",
        "freed_at",
        "inputs",
        "read_at",
        "ref",
        "tensor",
    )

    def __init__(
        self, inputs: Inputs, storage: Any, address: int, described: str, tensor: Any = None
    ) -> None:
        self.inputs = inputs
        self.address = address
        self.described = described  # "a float32 tensor of shape (4,)"
        # The tensor object first read, weakly: the names that hold it are the graph's
        # bindings (cgguard._inspect.bindings), rather than another view of its storage.
        self.tensor: weakref.ref[Any] | None = None
        with contextlib.suppress(TypeError):
            self.tensor = weakref.ref(tensor)
        self.read_at: Snapshot = stack_above(3)  # the user's op, beyond the dispatch mode
        self.freed_at: Snapshot | None = None
        self.ref = weakref.ref(storage, self._freed)

    def _freed(self, _: object) -> None:
        # Runs where the last reference went: that frame is where the storage was freed. It
        # must never raise (a weakref callback's error is printed, and lost).
        with contextlib.suppress(Exception):  # under the garbage collector: nothing to tell
            self.freed_at = stack_above(1)
        self.inputs.healthy = False

    def moved(self) -> bool:
        """Whether the storage lives on at another address (or none: resized to nothing)."""
        storage = self.ref()
        if storage is None:
            return False
        try:
            return bool(storage.data_ptr() != self.address)
        except Exception:
            return False


class Inputs:
    """The external inputs of one capture, by storage address, and its own allocations."""

    __slots__ = (
        "__weakref__",
        "bindings",
        "checked",
        "epoch",
        "external",
        "healthy",
        "record",
        "seen",
    )

    def __init__(self, record: Record) -> None:
        # The capture's record, its begin stack resolved once the capture has ended.
        self.record = record
        # Each storage address the capture has seen: its Input, or None for the capture's own
        # allocation. One dictionary, so that an op's tensor seen before costs one look-up.
        self.seen: dict[int, Input | None] = {}
        # The inputs alone, in the order first read: a capture of thousands of ops makes
        # thousands of its own allocations, which naming its inputs need not look through.
        self.external: list[Input] = []
        # False once an input's storage was freed, or before the first replay's walk: the one
        # test a replay pays.
        self.healthy = False
        self.checked = False  # whether the first replay's walk for moved storages was made
        # The names of its inputs (cgguard._inspect.bindings), and the epoch they were last
        # checked at: a replay resolves them again only when the epoch has moved since.
        self.bindings: list[Any] = []
        self.epoch = -1

    def read(self, storage: Any, address: int, tensor: Any) -> None:
        """The capture read ``tensor`` (on ``storage`` at ``address``): an input unless the
        capture allocated it, noted at its first read."""
        if address not in self.seen:
            item = self.seen[address] = Input(self, storage, address, describe(tensor), tensor)
            self.external.append(item)

    def made(self, address: int) -> None:
        """The capture's own op allocated (or wrote) the storage at ``address``."""
        if address not in self.seen:
            self.seen[address] = None

    def dead(self) -> list[tuple[Input, str]]:
        """Each input that is gone, with how: freed, or moved."""
        found = []
        for item in list(self.seen.values()):
            if item is None:
                continue
            if item.ref() is None:
                found.append((item, "freed"))
            elif not self.checked and item.moved():
                found.append((item, "moved"))
        self.checked = True
        return found

    def forget(self, item: Input) -> None:
        """Stop counting ``item`` (it proved to be the graph's own memory)."""
        self.seen[item.address] = None


def describe(tensor: Any) -> str:
    """A tensor as a message names it: its dtype and shape."""
    try:
        dtype = str(tensor.dtype).removeprefix("torch.")
        return f"a {dtype} tensor of shape {tuple(tensor.shape)}"
    except Exception:
        return "a tensor"
