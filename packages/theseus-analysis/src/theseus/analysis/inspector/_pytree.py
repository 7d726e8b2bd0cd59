"""Recording JAX pytree models (registered dataclasses, Equinox, Flax NNX) by wrapping.

Every callable node of the model's pytree is replaced by a wrapper that calls it
and reports the call to a :class:`~._tap.Tap`; the wrapper is itself a pytree
(the wrapped node is its only child), so the wrapped model goes through ``jit``,
``grad``, ``vmap`` and ``scan`` like the original. Bare function leaves (an
activation in a ``Sequential``) are wrapped by a leaf-less node that keeps the
function as static data. Attribute access falls through to the wrapped node.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import jax
import numpy as np
from jax.tree_util import register_dataclass

from ._paths import PATH_SEP, ModulePath
from ._tap import Tap

__all__ = ["default_filter", "default_is_leaf", "unwrap", "wrap_model"]


def _key(path: ModulePath, method: str) -> str:
    return (path + PATH_SEP if path else "") + method


@partial(register_dataclass, data_fields=["_model"], meta_fields=["path", "tap"])
@dataclass(frozen=True)
class _NodeWrapper:
    """A callable pytree node, recorded under ``path.__call__``."""

    _model: Any
    path: ModulePath
    tap: Tap

    def __getattr__(self, name: str) -> Any:
        """Attributes of the wrapped node (``self.attn.num_heads`` keeps working)."""
        if name.startswith("__") or name in ("_model", "path", "tap"):
            raise AttributeError(name)
        return getattr(self._model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped node and record the call."""
        return self.tap.call(_key(self.path, "__call__"), self._model, args, kwargs)


