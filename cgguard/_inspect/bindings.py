"""Bindings: the names by which the program holds a graph's inputs, and whether each name still
holds the tensor the graph baked in (the stale_binding rule).

A graph replays the addresses, dtypes, shapes, strides and offsets its capture read. A program
that later *rebinds* a name to a new tensor (``module.w = nn.Parameter(...)``, ``p.data = q``,
``module.to(dtype)``, ``self.x = self.x.to(...)``) rather than copying into the old one leaves
the graph reading the old memory: wrong output while it lives, an illegal access once it is
freed. dead_input sees the second; this sees the first.

When an inspected capture ends, each external input (cgguard._inspect.liveness) is named by
where the program holds it: a walk from the capture's frames (their locals and globals) through
``nn.Module`` parameters, buffers and submodules, plain attributes, dicts, lists, tuples,
``functools.partial`` and closures, bounded in depth and in objects. A name is kept as a path
from an object held weakly (nothing is kept alive for it), with the tensor's identity then:
storage pointer, dtype, shape, strides and storage offset. Where the capture read the tensor
object a name holds, only such names are kept: a view kept under another name is not what the
graph reads.

Names are resolved again only when the epoch moved (cgguard._inspect.inspections.Epoch): the
paths cgguard sees that can rebind a name move it, so a replay whose bindings have not moved
pays one comparison.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections import deque
from types import FunctionType
from typing import TYPE_CHECKING, Any, NamedTuple

from cgguard._support.frames import visible

if TYPE_CHECKING:
    from collections.abc import Generator, Iterator
    from types import FrameType

    from cgguard._inspect.inspections import Epoch
    from cgguard._inspect.liveness import Input, Inputs
    from cgguard._support.frames import Snapshot

# How far the walk goes from a frame's variables, how many objects it looks at in all, and how
# many names it keeps per input: a model of thousands of layers is a few levels and some
# thousands of objects deep.
MAX_DEPTH = 10
MAX_OBJECTS = 20_000
NAMES_PER_INPUT = 4
# The innermost frames of the user's whose variables the walk starts from: the capturing
# function, the runner that calls it, and a few more; not a test runner's or a server's own.
MAX_FRAMES = 6
# Items looked at per container: a cache of a million entries is not walked through.
MAX_ITEMS = 10_000

# The kinds of step along a name.
_ATTR, _ITEM, _ARG, _KEYWORD, _CELL = range(5)
_MISSING: Any = object()

# An identity: (storage pointer, dtype, shape, strides, storage offset).
Identity = tuple[int, Any, tuple[int, ...], tuple[int, ...], int]


class _Node:
    """One step of a name from the object it starts from; the names of one graph share their
    first steps (``runner.model.layers.3``), so that a check resolves each step once."""

    __slots__ = ("key", "kind", "parent")

    def __init__(self, parent: _Node | None, kind: int, key: Any) -> None:
        self.parent = parent
        self.kind = kind
        self.key = key

    def steps(self) -> list[tuple[int, Any]]:
        node: _Node | None = self
        found = []
        while node is not None:
            found.append((node.kind, node.key))
            node = node.parent
        return found[::-1]


class Binding:
    """One name of a graph's input: a path from an object held weakly, and what it held."""

    __slots__ = ("address", "anchor", "dtype", "identity", "name", "node", "ptr", "shape", "stride")

    def __init__(
        self, name: str, anchor: Any, node: _Node, tensor: Any, identity: Identity
    ) -> None:
        self.name = name  # as a report shows it: runner.model.layers.3.self_attn.W_UV
        self.anchor = weakref.ref(anchor)
        self.node = node
        self.identity = identity
        self.address = identity[0]  # its storage's, as the capture's inputs are keyed
        # What a check compares first, each one call: the first element's address (storage and
        # offset), dtype, shape and strides.
        self.ptr = tensor.data_ptr()
        self.dtype = tensor.dtype
        self.shape = tensor.shape
        self.stride = tensor.stride()

    def rebound_at(self, epoch: Epoch) -> Snapshot | None:
        """Where ``epoch`` saw this name's path rebound last (the innermost step it saw)."""
        value = self.anchor()
        rebound = None
        for kind, key in self.node.steps():
            if value is None or value is _MISSING:
                break
            if kind == _ATTR:
                rebound = epoch.rebound_at(value, key) or rebound
            value = _step(value, kind, key)
        if value is not None and value is not _MISSING:
            rebound = epoch.rebound_at(value, "data") or rebound
        return rebound


