"""What moves the bindings' epoch (cgguard._inspect.bindings): the Python paths by which a
program rebinds a name a graph may read, each wrapped while inspection is on.

- ``nn.Module.__setattr__`` of a tensor or a module (``module.w = nn.Parameter(...)``,
  ``self.x = self.x.to(...)``, ``load_state_dict(assign=True)``, a submodule replaced), with
  where it happened;
- a tensor's ``.data =`` (``p.data = q``; ``Module._apply`` does it for ``.to()``/``.half()``),
  with where it happened: torch.Tensor's own ``data`` is a C descriptor of torch._C.TensorBase,
  which a property on torch.Tensor takes the place of for Python code (subclasses, Parameter
  among them, inherit it);
- ``nn.Module._apply`` and ``load_state_dict``, once they return.

A rebinding none of these sees (an assignment from C++ or from inside a torch.compile'd
function, an item of a dict or an attribute of an object that is not a module) is found by
``cgguard.check_bindings()``, which moves the epoch itself, and after a framework's lifecycle
function (cgguard._gate.profiles).
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

from cgguard._inspect.lifecycle import after

if TYPE_CHECKING:
    from collections.abc import Callable

    from cgguard._inspect.inspections import Epoch


def hooks(
    epoch: Epoch, tensor: type, module: type, compiling: Callable[[], bool]
) -> list[tuple[Any, str, Callable[[Any], Any]]]:
    """The (owner, name, make) of each path that moves ``epoch``. ``compiling``:
    ``torch.compiler.is_compiling``, which dynamo reads as true while it traces: a compiled
    function that sets an attribute is traced through torch's own setattr, not through what
    would break its graph (a frame walk). Compiled code applies its sets without coming here
    again: those are for check_bindings() to find."""
    return [
        (module, "__setattr__", functools.partial(_setattr, epoch, (tensor, module), compiling)),
        (module, "_apply", functools.partial(_moving, epoch)),
        (module, "load_state_dict", functools.partial(_moving, epoch)),
        (tensor, "data", functools.partial(_data, epoch, compiling)),
    ]


def _setattr(
    epoch: Epoch, kinds: tuple[type, ...], compiling: Callable[[], bool], original: Any
) -> Any:
    @functools.wraps(original)
    def setattr_(self: Any, name: str, value: Any) -> None:
        if compiling():
            return original(self, name, value)  # type: ignore[no-any-return]
        original(self, name, value)
        if isinstance(value, kinds):
            with contextlib.suppress(Exception):  # the program's setattr is never failed
                epoch.moved(self, name)
        return None

    return setattr_


def _moving(epoch: Epoch, original: Any) -> Any:
    # The epoch moves once the call has returned or raised (a load that failed half way may
    # have rebound some names), as after a framework's lifecycle function.
    return after(original, epoch.moved)


def _data(epoch: Epoch, compiling: Callable[[], bool], original: Any) -> property:
    # original: torch._C.TensorBase's getset descriptor, as torch.Tensor.data reads it.
    get, put = original.__get__, original.__set__

    def data(self: Any) -> Any:
        return get(self, type(self))

    def set_data(self: Any, value: Any) -> None:
        put(self, value)
        if not compiling():
            with contextlib.suppress(Exception):
                epoch.moved(self, "data")

    return property(data, set_data, doc=original.__doc__)