@partial(register_dataclass, data_fields=[], meta_fields=["function", "path", "tap"])
@dataclass(frozen=True)
class _FunctionWrapper:
    """A bare function leaf, kept static, recorded under ``path.__call__``."""

    function: Callable[..., Any]
    path: ModulePath
    tap: Tap

    def __getattr__(self, name: str) -> Any:
        """Attributes of the wrapped function."""
        if name.startswith("__") or name in ("function", "path", "tap"):
            raise AttributeError(name)
        return getattr(self.function, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function and record the call."""
        return self.tap.call(_key(self.path, "__call__"), self.function, args, kwargs)


@partial(register_dataclass, data_fields=["_model"], meta_fields=["tap"])
@dataclass(frozen=True)
class _RootWrapper:
    """The model's root: not recorded, but one call of it is one frame.

    Under a transformation (``jit``, ``vmap``, ...) the values of every recorded call
    inside one call of the model leave the program in one host callback, instead of
    one per outer submodule call: each callback costs far more than its bytes.
    """

    _model: Any
    tap: Tap

    def __getattr__(self, name: str) -> Any:
        """Attributes of the model (``fm.blocks[0]`` is the recording block)."""
        if name.startswith("__") or name in ("_model", "tap"):
            raise AttributeError(name)
        return getattr(self._model, name)

    def __getitem__(self, index: Any) -> Any:
        """``fm[0]`` for an indexable model (``eqx.nn.Sequential``)."""
        return self._model[index]

    def __len__(self) -> int:
        """The model's length, for a model that has one."""
        return len(self._model)

    def __iter__(self) -> Any:
        """Iterate the model, for a model that can be iterated."""
        return iter(self._model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the model inside one frame of the recording."""
        opened = self.tap.sink.open_call()
        failed = True
        try:
            out = self._model(*args, **kwargs)
            failed = False
        finally:
            self.tap.sink.close_call(opened, failed)
        return out


def default_filter(path: ModulePath, node: Any) -> bool:
    """Record every callable node (classes, e.g. a dtype leaf, excepted)."""
    return callable(node) and not issubclass(type(node), type)


def default_is_leaf(path: ModulePath, node: Any) -> bool:
    """Do not descend into arrays, nor into Flax NNX variables (parameters)."""
    return _is_data(node)


def _is_data(node: Any) -> bool:
    # issubclass on the type: a failed isinstance looks up the instance's __class__,
    # which Equinox modules answer through a slow __getattribute__.
    kind = type(node)
    if issubclass(kind, (jax.Array, np.ndarray)):
        return True
    if "flax.nnx" in sys.modules:
        from flax import nnx

        return issubclass(kind, nnx.Variable)
    return False


def _is_pytree_leaf(node: Any) -> bool:
    return jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(node)) and node is not None


def wrap_model(
    model: Any,
    tap: Tap,
    filter_: Callable[[ModulePath, Any], bool] | None = None,
    is_leaf: Callable[[ModulePath, Any], bool] | None = None,
) -> tuple[Any, list[str]]:
    """Wrap the callable nodes of ``model`` below its root.

    Args:
        model: a pytree whose callable nodes are modules.
        tap: where the wrappers report.
        filter_: ``filter_(path, node) -> bool``, which nodes to record
            (default: every callable node).
        is_leaf: ``is_leaf(path, node) -> bool``, where else to stop descending;
            the descent always stops at arrays and NNX variables.

    Returns:
        The wrapped model and the paths of every callable node seen, for messages.
        The root itself is not recorded, as in the documented tool (its output
        is the model's output), unless it has no callable node below it: a lone
        module is recorded as ``__call__``. A callable root comes back in a
        wrapper that reads its attributes, items and length through and makes
        one call of the model one frame (one host callback under ``jit``).
    """
    if filter_ is None and is_leaf is None:
        from ._template import wrap_from_template

        return wrap_from_template(model, tap, lambda: _wrap(model, tap, None, None))
    return _wrap(model, tap, filter_, is_leaf)


def _wrap(
    model: Any,
    tap: Tap,
    filter_: Callable[[ModulePath, Any], bool] | None,
    is_leaf: Callable[[ModulePath, Any], bool] | None,
) -> tuple[Any, list[str]]:
    keep = filter_ or default_filter

    def stop(path: ModulePath, node: Any) -> bool:
        return default_is_leaf(path, node) or (is_leaf is not None and is_leaf(path, node))

    seen: list[str] = []

    def visit(node: Any, path: ModulePath) -> Any:
        if type(node) is _NodeWrapper or type(node) is _RootWrapper:
            return replace(node, _model=visit(node._model, path))
        if type(node) is _FunctionWrapper:
            return _FunctionWrapper(node, path, tap) if keep(path, node) else node
        if node is None or stop(path, node):
            return node
        # One level only (children count as leaves): flattening the whole subtree at
        # every node made wrapping quadratic in the depth.
        children, treedef = jax.tree_util.tree_flatten_with_path(
            node, is_leaf=lambda child: child is not node
        )
        if jax.tree_util.treedef_is_leaf(treedef):
            if callable(node) and not issubclass(type(node), type):
                seen.append(_key(path, "__call__"))
                if keep(path, node):
                    return _FunctionWrapper(node, path, tap)
            return node
        node = jax.tree_util.tree_unflatten(
            treedef,
            [  # an array stops the descent whatever its path: build none for it
                child if _is_data(child) else visit(child, path.child(keys[0]))
                for keys, child in children
            ],
        )
        if path and callable(node):
            seen.append(_key(path, "__call__"))
        if path and keep(path, node):
            return _NodeWrapper(node, path, tap)
        return node

    root = ModulePath(())
    wrapped = visit(model, root)
    if not seen and callable(model) and keep(root, model):
        # a lone module (an eqx.nn.Linear): record the root so that something is recorded
        seen.append("__call__")
        return _NodeWrapper(wrapped, root, tap), seen
    return (_RootWrapper(wrapped, tap) if callable(wrapped) else wrapped), seen


def unwrap(model: Any) -> Any:
    """Remove every wrapper from ``model`` (the inverse of :func:`wrap_model`)."""
    if isinstance(model, (_NodeWrapper, _RootWrapper)):
        return unwrap(model._model)
    if isinstance(model, _FunctionWrapper):
        return unwrap(model.function)
    if _is_pytree_leaf(model) or model is None:
        return model
    children, treedef = jax.tree_util.tree_flatten(model, is_leaf=lambda c: c is not model)
    return jax.tree_util.tree_unflatten(treedef, [unwrap(c) for c in children])