def resolve(node: _Node, anchor: Any, memo: dict[int, Any]) -> Any:
    """What ``node``'s path from ``anchor`` holds now (_MISSING where it leads nowhere): the
    steps above it resolved once per ``memo``, shared by its siblings."""
    parent = node.parent
    if parent is None:
        value = anchor
    else:
        value = memo.get(id(parent), memo)
        if value is memo:
            value = memo[id(parent)] = resolve(parent, anchor, memo)
    if value is _MISSING:
        return _MISSING
    return _step(value, node.kind, node.key)


class StaleBinding(NamedTuple):
    """A binding whose name holds another tensor now (``check_bindings()`` returns these)."""

    name: str  # runner.model.layers[3].self_attn.W_UV
    site: str  # where the graph's capture began: file:line (in function)
    change: str  # what changed, in words
    rebound_at: str | None  # where cgguard saw the name rebound, file:line (in function)


def changed(bindings: list[Binding], tensor_type: type) -> list[tuple[Binding, str]]:
    """Each of ``bindings`` whose name holds another tensor now, with how it changed, in words;
    a name whose object it starts from is gone is left out (nothing to compare).

    A check of a thousand names must cost well under a millisecond: each step above a name is
    resolved once for all its siblings, and a name that still holds its tensor is told so by
    four comparisons inline; only a changed one is put in words."""
    memo: dict[int, Any] = {}
    found = []
    # A name's siblings come one after the other (a layer's weight and bias): the object they
    # are read from is resolved once for them.
    last: Any = None
    above: Any = None
    for binding in bindings:
        anchor = binding.anchor()
        if anchor is None:
            continue
        node = binding.node
        if node.parent is None:
            above = anchor
        elif node.parent is not last:
            last = node.parent
            above = resolve(last, anchor, memo)
        now = _MISSING if above is _MISSING else _step(above, node.kind, node.key)
        try:
            if (
                now.data_ptr() == binding.ptr
                and now.dtype is binding.dtype
                and now.shape == binding.shape
                and now.stride() == binding.stride
            ):
                continue
        except Exception:  # noqa: S110 - no tensor, or none with memory: _change says which
            pass
        change = _change(binding, now, tensor_type)
        if change is not None:
            found.append((binding, change))
    return found


def _change(binding: Binding, now: Any, tensor_type: type) -> str | None:
    """How what ``binding``'s name holds ``now`` differs from what the graph baked in; None
    for a tensor with no memory of its own, which no graph could read."""
    if now is _MISSING:
        return "is gone (its object no longer has it)"
    if not isinstance(now, tensor_type):
        return f"now holds {type(now).__name__}, not a tensor"
    identity = identity_of(now)
    if identity is None or identity == binding.identity:
        return None
    return f"now holds another tensor ({changes(binding.identity, identity)})"


def identity_of(tensor: Any) -> Identity | None:
    """A tensor's identity as a graph bakes it in, or None where it has no memory to read."""
    try:
        storage = tensor.untyped_storage()
        if storage.device.type == "meta":
            return None
        return (
            storage.data_ptr(),
            tensor.dtype,
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.storage_offset(),
        )
    except Exception:
        return None


def changes(old: Identity, new: Identity) -> str:
    """What differs between two identities, in words."""
    said = []
    if old[0] != new[0]:
        said.append(f"another storage: {old[0]:#x} then, {new[0]:#x} now")
    names = ("dtype", "shape", "strides", "storage offset")
    for name, before, after in zip(names, old[1:], new[1:], strict=True):
        if before != after:
            shown = [str(v).removeprefix("torch.") for v in (before, after)]
            said.append(f"{name} {shown[0]} then, {shown[1]} now")
    return "; ".join(said) or "another tensor object"


def name_inputs(
    inputs: Inputs, frame: FrameType | None, tensor_type: type, module_type: type | None
) -> list[Binding]:
    """Name each external input of ``inputs`` from the frames from ``frame`` outwards: at most
    NAMES_PER_INPUT names each, the shortest first; names the capture read the very tensor of
    preferred to names of another view of its storage. The walk ends once each input has been
    found by its very tensor."""
    seen = inputs.seen
    wanted: dict[int, Input] = {i.address: i for i in inputs.external if seen.get(i.address) is i}
    if not wanted:
        return []
    left = set(wanted)
    exact: dict[int, list[Binding]] = {}
    other: dict[int, list[Binding]] = {}
    nodes: dict[tuple[int, int, Any], _Node] = {}
    for tensor, anchor, steps, name in _walk(_roots(frame), tensor_type, module_type):
        identity = identity_of(tensor)
        if identity is None or identity[0] not in wanted:
            continue
        item = wanted[identity[0]]
        read = item.tensor() if item.tensor is not None else None
        if anchor is not None and steps:  # else a frame's own variable: no name to resolve
            found = exact if read is tensor else other
            names = found.setdefault(identity[0], [])
            if len(names) < NAMES_PER_INPUT:
                names.append(Binding(name, anchor, _node(nodes, anchor, steps), tensor, identity))
        if read is tensor:
            left.discard(identity[0])
            if not left:
                break
    bindings: list[Binding] = []
    for address in wanted:
        bindings.extend(exact.get(address) or other.get(address) or ())
    return bindings


