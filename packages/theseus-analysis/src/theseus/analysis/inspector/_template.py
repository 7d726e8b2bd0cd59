"""Reusing a wrapping: the wrapped structure of a model, filled with its current leaves.

With the default ``filter_`` and ``is_leaf``, which nodes get wrapped depends only on
the model's tree structure (node types and static fields), on which leaves are
functions (a wrapped function is kept as static data) and on the tap. The first
wrapping of a structure is stored as a *template*: the wrapped tree's structure and
the positions of the model's leaves that remain leaves in it. Recording a model of
the same structure again (the same model in a loop, or new weights) fills the
template with the model's current leaves instead of walking the tree again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["wrap_from_template"]

_TEMPLATES: OrderedDict[Any, tuple[Any, tuple[int, ...], tuple[str, ...]]] = OrderedDict()
_MAX_TEMPLATES = 32
_LOCK = threading.Lock()


def _kind(leaf: Any) -> Any:
    # a function leaf is wrapped and kept as static data: its identity matters;
    # of any other leaf, only its type can matter to the default filters
    return leaf if callable(leaf) and not isinstance(leaf, type) else type(leaf)


def wrap_from_template(
    model: Any, tap: Any, wrap: Callable[[], tuple[Any, list[str]]]
) -> tuple[Any, list[str]]:
    """``wrap()``'s result for ``model``, from the template of its structure when stored.

    Args:
        model: the model (recorded with the default filters).
        tap: the tap of the wrappers (part of the key).
        wrap: wraps ``model`` the long way; called when no template matches.

    Returns:
        The wrapped model and the paths seen, as ``wrap()`` returns them.
    """
    leaves, treedef = jax.tree_util.tree_flatten(model)
    key = (treedef, tuple(_kind(leaf) for leaf in leaves), tap)
    try:
        with _LOCK:
            template = _TEMPLATES.get(key)
            if template is not None:
                _TEMPLATES.move_to_end(key)
    except TypeError:  # an unhashable static field or function: no template
        return wrap()
    if template is not None:
        wrapped_def, positions, names = template
        return jax.tree_util.tree_unflatten(wrapped_def, [leaves[i] for i in positions]), list(
            names
        )
    wrapped, seen = wrap()
    wrapped_leaves, wrapped_def = jax.tree_util.tree_flatten(wrapped)
    kept = _positions(leaves, wrapped_leaves)
    if kept is not None:
        with _LOCK:
            _TEMPLATES[key] = (wrapped_def, kept, tuple(seen))
            if len(_TEMPLATES) > _MAX_TEMPLATES:
                _TEMPLATES.popitem(last=False)
    return wrapped, seen


def _positions(leaves: list[Any], wrapped_leaves: list[Any]) -> tuple[int, ...] | None:
    """Where each leaf of the wrapped tree sits among the model's leaves, in order.

    Wrapping only removes leaves (the wrapped functions), so the wrapped leaves are
    the model's in the same order; ``None`` if they are not (no template then).
    """
    kept: list[int] = []
    position = 0
    for leaf in wrapped_leaves:
        while position < len(leaves) and leaves[position] is not leaf:
            position += 1
        if position == len(leaves):
            return None
        kept.append(position)
        position += 1
    return tuple(kept)
