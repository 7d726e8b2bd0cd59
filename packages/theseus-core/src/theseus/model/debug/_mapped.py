"""The module of a call captured below `nn.vmap` or `nn.scan`: every entry's layer at once.

A probe returns such a call's array arguments stacked on a leading axis (one entry
per mapped call or per scanned iteration). `mapped_layer` gives the module that goes
with them: a subclass of the call's class whose `__call__` and public methods map
over that axis, each entry with its own variables (the transform's `variable_axes`;
an `nn.scan`'s broadcast collections shared) and RNGs split as the transform splits
them. It is called like the class itself, positionally or by keyword
(`layer(**inputs)`): array arguments, wherever they sit, are mapped over axis 0 and
every other value (`deterministic=True`) is passed to each entry as it is, so entry
`i` of the output is what the transform's call `i` computed.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax.core import lift

from theseus.model.debug._discovery import TransformedCallError
from theseus.model.debug._lifted import attributes


def _public_methods(cls: type) -> list[str]:
    """`__call__` and the public methods `cls` defines below `nn.Module` (mapped on a layer)."""
    names = ["__call__"]
    for klass in cls.__mro__:
        if klass is nn.Module or not issubclass(klass, nn.Module):
            continue
        for name, value in vars(klass).items():
            public = not name.startswith("_") and name != "setup"
            if public and inspect.isfunction(value) and name not in names:
                names.append(name)
    return names


def layer_mapping(
    kind: str, path: str, trafo_args: tuple[Any, ...], trafo_kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`lift.vmap` arguments that map a call below `nn.vmap`/`nn.scan` over its stacked values.

    The variables keep the transform's own axes (`variable_axes`; an `nn.scan`'s
    broadcast collections are shared), RNGs are split as the transform splits them,
    and the arrays given to a call and its output are mapped over axis 0.
    """
    if kind == "vmap":
        variable_axes, split_rngs = trafo_args
        names = ("axis_name", "spmd_axis_name")
        extra: dict[str, Any] = {k: trafo_kwargs[k] for k in names if k in trafo_kwargs}
    else:
        if trafo_kwargs.get("variable_carry", False) is not False:
            raise TransformedCallError(
                f"the calls below nn.scan at {path!r} cannot be taken apart: it carries "
                f"variables from one iteration to the next (variable_carry="
                f"{trafo_kwargs['variable_carry']!r}); select {path!r} instead"
            )
        variable_axes = dict(trafo_kwargs.get("variable_axes", {}))
        broadcast = trafo_kwargs.get("variable_broadcast", False)
        if broadcast is not False:
            variable_axes[broadcast] = None
        split_rngs = trafo_kwargs.get("split_rngs", {})
        extra = {}
    metadata = trafo_kwargs.get("metadata_params", {})
    return (variable_axes, split_rngs), {"metadata_params": metadata, **extra}


# True while one entry's method runs: its calls of its own methods are the class's own.
_ENTRY: contextvars.ContextVar[bool] = contextvars.ContextVar("theseus_mapped_entry", default=False)


def is_array(leaf: Any) -> bool:
    """Whether `leaf` is an array (a traced one too), which a mapped call maps over."""
    return isinstance(leaf, jax.Array | np.ndarray)


def _mapped_method(
    cls: type, name: str, transform_args: tuple[Any, ...], transform_kwargs: dict[str, Any]
) -> Callable[..., Any]:
    """`cls.name` mapped over axis 0 of its array arguments (see the module docstring)."""
    original = getattr(cls, name)
    signature = inspect.signature(original)

    def mapped(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if _ENTRY.get():  # a call the method makes on its own module, inside one entry
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        leaves, treedef = jax.tree_util.tree_flatten((bound.args[1:], bound.kwargs))
        arrays = [leaf for leaf in leaves if is_array(leaf)]

        def body(entry: nn.Module, mapped_arrays: list[Any]) -> Any:
            given = iter(mapped_arrays)
            positional, named = jax.tree_util.tree_unflatten(
                treedef, [next(given) if is_array(leaf) else leaf for leaf in leaves]
            )
            inside = _ENTRY.set(True)
            try:
                return original(entry, *positional, **named)
            finally:
                _ENTRY.reset(inside)

        each = nn.transforms.decorator_lift_transform(
            lift.vmap, body, *transform_args, **transform_kwargs
        )
        return each(self, arrays)

    mapped.__name__ = name
    mapped.__qualname__ = f"{cls.__qualname__}.{name}"
    mapped.__doc__ = f"`{cls.__name__}.{name}` of every entry, mapped over axis 0."
    return mapped


def mapped_layer(
    inner: nn.Module,
    kind: str,
    path: str,
    trafo_args: tuple[Any, ...],
    trafo_kwargs: dict[str, Any],
    size: int,
    variables: Mapping[str, Any],
    rngs: dict[str, jax.Array] | None,
) -> nn.Module:
    """The module of a call below `nn.vmap`/`nn.scan`, bound, mapped over `size` entries.

    Args:
        inner: the module of the call as the transform's body ran it (its class and
            constructor fields are used).
        kind: `"vmap"` or `"scan"`.
        path: where the transformed module sits (for the message of a refusal).
        trafo_args, trafo_kwargs: the transform's own arguments (`_lift_arguments`).
        size: the entries: the mapped axis's size, or the scan's length.
        variables: the call's variables, stacked as the transform keeps them.
        rngs: RNG streams to bind (none: deterministic use).

    Returns:
        An instance of a subclass of `type(inner)`, bound to `variables`.

    Raises:
        TransformedCallError: an `nn.scan` that carries variables between iterations.
    """
    layer_args, layer_kwargs = layer_mapping(kind, path, trafo_args, trafo_kwargs)
    mapping = {"in_axes": 0, "out_axes": 0, "axis_size": size, **layer_kwargs}
    cls = type(inner)
    methods = {
        name: _mapped_method(cls, name, layer_args, mapping) for name in _public_methods(cls)
    }
    mapped_cls = type(f"Mapped{cls.__name__}", (cls,), methods)
    return mapped_cls(parent=None, **attributes(inner)).bind(variables, rngs=rngs)