def _node(
    nodes: dict[tuple[int, int, Any], _Node], anchor: Any, steps: tuple[tuple[int, Any], ...]
) -> _Node:
    """The last node of ``steps`` from ``anchor``, each shared with the names before it."""
    node: _Node | None = None
    for kind, key in steps:
        parent_id = id(anchor) if node is None else id(node)
        made = nodes.get((parent_id, kind, key))
        if made is None:
            made = nodes[(parent_id, kind, key)] = _Node(node, kind, key)
        node = made
    assert node is not None  # noqa: S101 - steps is never empty here
    return node


def _roots(frame: FrameType | None) -> Iterator[list[tuple[str, Any]]]:
    """The variables of the user's frames, in two batches, the second read only if asked for:
    the locals of the innermost frames, innermost first (``self`` named by its class), then the
    globals of their modules, each once."""
    roots: list[tuple[str, Any]] = []
    namespaces: dict[int, dict[str, Any]] = {}
    left = MAX_FRAMES
    while frame is not None and left:
        if visible(frame.f_code):
            left -= 1
            roots.extend(
                ((type(value).__name__ if name == "self" else name), value)
                for name, value in _locals(frame)
            )
            namespaces.setdefault(id(frame.f_globals), frame.f_globals)
        frame = frame.f_back
    yield roots
    yield [item for namespace in namespaces.values() for item in list(namespace.items())]


# Before Python 3.13 (PEP 667), a function frame's f_locals is a dict the frame keeps, filled
# from its fast locals at each read: it would hold each value until the next read, so that
# ``del x`` in the user's code no longer frees x. It is emptied once read: each read fills it
# anew (locals(), a debugger's, a tracer's, whose write-back follows its own read). From 3.13
# f_locals is a view that holds nothing.
_SNAPSHOT_LOCALS = sys.version_info < (3, 13)
_OPTIMIZED = (
    0x1  # CO_OPTIMIZED: a function's frame, whose f_locals is a snapshot, not its namespace
)


def _locals(frame: FrameType) -> list[tuple[str, Any]]:
    namespace = frame.f_locals
    items = list(namespace.items())
    if _SNAPSHOT_LOCALS and frame.f_code.co_flags & _OPTIMIZED and type(namespace) is dict:
        namespace.clear()
    return items


def _walk(
    batches: Iterator[list[tuple[str, Any]]], tensor_type: type, module_type: type | None
) -> Iterator[tuple[Any, Any, tuple[tuple[int, Any], ...], str]]:
    """Each tensor reachable from the roots, breadth first from each batch of them in turn,
    once: (tensor, the object its path starts from, the path's steps from there, its name). A
    path starts from the outermost object that can be held weakly; a tensor with no such object
    above it has None. A later batch is read only once the earlier ones are walked."""
    seen: set[int] = set()
    # (object, anchor, steps from the anchor, name, depth)
    queue: deque[tuple[Any, Any, tuple[tuple[int, Any], ...], str, int]] = deque()
    budget = MAX_OBJECTS
    for roots in batches:
        for name, value in roots:
            if id(value) not in seen and _worth(value):
                seen.add(id(value))
                queue.append((value, None, (), name, 0))
        budget = yield from _breadth(queue, seen, budget, tensor_type, module_type)
        if budget <= 0:
            return


def _breadth(
    queue: deque[tuple[Any, Any, tuple[tuple[int, Any], ...], str, int]],
    seen: set[int],
    budget: int,
    tensor_type: type,
    module_type: type | None,
) -> Generator[tuple[Any, Any, tuple[tuple[int, Any], ...], str], None, int]:
    """Walk ``queue`` breadth first, within ``budget`` objects; the budget left."""
    while queue and budget > 0:
        value, anchor, steps, name, depth = queue.popleft()
        budget -= 1
        if isinstance(value, tensor_type):
            yield value, anchor, steps, name
            continue
        if anchor is None and type(value).__weakrefoffset__:
            anchor, steps = value, ()
        if depth >= MAX_DEPTH:
            continue
        for kind, key, child, text in _children(value, module_type):
            if id(child) in seen or not _worth(child):
                continue
            seen.add(id(child))
            step = (kind, key)
            queue.append((child, anchor, (*steps, step), name + text, depth + 1))
    return budget


