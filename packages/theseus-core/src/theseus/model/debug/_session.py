"""What the debugger hands out: a bound layer, its call's inputs, and the pair as a session.

`DebugLayer` is a module bound to its real variables, callable like the module;
`DebugInputs` the arguments of the recorded call by name (a read-only mapping and a
pytree, so it can leave `jax.jit`); `DebugSession` is what `trainer.debug(path)`
returns: unpack it (`layer, inputs = trainer.debug(path)`) or use it as a context
manager; `close()` releases both, and using either afterwards is a `DebugClosedError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax

from theseus.model.debug._discovery import DebugClosedError, UnknownArgumentError


def _closed(kind: str) -> DebugClosedError:
    return DebugClosedError(
        f"this debug {kind} was released by close(); call trainer.debug(path) again for a new one"
    )


class DebugInputs(Mapping[str, Any]):
    """The arguments of one module call by name, defaults applied; read-only.

    Read them as attributes (`inputs.x`), by key (`inputs["x"]`) or unpacked into a
    call (`layer(**inputs)`). The values are the arrays of the call itself, not copies.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))

    def _live(self) -> dict[str, Any]:
        values = object.__getattribute__(self, "_values")
        if values is None:
            raise _closed("input")
        return values

    def __getitem__(self, name: str) -> Any:
        values = self._live()
        if name not in values:
            raise UnknownArgumentError(
                f"{name!r} is not an argument of this call; it has {sorted(values)}"
            )
        return values[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        values = self._live()
        if name not in values:
            raise AttributeError(
                f"{name!r} is not an argument of this call; it has {sorted(values)}"
            )
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("DebugInputs are read-only; build a new dict to change an argument")

    def __iter__(self) -> Iterator[str]:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def __repr__(self) -> str:
        values = object.__getattribute__(self, "_values")
        if values is None:
            return "DebugInputs(<closed>)"
        shown = ", ".join(f"{k}={_describe(v)}" for k, v in values.items())
        return f"DebugInputs({shown})"

    def close(self) -> None:
        """Release the arrays; later reads raise `DebugClosedError`."""
        object.__setattr__(self, "_values", None)


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape)}"
    return repr(value)


def _flatten(inputs: DebugInputs) -> tuple[Any, Any]:
    values = inputs._live()
    return [(jax.tree_util.DictKey(k), v) for k, v in values.items()], tuple(values)


def _unflatten(names: Any, children: Any) -> DebugInputs:
    return DebugInputs(dict(zip(names, children, strict=True)))


jax.tree_util.register_pytree_with_keys(DebugInputs, _flatten, _unflatten)


class DebugLayer:
    """A module bound to its real variables, callable like the module itself.

    Attributes of the module pass through (`layer.c_fc(x)` calls the bound
    submodule; `layer.config` reads its settings). `module` is the bound Flax module.
    """

    __slots__ = ("_module", "_path")

    def __init__(self, module: nn.Module, path: str) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_path", path)

    @property
    def module(self) -> nn.Module:
        """The bound Flax module."""
        module = object.__getattribute__(self, "_module")
        if module is None:
            raise _closed("layer")
        return module

    @property
    def path(self) -> str:
        """Where the module sits in the model (`"blocks_0/attn"`)."""
        return str(object.__getattribute__(self, "_path"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a DebugLayer is read-only")

    def __repr__(self) -> str:
        module = object.__getattribute__(self, "_module")
        if module is None:
            return f"DebugLayer({self.path!r}, <closed>)"
        return f"DebugLayer({self.path!r}, {type(module).__name__})"

    def close(self) -> None:
        """Release the bound variables; later use raises `DebugClosedError`."""
        object.__setattr__(self, "_module", None)


class DebugSession:
    """What `trainer.debug(path)` returns: a `(layer, inputs)` pair that can be released.

    Example:
        `layer, inputs = trainer.debug("blocks_0/attn")`, or
        `with trainer.debug("blocks_0/attn") as (layer, inputs): ...`
    """

    def __init__(self, layer: DebugLayer, inputs: DebugInputs) -> None:
        self.layer = layer
        self.inputs = inputs

    def __iter__(self) -> Iterator[Any]:
        return iter((self.layer, self.inputs))

    def __enter__(self) -> DebugSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the layer and its inputs (their arrays can then be freed)."""
        self.layer.close()
        self.inputs.close()

    def __repr__(self) -> str:
        return f"DebugSession({self.layer!r}, {self.inputs!r})"
