"""Module paths and record keys: how a call inside a model is named on disk.

A key is the dotted path of the module, the method name, then (for inputs) the
argument name and (for tuple or dict values) the position inside the value:
``blocks.0.attn.__call__``, ``blocks.0.attn.__call__.x``, ``head.__call__.1``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["PATH_SEP", "KeyMap", "ModulePath", "key_name", "leaf_items"]

PATH_SEP = "."


def key_name(key: Any) -> str:
    """Return the text of one path entry (a JAX key object or a plain name).

    Args:
        key: a ``GetAttrKey``, ``SequenceKey``, ``DictKey``, ``FlattenedIndexKey``
            or a string.

    Returns:
        ``name`` for attributes, the index for sequences, the key for dicts.
    """
    if isinstance(key, str):
        return key
    for attribute in ("name", "idx", "key"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


class ModulePath(str):
    """The path of a node in a model: a dotted string that also holds its key objects.

    Filters written for either convention work: ``"attn" in path``,
    ``path.endswith("mlp")``, ``re.search(..., path)`` and ``path == "blocks.0"``
    use the dotted text; ``path[-1].name``, ``len(path)``, ``tuple(path)`` and
    ``path == ()`` use the key objects, as in the documented tool.

    Example:
        >>> from jax.tree_util import GetAttrKey, SequenceKey
        >>> p = ModulePath((GetAttrKey("blocks"), SequenceKey(0)))
        >>> (p == "blocks.0", p[-1].idx, len(p), "blocks" in p)
        (True, 0, 2, True)
    """

    keys: tuple[Any, ...]

    def __new__(cls, keys: tuple[Any, ...] = ()) -> ModulePath:
        """Build the path from its key objects (or plain names)."""
        keys = tuple(keys)
        path = super().__new__(cls, PATH_SEP.join(key_name(k) for k in keys))
        path.keys = keys
        return path

    def child(self, key: Any) -> ModulePath:
        """Return the path one level below, through ``key``."""
        name = key_name(key)
        path = str.__new__(ModulePath, str.__add__(self, PATH_SEP + name) if self.keys else name)
        path.keys = (*self.keys, key)
        return path

    @property
    def names(self) -> tuple[str, ...]:
        """The path entries as text."""
        return tuple(key_name(k) for k in self.keys)

    def __getitem__(self, index: Any) -> Any:
        """Index the key objects (not the characters)."""
        return self.keys[index]

    def __iter__(self) -> Iterator[Any]:
        """Iterate the key objects."""
        return iter(self.keys)

    def __len__(self) -> int:
        """The number of path entries."""
        return len(self.keys)

    def __contains__(self, item: object) -> bool:
        """Substring test for text, membership test for key objects."""
        if isinstance(item, str):
            return str.__contains__(self, item)
        return item in self.keys

    def __eq__(self, other: object) -> bool:
        """Equal to its dotted text, or to the tuple of its key objects."""
        if isinstance(other, tuple) and not isinstance(other, str):
            return self.keys == other
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        """The negation of ``__eq__``."""
        return not self.__eq__(other)

    def __hash__(self) -> int:
        """Hash of the dotted text."""
        return str.__hash__(self)

    def __repr__(self) -> str:
        """``ModulePath('blocks.0.attn')``."""
        return f"ModulePath({str.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle through the key objects."""
        return (ModulePath, (self.keys,))


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def leaf_items(value: Any, prefix: str, *, python_scalars: bool) -> list[tuple[str, Any]]:
    """Flatten a call's value into ``(key, array)`` pairs.

    A single array keeps ``prefix``; tuples, lists and dicts (and any JAX pytree)
    add one entry per level: ``prefix.0``, ``prefix.logits``. Leaves that are not
    arrays are skipped, except Python numbers when ``python_scalars`` is true
    (they become 0-d arrays).

    Args:
        value: the output of a call, or one argument of it.
        prefix: the key of the value itself.
        python_scalars: record ``int``/``float``/``bool`` leaves as 0-d arrays.

    Returns:
        The pairs in the pytree's flattening order.
    """
    if _is_array(value):
        return [(prefix, value)]
    if isinstance(value, (bool, int, float, complex)):
        return [(prefix, np.asarray(value))] if python_scalars else []
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (tuple, list)):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return _pytree_items(value, prefix, python_scalars=python_scalars)
    pairs: list[tuple[str, Any]] = []
    for name, child in items:
        pairs += leaf_items(child, prefix + PATH_SEP + name, python_scalars=python_scalars)
    return pairs


def _pytree_items(value: Any, prefix: str, *, python_scalars: bool) -> list[tuple[str, Any]]:
    import sys

    if value is None or "jax" not in sys.modules:
        return []
    import jax

    leaves, _ = jax.tree_util.tree_flatten_with_path(value)
    if len(leaves) == 1 and leaves[0][1] is value:
        return []
    pairs: list[tuple[str, Any]] = []
    for keys, leaf in leaves:
        name = PATH_SEP.join([prefix, *(key_name(k) for k in keys)])
        pairs += leaf_items(leaf, name, python_scalars=python_scalars)
    return pairs


class KeyMap:
    """Ordered regex renames of keys, each ``re.sub`` applied to the previous result.

    Args:
        pairs: ``(pattern, replacement)`` pairs; replacements may use ``\\1``.

    Raises:
        InspectorOptionError: a pattern is not a valid regular expression.

    Example:
        >>> rename = KeyMap([(r"\\.forward$", ".__call__")])
        >>> rename("fc1.forward")
        'fc1.__call__'
    """

    def __init__(self, pairs: Sequence[tuple[str, str]] = ()) -> None:
        from ._errors import InspectorOptionError

        try:
            self._rules = [(re.compile(p), r) for p, r in pairs]
        except (re.error, TypeError, ValueError) as error:
            raise InspectorOptionError(
                f"a key map must be (pattern, replacement) pairs of valid regular expressions "
                f"({error}); got {list(pairs)!r}."
            ) from None
        self._names: dict[str, str] = {}
        self._origins: dict[str, str] = {}

    def __bool__(self) -> bool:
        """Whether there is any rule."""
        return bool(self._rules)

    def __call__(self, key: str) -> str:
        """The new name of ``key``.

        Raises:
            KeyCollisionError: another key already received this name.
        """
        name = self._names.get(key)
        if name is None:
            name = key
            for pattern, replacement in self._rules:
                name = pattern.sub(replacement, name)
            origin = self._origins.setdefault(name, key)
            if origin != key:
                from ._errors import KeyCollisionError

                raise KeyCollisionError(
                    f"the key map sends both {origin!r} and {key!r} to {name!r}; make the "
                    "patterns more specific (anchor them with ^ and $) so each key keeps its "
                    "own name."
                )
            self._names[key] = name
        return name