# What a walk never goes into: no tensor a graph reads is found there.
_LEAVES = (str, bytes, int, float, complex, bool, type(None), type, range)


def _worth(value: Any) -> bool:
    return not isinstance(value, _LEAVES) and type(value).__name__ != "module"


def _children(value: Any, module_type: type | None) -> Iterator[tuple[int, Any, Any, str]]:
    """(kind, key, child, text) of what ``value`` holds, read without running its code: its
    instance dict, a module's parameters, buffers and submodules, items, a partial's arguments,
    a function's closure."""
    kind = type(value)
    if kind is dict or (isinstance(value, dict) and kind.__module__ == "collections"):
        return _items(value)
    if kind is list or kind is tuple:
        return ((_ITEM, i, child, f"[{i}]") for i, child in _first(enumerate(value)))
    if kind is functools.partial:
        return _arguments(value)
    if kind is FunctionType and value.__closure__:
        return _cells(value)
    return _attributes(value, module_type)


def _items(value: dict[Any, Any]) -> Iterator[tuple[int, Any, Any, str]]:
    for key, child in _first(value.items()):
        if type(key) is str or type(key) is int:  # a subclass's repr would run its code
            yield _ITEM, key, child, f"[{key!r}]"


def _arguments(value: functools.partial[Any]) -> Iterator[tuple[int, Any, Any, str]]:
    for i, child in enumerate(value.args):
        yield _ARG, i, child, f".args[{i}]"
    for key, child in value.keywords.items():
        yield _KEYWORD, key, child, f".keywords[{key!r}]"


def _cells(value: Any) -> Iterator[tuple[int, Any, Any, str]]:
    for name, cell in zip(value.__code__.co_freevars, value.__closure__, strict=False):
        with contextlib.suppress(ValueError):  # an empty cell
            yield _CELL, name, cell.cell_contents, f".<closure {name}>"


def _attributes(value: Any, module_type: type | None) -> Iterator[tuple[int, Any, Any, str]]:
    own = _own_dict(value)
    if own is None:
        return
    if module_type is not None and isinstance(value, module_type):
        for store in _STORES:
            for key, child in (own.get(store) or {}).items():
                if child is not None:
                    yield _ATTR, key, child, f".{key}"
    for key, child in _first(own.items()):
        if isinstance(key, str) and key not in _MODULE_INTERNALS:
            yield _ATTR, key, child, f".{key}"


# An nn.Module's parameters, buffers and submodules, each a dict in its instance dict.
_STORES = ("_parameters", "_buffers", "_modules")


# nn.Module's own bookkeeping in every module's instance dict (hooks, the three stores): none is
# a name the program gives a tensor.
_MODULE_INTERNALS = frozenset(
    {
        "_parameters",
        "_buffers",
        "_modules",
        "_non_persistent_buffers_set",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_is_full_backward_hook",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    }
)


def _first(items: Any) -> Iterator[Any]:
    for i, item in enumerate(items):
        if i >= MAX_ITEMS:
            return
        yield item


def _own_dict(value: Any) -> dict[str, Any] | None:
    """``value``'s instance dict, read as object does: never through a ``__getattr__`` of its
    own, which may run anything (a proxy's makes a new object for every name asked)."""
    if not type(value).__dictoffset__:
        return None
    try:
        own = object.__getattribute__(value, "__dict__")
    except Exception:
        return None
    return own if type(own) is dict else None


def _attr(value: Any, key: str) -> Any:
    # _own_dict inline: a check resolves thousands of these.
    if not type(value).__dictoffset__:
        return _MISSING
    try:
        own = object.__getattribute__(value, "__dict__")
        found = own.get(key, _MISSING)
        if found is _MISSING:
            for store in _STORES:
                held = own.get(store)
                if held is not None and key in held:
                    return held[key]
    except Exception:
        return _MISSING
    return found


def _cell(value: Any, key: str) -> Any:
    return value.__closure__[value.__code__.co_freevars.index(key)].cell_contents


_STEPS: dict[int, Any] = {
    _ATTR: _attr,
    _ITEM: lambda value, key: value[key],
    _ARG: lambda value, key: value.args[key],
    _KEYWORD: lambda value, key: value.keywords[key],
    _CELL: _cell,
}


def _step(value: Any, kind: int, key: Any) -> Any:
    """One step along a name, read as the walk read it; _MISSING where it leads nowhere."""
    if kind == _ATTR:
        return _attr(value, key)
    try:
        return _STEPS[kind](value, key)
    except Exception:
        return _MISSING
